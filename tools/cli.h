// Command lines of fusebox's absl-flags tools (fusebox-perf, fusebox-tune),
// parsed the same way everywhere:
//   --help      lists every fusebox flag of the tool with its default (not
//               only those of a file named after the program, absl's
//               default, which matched none);
//   --version   prints "<tool> <fusebox version>";
//   --cache-dir is --cache_dir (NormalizeFlagSpelling);
//   a usage error (an unknown flag, a value that does not parse, a missing
//               value) prints the error naming the flag and exits 2, as the
//               tools' help promises (absl itself exits 1).
//
//   int main(int argc, char** argv) {
//     std::vector<char*> positional = fusebox::tools::ParseToolCommandLine(
//         argc, argv, "fusebox-perf", kUsage, "perf/");
#ifndef FUSEBOX_TOOLS_CLI_H_
#define FUSEBOX_TOOLS_CLI_H_

#include <optional>
#include <string>
#include <vector>

namespace fusebox::tools {

// Exit status of a bad command line.
inline constexpr int kUsageExit = 2;

// The first usage error in argv[1..argc) for the flags registered with absl,
// or nullopt; stops at "--". Values are checked by parsing them into the
// flag (which ParseCommandLine then sets again). Exposed for tests.
std::optional<std::string> FindUsageError(int argc, char** argv);

// One spelling for every tool: flag names with '-' between words are
// accepted as the '_' absl defines (--cache-dir is --cache_dir), in place,
// up to "--"; values and positional arguments are left alone. (fusebox-run
// accepts both, the other way round.) Exposed for tests.
void NormalizeFlagSpelling(int argc, char** argv);

// Checks argv (exits kUsageExit on a usage error, naming the flag), then
// absl::ParseCommandLine with the conventions above. --help lists the flags
// defined in source files whose path contains one of the comma-separated
// `help_files` (the tool's own, e.g. "perf/", and those it shares,
// tools/tool_flags.h) and exits 0. Returns the positional arguments (argv[0]
// first).
std::vector<char*> ParseToolCommandLine(int argc, char** argv, const char* tool,
                                        const char* usage, const char* help_files);

// Whether a tool shows progress, from its --progress flag: 1 on, 0 off, -1
// where someone watches (stderr is a terminal, or the ranks run under
// fusebox-run on one: FUSEBOX_PROGRESS=1) or `info_shown` (the log level
// shows info). Reads the environment: call it at the edge.
bool ShowProgress(int progress_flag, bool info_shown);

}  // namespace fusebox::tools

#endif  // FUSEBOX_TOOLS_CLI_H_
