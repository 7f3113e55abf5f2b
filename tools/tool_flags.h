// The flags fusebox-perf and fusebox-tune share, defined once
// (tools/tool_flags.cc) with one meaning and one help text, and what they
// resolve to. Both tools list them under --help (ParseToolCommandLine's
// help_files names this file beside the tool's own).
#ifndef FUSEBOX_TOOLS_TOOL_FLAGS_H_
#define FUSEBOX_TOOLS_TOOL_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "autotune/profile.h"
#include "comm/log.h"

ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(int, progress);
ABSL_DECLARE_FLAG(std::string, profile);

namespace fusebox::tools {

// The help filter that lists this file's flags (ParseToolCommandLine).
inline constexpr char kToolFlagsFile[] = "tools/tool_flags";

// --log_level, else $FUSEBOX_LOG_LEVEL, else warning. Reads the
// environment: call it at the edge.
absl::StatusOr<comm::LogLevel> LogLevelFromFlags();

// --progress (ShowProgress in tools/cli.h), given the log's level.
bool ProgressFromFlags(const comm::Logger& log);

// A bundled model's name (autotune::GenerateModelProfile) or a profile
// file ending in .json (autotune::LoadProfile): --profile's value.
absl::StatusOr<autotune::Profile> LoadProfileSpec(const std::string& spec);

}  // namespace fusebox::tools

#endif  // FUSEBOX_TOOLS_TOOL_FLAGS_H_
