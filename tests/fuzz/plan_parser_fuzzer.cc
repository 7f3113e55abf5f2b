// Fuzz target: plan files (bucketing/plan_io.h ParsePlan), read from command
// lines, the policy cache and the tuner's broadcast.
//
// Invariants: a plan that parses is within the documented bounds,
// round-trips through SerializePlan to an equal plan with the same hash and
// name, and can be validated against a layout it might fit without
// crashing (ValidatePlan is what ReadPlanFile runs next).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bucketing/layout.h"
#include "bucketing/plan.h"
#include "bucketing/plan_io.h"
#include "tests/fuzz/fuzz_check.h"

namespace fusebox::bucketing {
namespace {

void CheckPlan(const Plan& plan) {
  FUZZ_CHECK(plan.buckets.size() <= static_cast<size_t>(kMaxPlanBuckets));
  size_t slices = 0;
  int max_tensor = -1;
  for (const Bucket& b : plan.buckets) {
    slices += b.slices.size();
    for (const Slice& s : b.slices) {
      FUZZ_CHECK(s.tensor >= 0 && s.tensor < kMaxLayoutTensors, s.tensor);
      FUZZ_CHECK(s.offset >= 0 && s.offset <= kMaxTensorElements, s.offset);
      FUZZ_CHECK(s.count >= 0 && s.count <= kMaxTensorElements, s.count);
      max_tensor = std::max(max_tensor, s.tensor);
    }
  }
  FUZZ_CHECK(slices <= static_cast<size_t>(kMaxPlanSlices));

  const std::string text = SerializePlan(plan);
  absl::StatusOr<Plan> back = ParsePlan(text);
  FUZZ_CHECK(back.ok(), "serialized plan does not parse: ", back.status().message(), "\n", text);
  FUZZ_CHECK(*back == plan, "plan changed across SerializePlan/ParsePlan");
  FUZZ_CHECK(back->name == plan.name);
  FUZZ_CHECK(PlanHash(*back) == PlanHash(plan));
  FUZZ_CHECK(SerializePlan(*back) == text, "SerializePlan is not a fixed point");

  // A layout the plan may fit: each tensor as long as its furthest slice.
  // Small plans only (a layout of 2^20 tensors per input would be slow).
  if (max_tensor < 0 || max_tensor >= 4096) return;
  std::vector<TensorSpec> specs(static_cast<size_t>(max_tensor) + 1);
  for (size_t t = 0; t < specs.size(); ++t) specs[t].name = "t" + std::to_string(t);
  for (const Bucket& b : plan.buckets) {
    for (const Slice& s : b.slices) {
      TensorSpec& spec = specs[static_cast<size_t>(s.tensor)];
      spec.numel = std::min(kMaxTensorElements, std::max(spec.numel, s.offset + s.count));
      spec.dtype = b.dtype;
    }
  }
  absl::StatusOr<GradientLayout> layout = GradientLayout::Create(std::move(specs));
  if (!layout.ok()) return;  // e.g. an integer dtype: not a gradient layout
  if (ValidatePlan(*layout, plan).ok()) (void)DescribePlan(*layout, plan);
}

}  // namespace
}  // namespace fusebox::bucketing

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fusebox::fuzz::ParseThenCheck(data, size, fusebox::bucketing::ParsePlan,
                                fusebox::bucketing::CheckPlan);
  return 0;
}
