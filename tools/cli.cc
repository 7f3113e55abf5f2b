#include "tools/cli.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/internal/program_name.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "fusebox/config.h"

namespace fusebox::tools {

std::optional<std::string> FindUsageError(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;  // positional
    absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    absl::string_view name = body;
    std::optional<absl::string_view> value;
    if (size_t eq = body.find('='); eq != absl::string_view::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
    }
    // absl's built-in flags (not in its registry here): absl handles them.
    if (name == "help" || name == "helpfull" || name == "helpshort" || name == "helppackage" ||
        name == "version" || name == "only_check_args" || name == "helpon" ||
        name == "helpmatch" || name == "flagfile" || name == "fromenv" || name == "tryfromenv" ||
        name == "undefok") {
      if (!value.has_value() && (name == "flagfile" || name == "fromenv" ||
                                 name == "tryfromenv" || name == "undefok" ||
                                 name == "helpon" || name == "helpmatch")) {
        ++i;  // their value is the next argument
      }
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no") && !value.has_value()) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;  // --nofoo
    }
    if (flag == nullptr) {
      return absl::StrCat("unknown flag '", arg, "' (--help lists the flags)");
    }
    if (!value.has_value()) {
      if (flag->IsOfType<bool>()) continue;
      if (i + 1 >= argc) return absl::StrCat("flag --", name, " needs a value");
      value = argv[++i];
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      return absl::StrCat("bad value '", *value, "' for --", name, ": ", error);
    }
  }
  return std::nullopt;
}

void NormalizeFlagSpelling(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (std::strcmp(arg, "--") == 0) break;
    if (arg[0] != '-') continue;  // a value or a positional argument
    char* name = arg + (arg[1] == '-' ? 2 : 1);
    for (char* c = name; *c != '\0' && *c != '='; ++c) {
      if (*c == '-' && c != name) *c = '_';
    }
  }
}

namespace {

// absl's help for the flags of every file whose path contains one of the
// comma-separated `help_files`: the usage message once, then each file's
// flags.
void PrintHelp(absl::string_view help_files, const char* usage) {
  const std::vector<std::string> filters = absl::StrSplit(help_files, ',', absl::SkipEmpty());
  absl::flags_internal::FlagsHelp(std::cout, filters.empty() ? "" : filters[0],
                                  absl::flags_internal::HelpFormat::kHumanReadable, usage);
  for (size_t i = 1; i < filters.size(); ++i) {
    std::ostringstream more;
    absl::flags_internal::FlagsHelp(more, filters[i],
                                    absl::flags_internal::HelpFormat::kHumanReadable, "");
    const std::string text = more.str();
    if (const size_t at = text.find("  Flags from"); at != std::string::npos) {
      std::cout << text.substr(at);
    }
  }
}

}  // namespace

std::vector<char*> ParseToolCommandLine(int argc, char** argv, const char* tool,
                                        const char* usage, const char* help_files) {
  absl::FlagsUsageConfig config;
  // Every fusebox flag (absl's own are under --helpfull).
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  const std::string version = absl::StrCat(tool, " ", FUSEBOX_VERSION, "\n");
  config.version_string = [version] { return version; };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  // --help prints the tool's flags and exits 0 (absl's own handler exits 1).
  absl::flags_internal::SetProgramInvocationName(tool);
  NormalizeFlagSpelling(argc, argv);
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "--helpshort" || arg == "-helpshort") {
      PrintHelp(help_files, usage);
      std::exit(0);
    }
  }
  if (std::optional<std::string> error = FindUsageError(argc, argv)) {
    std::fprintf(stderr, "%s: %s\n", tool, error->c_str());
    std::exit(kUsageExit);
  }
  return absl::ParseCommandLine(argc, argv);
}

bool ShowProgress(int progress_flag, bool info_shown) {
  if (progress_flag != -1) return progress_flag == 1;
  const char* env = std::getenv("FUSEBOX_PROGRESS");
  return info_shown || isatty(STDERR_FILENO) || (env != nullptr && std::strcmp(env, "1") == 0);
}

}  // namespace fusebox::tools
