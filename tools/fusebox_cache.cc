// fusebox-cache: lists, shows, removes, exports and imports the entries of a
// policy cache directory (format: autotune/POLICY_CACHE.md). The edge of
// autotune/: arguments and the environment are read here and only here.
//
//   fusebox-cache list
//   fusebox-cache --dir /shared/fusebox show <file>
//   fusebox-cache export all.json && fusebox-cache --dir other import all.json
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "autotune/policy_cache.h"
#include "bucketing/file_io.h"
#include "comm/log.h"
#include "comm/types.h"

namespace fusebox::tools {
namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

std::string Usage() {
  return "usage: fusebox-cache [--dir DIR] COMMAND [ARGS]\n"
         "  list\n"
         "      One line per entry file: file, model, world size, ranks per node,\n"
         "      backend, network, buckets, measured and DDP iteration time (ms),\n"
         "      tuning iterations; or \"UNUSABLE: <reason>\".\n"
         "  show FILE\n"
         "      The entry's key and figures, then one line per bucket: index,\n"
         "      dtype, elements, bytes, slices, first and last tensor id.\n"
         "      FILE is a name from list, or a path when it contains '/'.\n"
         "  rm FILE\n"
         "      Removes the entry FILE (a name from list).\n"
         "  export OUT.json\n"
         "      Writes every usable entry into one bundle file.\n"
         "  import IN.json\n"
         "      Stores every valid entry of a bundle (replacing entries of the same\n"
         "      key); invalid entries are reported and skipped.\n"
         "\n"
         "The directory is --dir DIR, else $FUSEBOX_CACHE_DIR, else\n"
         "$XDG_CACHE_HOME/fusebox, else $HOME/.cache/fusebox. list, show and\n"
         "export never create it; a directory this account cannot write is still\n"
         "read. Warnings go to stderr (FUSEBOX_LOG_LEVEL=error hides them).\n"
         "Exit status: 0 on success, 1 when a file is unusable or an operation\n"
         "fails, 2 on a usage error. Format: autotune/POLICY_CACHE.md.\n";
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "fusebox-cache: %s\n\n%s", message.c_str(), Usage().c_str());
  return kExitUsage;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "fusebox-cache: %s\n", std::string(status.message()).c_str());
  return kExitError;
}

double Ms(double us) { return us / 1000; }

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

int List(const autotune::PolicyCache& cache, const std::vector<std::string>& args) {
  if (!args.empty()) return UsageError("list takes no arguments");
  const std::vector<autotune::ListedEntry> entries = cache.List();
  if (entries.empty()) {
    std::printf("no entries in %s\n", cache.dir().c_str());
    return 0;
  }
  std::printf("%-60s %-16s %7s %5s %-8s %-12s %7s %11s %11s %6s\n", "FILE", "MODEL", "WORLD", "RPN",
              "BACKEND", "NETWORK", "BUCKETS", "MEASURED_MS", "DDP_MS", "TUNED");
  for (const autotune::ListedEntry& l : entries) {
    if (!l.entry.has_value()) {
      std::printf("%-60s UNUSABLE: %s\n", l.file.c_str(), std::string(l.status.message()).c_str());
      continue;
    }
    const autotune::CacheEntry& e = *l.entry;
    std::printf("%-60s %-16s %7d %5d %-8s %-12s %7zu %11.3f %11.3f %6d\n", l.file.c_str(),
                OrDash(e.model).c_str(), e.key.world_size, e.key.ranks_per_node,
                e.key.backend.c_str(), e.key.network.c_str(), e.plan.buckets.size(),
                Ms(e.measured_iteration_us), Ms(e.ddp_iteration_us), e.tuning_iterations);
  }
  return 0;
}

void PrintEntry(const std::string& file, const autotune::CacheEntry& e) {
  auto figure = [](double us) {
    return us == 0 ? std::string("unknown") : absl::StrFormat("%.3f ms", Ms(us));
  };
  int64_t slices = 0;
  for (const bucketing::Bucket& b : e.plan.buckets) slices += b.slices.size();
  std::printf("file             %s\n", file.c_str());
  std::printf("model            %s\n", OrDash(e.model).c_str());
  std::printf("signature        %s\n", e.key.model_signature.c_str());
  std::printf("world size       %d\n", e.key.world_size);
  std::printf("ranks per node   %d\n", e.key.ranks_per_node);
  std::printf("backend          %s\n", e.key.backend.c_str());
  std::printf("network          %s\n", e.key.network.c_str());
  std::printf("format version   %d\n", e.key.format_version);
  std::printf("layout hash      %016llx\n", static_cast<unsigned long long>(e.layout_hash));
  std::printf("plan             %s: %zu buckets, %lld slices, hash %016llx\n",
              OrDash(e.plan.name).c_str(), e.plan.buckets.size(), static_cast<long long>(slices),
              static_cast<unsigned long long>(bucketing::PlanHash(e.plan)));
  std::printf("measured         %s per iteration\n", figure(e.measured_iteration_us).c_str());
  std::printf("ddp default      %s per iteration", figure(e.ddp_iteration_us).c_str());
  if (e.measured_iteration_us > 0 && e.ddp_iteration_us > 0) {
    std::printf(" (plan is %.2fx)", e.ddp_iteration_us / e.measured_iteration_us);
  }
  std::printf("\n");
  std::printf("predicted        %s per iteration\n", figure(e.predicted_iteration_us).c_str());
  std::printf("tuning iters     %d\n", e.tuning_iterations);
  std::printf("cost model       %s\n", OrDash(e.cost_model).c_str());
  std::printf("fusebox version  %s\n", OrDash(e.fusebox_version).c_str());
  std::printf("created          %s\n",
              e.created_unix_s == 0
                  ? "unknown"
                  : absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                                     absl::FromUnixSeconds(e.created_unix_s), absl::UTCTimeZone())
                        .c_str());
  std::printf("%6s %-9s %14s %16s %7s %7s %7s\n", "bucket", "dtype", "elements", "bytes", "slices",
              "first", "last");
  for (size_t i = 0; i < e.plan.buckets.size(); ++i) {
    const bucketing::Bucket& b = e.plan.buckets[i];
    const int64_t elements = b.count();
    const int64_t bytes = elements * static_cast<int64_t>(comm::DataTypeSize(b.dtype));
    const std::string first = b.slices.empty() ? "-" : absl::StrCat(b.slices.front().tensor);
    const std::string last = b.slices.empty() ? "-" : absl::StrCat(b.slices.back().tensor);
    std::printf("%6zu %-9s %14lld %16lld %7zu %7s %7s\n", i,
                std::string(comm::DataTypeName(b.dtype)).c_str(), static_cast<long long>(elements),
                static_cast<long long>(bytes), b.slices.size(), first.c_str(), last.c_str());
  }
}

