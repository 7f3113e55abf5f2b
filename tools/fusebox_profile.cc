// fusebox-profile: generates, validates and summarises gradient profiles
// (format: autotune/profiles/README.md). The edge of autotune/: arguments
// are read here and only here.
//
//   fusebox-profile generate resnet50 -o resnet50.json
//   fusebox-profile generate all --dir /tmp/profiles
//   fusebox-profile validate autotune/profiles/*.json
//   fusebox-profile show autotune/profiles/gpt2_xl.json
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "autotune/models.h"
#include "autotune/profile.h"
#include "comm/log.h"

namespace fusebox::tools {
namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

std::string Usage() {
  return absl::StrCat(
      "usage:\n"
      "  fusebox-profile generate <model>|all [-o FILE | --dir DIR]\n"
      "  fusebox-profile generate <model> <model>... --dir DIR\n"
      "      Writes the generated profile of each model (all: every model) as JSON:\n"
      "      to FILE, to DIR/<model>.json, or (one model, no -o/--dir) to stdout.\n"
      "      Several models need --dir. Files are replaced atomically.\n"
      "  fusebox-profile validate FILE...\n"
      "      Checks each file; prints \"FILE: ok ...\" or the first error in it.\n"
      "  fusebox-profile show FILE\n"
      "      Summarises a profile: tensors, parameters, bytes, largest tensor,\n"
      "      forward/backward time, first and last ready gradient.\n"
      "  fusebox-profile models\n"
      "      Lists the models that generate knows.\n"
      "\n"
      "models: ",
      absl::StrJoin(autotune::ModelNames(), ", "),
      "\n"
      "Exit status: 0 on success, 1 when a file is invalid or cannot be written,\n"
      "2 on a usage error. Format and compute model: autotune/profiles/README.md.\n");
}

int UsageError(const comm::Logger& log, const std::string& message) {
  log.Error(message);
  std::fprintf(stderr, "\n%s", Usage().c_str());
  return kExitUsage;
}

int Fail(const comm::Logger& log, const absl::Status& status) {
  log.Error(status.message());
  return kExitError;
}

std::string Thousands(int64_t v) {
  std::string digits = absl::StrCat(v < 0 ? -v : v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return v < 0 ? "-" + out : out;
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

int Generate(const comm::Logger& log, const std::vector<std::string>& args) {
  std::vector<std::string> models;
  std::string out_file, out_dir;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-o" || a == "--dir") {
      if (i + 1 >= args.size()) return UsageError(log, a + " needs a value");
      (a == "-o" ? out_file : out_dir) = args[++i];
    } else if (!a.empty() && a[0] == '-') {
      return UsageError(log, "generate: unknown option " + a);
    } else {
      models.push_back(a);
    }
  }
  if (models.empty()) return UsageError(log, "generate: which model? (a name or all)");
  if (!out_file.empty() && !out_dir.empty())
    return UsageError(log, "generate: -o or --dir, not both");
  if (models.size() == 1 && models[0] == "all") models = autotune::ModelNames();
  if (models.size() > 1 && out_dir.empty()) {
    return UsageError(log, "generate: several models (or all) need --dir DIR");
  }
  if (!out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (ec) return Fail(log, absl::UnavailableError(absl::StrCat(out_dir, ": ", ec.message())));
  }
  for (const std::string& m : models) {
    absl::StatusOr<autotune::Profile> p = autotune::GenerateModelProfile(m);
    if (!p.ok()) return Fail(log, p.status());
    if (out_file.empty() && out_dir.empty()) {
      std::fputs(autotune::SerializeProfile(*p).c_str(), stdout);
      continue;
    }
    const std::string path =
        out_file.empty() ? (std::filesystem::path(out_dir) / (m + ".json")).string() : out_file;
    if (absl::Status s = autotune::SaveProfile(*p, path); !s.ok()) return Fail(log, s);
    std::fprintf(stderr, "wrote %s (%zu tensors, %.1f MiB)\n", path.c_str(), p->tensors.size(),
                 MiB(p->total_bytes()));
  }
  return 0;
}

int Validate(const comm::Logger& log, const std::vector<std::string>& files) {
  if (files.empty()) return UsageError(log, "validate: which files?");
  int rc = 0;
  for (const std::string& f : files) {
    absl::StatusOr<autotune::Profile> p = autotune::LoadProfile(f);
    if (p.ok()) {
      std::printf("%s: ok (%s, %zu tensors, %.1f MiB)\n", f.c_str(), p->model.c_str(),
                  p->tensors.size(), MiB(p->total_bytes()));
    } else {
      // LoadProfile's message starts with the path; print it once.
      absl::string_view message = p.status().message();
      absl::ConsumePrefix(&message, f + ": ");
      std::printf("%s: INVALID: %s\n", f.c_str(), std::string(message).c_str());
      rc = kExitError;
    }
  }
  return rc;
}

int Show(const comm::Logger& log, const std::vector<std::string>& args) {
  if (args.size() != 1) return UsageError(log, "show: exactly one file");
  absl::StatusOr<autotune::Profile> p = autotune::LoadProfile(args[0]);
  if (!p.ok()) return Fail(log, p.status());
  int64_t params = 0;
  const autotune::ProfileTensor* largest = nullptr;
  for (const autotune::ProfileTensor& t : p->tensors) {
    params += t.numel();
    if (largest == nullptr || t.bytes() > largest->bytes()) largest = &t;
  }
  std::printf("model        %s\n", p->model.c_str());
  std::printf("description  %s\n", p->description.c_str());
  std::printf("tensors      %zu\n", p->tensors.size());
  std::printf("parameters   %s\n", Thousands(params).c_str());
  std::printf("bytes        %s (%.2f MiB)\n", Thousands(p->total_bytes()).c_str(),
              MiB(p->total_bytes()));
  if (largest != nullptr) {
    std::printf("largest      %s [%s] %s, %.2f MiB\n", largest->name.c_str(),
                absl::StrJoin(largest->shape, ", ").c_str(),
                std::string(comm::DataTypeName(largest->dtype)).c_str(), MiB(largest->bytes()));
  }
  std::printf("forward      %.3f ms\n", p->forward_us / 1000);
  std::printf("backward     %.3f ms\n", p->backward_us / 1000);
  if (!p->tensors.empty()) {
    std::printf("first ready  %s at %.3f ms\n", p->tensors.front().name.c_str(),
                p->tensors.front().ready_us / 1000);
    std::printf("last ready   %s at %.3f ms\n", p->tensors.back().name.c_str(),
                p->tensors.back().ready_us / 1000);
  }
  return 0;
}

int Main(int argc, char** argv) {
  // Errors go through comm::Logger at the level FUSEBOX_LOG_LEVEL names
  // (errors always show); what a command reports is its output.
  absl::StatusOr<comm::LogLevel> level =
      comm::ResolveLogLevel("", std::getenv("FUSEBOX_LOG_LEVEL"));
  const comm::Logger log("fusebox-profile", level.ok() ? *level : comm::LogLevel::kWarning);
  if (!level.ok()) return UsageError(log, std::string(level.status().message()));
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return UsageError(log, "which command?");
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "-h" || command == "--help" || command == "help") {
    std::fputs(Usage().c_str(), stdout);
    return 0;
  }
  if (command == "generate") return Generate(log, args);
  if (command == "validate") return Validate(log, args);
  if (command == "show") return Show(log, args);
  if (command == "models") {
    if (!args.empty()) return UsageError(log, "models takes no arguments");
    for (const std::string& m : autotune::ModelNames()) std::printf("%s\n", m.c_str());
    return 0;
  }
  return UsageError(log, "unknown command '" + command + "'");
}

}  // namespace
}  // namespace fusebox::tools

int main(int argc, char** argv) { return fusebox::tools::Main(argc, argv); }
