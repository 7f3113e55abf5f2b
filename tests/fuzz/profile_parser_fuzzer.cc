// Fuzz target: gradient profiles (autotune/profile.h ParseProfile), read
// from autotune/profiles/*.json, recorded files and --profile arguments.
//
// Invariants: a profile that parses passes ValidateProfile, becomes a
// layout, round-trips through SerializeProfile (a fixed point), and the
// baseline planners give plans that ValidatePlan accepts for its layout.
#include <cstddef>
#include <cstdint>
#include <string>

#include "autotune/profile.h"
#include "bucketing/layout.h"
#include "bucketing/plan.h"
#include "bucketing/planners.h"
#include "tests/fuzz/fuzz_check.h"

namespace fusebox::autotune {
namespace {

void CheckProfile(const Profile& p) {
  absl::Status valid = ValidateProfile(p);
  FUZZ_CHECK(valid.ok(), "parsed profile is invalid: ", valid.message());
  FUZZ_CHECK(p.total_bytes() >= 0, p.total_bytes());

  const std::string text = SerializeProfile(p);
  absl::StatusOr<Profile> back = ParseProfile(text);
  FUZZ_CHECK(back.ok(), "serialized profile does not parse: ", back.status().message());
  FUZZ_CHECK(SerializeProfile(*back) == text, "SerializeProfile is not a fixed point");
  FUZZ_CHECK(back->tensors.size() == p.tensors.size());

  absl::StatusOr<bucketing::GradientLayout> layout = LayoutFromProfile(p);
  FUZZ_CHECK(layout.ok(), "valid profile has no layout: ", layout.status().message());
  FUZZ_CHECK(layout->total_bytes() == p.total_bytes());
  for (const bucketing::Plan& plan :
       {bucketing::PerTensorPlan(*layout), bucketing::DdpPlan(*layout)}) {
    absl::Status fits = bucketing::ValidatePlan(*layout, plan);
    FUZZ_CHECK(fits.ok(), "baseline plan does not fit its layout: ", fits.message());
  }
}

}  // namespace
}  // namespace fusebox::autotune

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fusebox::fuzz::ParseThenCheck(data, size, fusebox::autotune::ParseProfile,
                                fusebox::autotune::CheckProfile);
  return 0;
}