int Show(const autotune::PolicyCache& cache, const std::vector<std::string>& args) {
  if (args.size() != 1) return UsageError("show: exactly one file");
  const std::string& file = args[0];
  if (absl::StrContains(file, '/')) {
    absl::StatusOr<std::string> text =
        bucketing::ReadFileBounded(file, autotune::kMaxPolicyFileBytes);
    if (!text.ok()) return Fail(text.status());
    absl::StatusOr<autotune::CacheEntry> e = autotune::ParseCacheEntry(*text);
    if (!e.ok())
      return Fail(absl::InvalidArgumentError(absl::StrCat(file, ": ", e.status().message())));
    PrintEntry(file, *e);
    return 0;
  }
  for (const autotune::ListedEntry& l : cache.List()) {
    if (l.file != file) continue;
    if (!l.entry.has_value()) {
      return Fail(
          absl::InvalidArgumentError(absl::StrCat(file, ": UNUSABLE: ", l.status.message())));
    }
    PrintEntry(file, *l.entry);
    return 0;
  }
  return Fail(absl::NotFoundError(absl::StrCat(file, ": no such entry in ", cache.dir())));
}

int Remove(autotune::PolicyCache& cache, const std::vector<std::string>& args) {
  if (args.size() != 1) return UsageError("rm: exactly one file");
  if (absl::Status s = cache.Remove(args[0]); !s.ok()) return Fail(s);
  std::printf("removed %s\n", args[0].c_str());
  return 0;
}

int Export(const autotune::PolicyCache& cache, const std::vector<std::string>& args) {
  if (args.size() != 1) return UsageError("export: exactly one output file");
  int count = 0;
  if (absl::Status s = cache.Export(args[0], &count); !s.ok()) return Fail(s);
  std::printf("exported %d entries to %s\n", count, args[0].c_str());
  return 0;
}

int Import(autotune::PolicyCache& cache, const std::vector<std::string>& args) {
  if (args.size() != 1) return UsageError("import: exactly one input file");
  int count = 0;
  absl::Status s = cache.Import(args[0], &count);
  std::printf("imported %d entries into %s\n", count, cache.dir().c_str());
  if (!s.ok()) return Fail(s);
  return 0;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args;
  std::string dir;
  bool dir_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help" || a == "help") {
      std::fputs(Usage().c_str(), stdout);
      return 0;
    }
    if (a == "--dir") {
      if (i + 1 >= argc) return UsageError("--dir needs a value");
      dir = argv[++i];
      dir_given = true;
    } else if (absl::StartsWith(a, "--dir=")) {
      dir = a.substr(6);
      dir_given = true;
    } else if (a.size() > 1 && a[0] == '-') {
      return UsageError("unknown option " + a);
    } else {
      args.push_back(a);
    }
  }
  if (dir_given && dir.empty()) return UsageError("--dir needs a non-empty value");
  if (args.empty()) return UsageError("which command?");
  const std::string command = args[0];
  args.erase(args.begin());
  if (command != "list" && command != "show" && command != "rm" && command != "export" &&
      command != "import") {
    return UsageError("unknown command '" + command + "'");
  }
  if (!dir_given) {
    dir = autotune::DefaultCacheDir(std::getenv("FUSEBOX_CACHE_DIR"),
                                    std::getenv("XDG_CACHE_HOME"), std::getenv("HOME"));
    if (dir.empty()) {
      return UsageError("no cache directory: give --dir or set FUSEBOX_CACHE_DIR or HOME");
    }
  }
  autotune::PolicyCacheOptions options;
  options.dir = dir;
  // Looking never creates the directory (list, show, export).
  options.read_only = command == "list" || command == "show" || command == "export";
  absl::StatusOr<comm::LogLevel> level =
      comm::ResolveLogLevel("", std::getenv("FUSEBOX_LOG_LEVEL"));
  if (!level.ok()) return UsageError(std::string(level.status().message()));
  options.warn = comm::Logger("fusebox-cache", *level).At(comm::LogLevel::kWarning);
  autotune::PolicyCache cache(options);
  if (command == "list") return List(cache, args);
  if (command == "show") return Show(cache, args);
  if (command == "rm") return Remove(cache, args);
  if (command == "export") return Export(cache, args);
  return Import(cache, args);
}

}  // namespace
}  // namespace fusebox::tools

int main(int argc, char** argv) { return fusebox::tools::Main(argc, argv); }
