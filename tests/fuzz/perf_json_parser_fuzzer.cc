// Fuzz target: `fusebox-perf allreduce --json` files
// (autotune/cost_model.h ParsePerfAllReduceJson), read by fusebox-tune
// --fit to fit a cost model.
//
// Invariants: every sample is usable (world within bounds, bytes > 0, a
// finite positive time); a model fitted to them, or measured at their world
// size, is valid and predicts sane times (tests/fuzz/cost_model_check.h).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "autotune/cost_model.h"
#include "tests/fuzz/cost_model_check.h"
#include "tests/fuzz/fuzz_check.h"

namespace fusebox::autotune {
namespace {

void CheckSamples(const std::vector<AllReduceSample>& samples) {
  for (const AllReduceSample& s : samples) {
    FUZZ_CHECK(s.world >= 1 && s.world <= (1 << 24), s.world);
    FUZZ_CHECK(s.bytes > 0, s.bytes);
    FUZZ_CHECK(std::isfinite(s.time_us) && s.time_us > 0, s.time_us);
  }
  absl::StatusOr<CostModel> fitted = FitCostModel(samples, 1, "fuzz");
  if (fitted.ok()) fuzz::CheckPredictions(*fitted);
  if (samples.empty()) return;
  absl::StatusOr<CostModel> preset = PresetCostModel("25gbe");
  FUZZ_CHECK(preset.ok());
  const CostModel measured = MeasuredAt(*preset, samples, samples.front().world);
  for (size_t i = 1; i < measured.measured.size(); ++i) {
    FUZZ_CHECK(measured.measured[i].bytes > measured.measured[i - 1].bytes);
    FUZZ_CHECK(measured.measured[i].time_us >= measured.measured[i - 1].time_us);
  }
  fuzz::CheckPredictions(measured);
}

}  // namespace
}  // namespace fusebox::autotune

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fusebox::fuzz::ParseThenCheck(data, size, fusebox::autotune::ParsePerfAllReduceJson,
                                fusebox::autotune::CheckSamples);
  return 0;
}
