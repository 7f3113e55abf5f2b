// Invariants of a valid cost model, shared by the cost-model and
// fusebox-perf JSON fuzz targets.
#ifndef FUSEBOX_TESTS_FUZZ_COST_MODEL_CHECK_H_
#define FUSEBOX_TESTS_FUZZ_COST_MODEL_CHECK_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "autotune/cost_model.h"
#include "tests/fuzz/fuzz_check.h"

namespace fusebox::autotune::fuzz {

// A valid model predicts, at every world size, a time that is a number,
// >= 0, and does not shrink as messages grow (within rounding).
inline void CheckPredictions(const CostModel& m) {
  const absl::Status valid = m.Validate();
  FUZZ_CHECK(valid.ok(), "model is invalid: ", valid.message());
  std::vector<int> worlds = {1, 2, 3, 8, 64, 4096};
  std::vector<int64_t> sizes = {0, 1, 4096, int64_t{1} << 20, int64_t{1} << 40};
  if (!m.measured.empty()) {
    worlds.push_back(m.measured.front().world);
    for (const AllReduceSample& s : m.measured) {
      sizes.push_back(s.bytes);
      if (sizes.size() > 64) break;
    }
  }
  std::sort(sizes.begin(), sizes.end());
  for (int world : worlds) {
    double previous = 0;
    for (int64_t bytes : sizes) {
      const double t = m.AllReduceUs(bytes, world);
      FUZZ_CHECK(!std::isnan(t) && t >= 0, "world ", world, ", ", bytes, " bytes: ", t, " us");
      FUZZ_CHECK(t >= previous * (1 - 1e-9), "world ", world, ", ", bytes, " bytes: ", t,
                 " us, less than ", previous, " us for fewer bytes");
      previous = t;
    }
  }
}

}  // namespace fusebox::autotune::fuzz

#endif  // FUSEBOX_TESTS_FUZZ_COST_MODEL_CHECK_H_
