// Fuzz target: cost-model files (autotune/cost_model.h ParseCostModel),
// read by fusebox-tune --cost_model, fusebox-perf --predict_with and the
// tuner's broadcast.
//
// Invariants: a model that parses is valid, round-trips through
// SerializeCostModel (a fixed point, same fingerprint), and predicts sane
// times (tests/fuzz/cost_model_check.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "autotune/cost_model.h"
#include "tests/fuzz/cost_model_check.h"
#include "tests/fuzz/fuzz_check.h"

namespace fusebox::autotune {
namespace {

void CheckModel(const CostModel& m) {
  fuzz::CheckPredictions(m);
  const std::string serialized = SerializeCostModel(m);
  absl::StatusOr<CostModel> back = ParseCostModel(serialized);
  FUZZ_CHECK(back.ok(), "serialized model does not parse: ", back.status().message(), "\n",
             serialized);
  FUZZ_CHECK(SerializeCostModel(*back) == serialized, "SerializeCostModel is not a fixed point");
  FUZZ_CHECK(back->Fingerprint() == m.Fingerprint());
}

}  // namespace
}  // namespace fusebox::autotune

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fusebox::fuzz::ParseThenCheck(data, size, fusebox::autotune::ParseCostModel,
                                fusebox::autotune::CheckModel);
  return 0;
}
