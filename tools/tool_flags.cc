#include "tools/tool_flags.h"

#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "autotune/models.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, log_level, "",
          "messages shown on stderr: error, warning, info or debug (default: "
          "$FUSEBOX_LOG_LEVEL, else warning); info also shows progress, debug each rank's "
          "set-up (fusebox-perf)");
ABSL_FLAG(int, progress, -1,
          "progress on stderr (rank 0): 1 on, 0 off, -1 when stderr is a terminal, "
          "FUSEBOX_PROGRESS=1 (set by fusebox-run on a terminal) or --log_level is info or "
          "debug (fusebox-perf overlap: rounds and tuning; fusebox-tune sweep and scale)");
ABSL_FLAG(std::string, profile, "resnet50",
          "the model: a bundled one (resnet50, bert_large, gpt2_small, gpt2_medium, gpt2_large, "
          "gpt2_xl, vit_b16) or a profile file (.json)");

namespace fusebox::tools {

absl::StatusOr<comm::LogLevel> LogLevelFromFlags() {
  return comm::ResolveLogLevel(absl::GetFlag(FLAGS_log_level), std::getenv("FUSEBOX_LOG_LEVEL"));
}

bool ProgressFromFlags(const comm::Logger& log) {
  return ShowProgress(absl::GetFlag(FLAGS_progress), log.Enabled(comm::LogLevel::kInfo));
}

absl::StatusOr<autotune::Profile> LoadProfileSpec(const std::string& spec) {
  if (absl::EndsWith(spec, ".json")) return autotune::LoadProfile(spec);
  return autotune::GenerateModelProfile(spec);
}

}  // namespace fusebox::tools
