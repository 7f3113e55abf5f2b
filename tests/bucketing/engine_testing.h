// Helpers shared by the engine tests: ranks as threads (over the in-process
// loopback communicator, or real UCX where a test says so), the exact
// expected average, and the baseline plans.
#ifndef FUSEBOX_TESTS_BUCKETING_ENGINE_TESTING_H_
#define FUSEBOX_TESTS_BUCKETING_ENGINE_TESTING_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "bucketing/layout.h"
#include "bucketing/planners.h"
#include "comm/testing/exact_data.h"
#include "comm/types.h"
#include "gtest/gtest.h"
#include "tests/common/run_ranks.h"

namespace fusebox::bucketing::testing {

using fusebox::testing::RankFn;
using fusebox::testing::RunRanks;

// The expected averaged gradient of tensor `t`: the exact sum over ranks
// (exact_data.h) divided by the world size once, in the element type.
inline std::vector<unsigned char> Expected(const TensorSpec& t, int world, uint64_t seed) {
  const size_t esize = comm::DataTypeSize(t.dtype);
  std::vector<unsigned char> sum(t.numel * esize + 1), out(t.numel * esize + 1);
  comm::testing::FillExpected(sum.data(), t.numel, t.dtype, comm::ReduceOp::kSum, world, seed);
  for (int64_t i = 0; i < t.numel; ++i) {
    const double s = comm::testing::LoadElement(sum.data(), i, t.dtype);
    switch (t.dtype) {
      case comm::DataType::kFloat32: {
        float v = static_cast<float>(s) / static_cast<float>(world);
        std::memcpy(out.data() + i * 4, &v, 4);
        break;
      }
      case comm::DataType::kFloat64: {
        double v = s / world;
        std::memcpy(out.data() + i * 8, &v, 8);
        break;
      }
      case comm::DataType::kFloat16: {
        uint16_t v = comm::FloatToHalf(static_cast<float>(s) / static_cast<float>(world));
        std::memcpy(out.data() + i * 2, &v, 2);
        break;
      }
      case comm::DataType::kBFloat16: {
        uint16_t v = comm::FloatToBFloat16(static_cast<float>(s) / static_cast<float>(world));
        std::memcpy(out.data() + i * 2, &v, 2);
        break;
      }
      default:
        ADD_FAILURE() << "unexpected dtype";
    }
  }
  return out;
}

// The data seed of one tensor in one iteration.
inline uint64_t Seed(int iteration, int tensor) {
  return iteration * 1000003ull + tensor * 7919ull;
}

// Every baseline planner's plan for `layout` (tensors ready 20 us apart).
inline std::vector<Plan> BaselinePlans(const GradientLayout& layout) {
  std::vector<double> ready;
  for (int i = 0; i < layout.size(); ++i) ready.push_back(i * 20.0);
  std::vector<Plan> plans = {PerTensorPlan(layout),
                             DdpPlan(layout, DdpOptions{2048, 16384}),
                             *HorovodPlan(layout, ready, HorovodOptions{32768, 100}),
                             *SplitBytesPlan(layout, kHcclDefaultSplit),
                             *FixedSizePlan(layout, 1000)};
  if (layout.size() > 3) plans.push_back(*SplitIndicesPlan(layout, {1, layout.size() / 2}));
  return plans;
}

}  // namespace fusebox::bucketing::testing

#endif  // FUSEBOX_TESTS_BUCKETING_ENGINE_TESTING_H_
