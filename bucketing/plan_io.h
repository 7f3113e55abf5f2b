// Plan files: a versioned JSON form of a Plan, for plans given on command
// lines and kept in the policy cache.
//
//   {"format": "fusebox-plan", "version": 1, "name": "my-plan",
//    "layout_hash": "9c1f...e2",            // optional: GradientLayout::Hash in hex
//    "buckets": [ {"dtype": "float", "slices": [[tensor, offset, count], ...]}, ... ]}
//
// Files are untrusted: size, nesting and counts are bounded, every field is
// type-checked, and errors name the field (e.g. "buckets[3].slices[0][2]").
#ifndef FUSEBOX_BUCKETING_PLAN_IO_H_
#define FUSEBOX_BUCKETING_PLAN_IO_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketing/layout.h"
#include "bucketing/plan.h"

namespace fusebox::bucketing {

inline constexpr int kPlanFormatVersion = 1;
inline constexpr size_t kMaxPlanFileBytes = size_t{256} << 20;

// Parses the JSON form. Checks structure only; ValidatePlan checks the plan
// against a layout (ReadPlanFile does both).
absl::StatusOr<Plan> ParsePlan(absl::string_view json_text);

// The JSON form; `layout` (optional) adds its hash so that a reader can tell
// a plan made for another model.
std::string SerializePlan(const Plan& plan, const GradientLayout* layout = nullptr);

// Reads, parses and validates against `layout` (including layout_hash when
// present). Errors name the path.
absl::StatusOr<Plan> ReadPlanFile(const std::string& path, const GradientLayout& layout);

// Writes atomically (temporary file in the same directory, then rename).
absl::Status WritePlanFile(const std::string& path, const Plan& plan,
                           const GradientLayout* layout = nullptr);

}  // namespace fusebox::bucketing

#endif  // FUSEBOX_BUCKETING_PLAN_IO_H_
