#include "comm/reduce.h"

#include <cstdint>
#include <vector>

#include "comm/testing/exact_data.h"
#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

using testing::FillExpected;
using testing::FillInput;
using testing::CountMismatches;

// Folding the inputs of `world` ranks with Reduce and FinishAvg must give the
// reference (computed in double) bit for bit, for every type and op.
TEST(ReduceTest, FoldMatchesReferenceForEveryTypeAndOp) {
  constexpr size_t kCount = 1027;
  for (int world : {1, 2, 3, 5}) {
    for (int t = 0; t < kNumDataTypes; ++t) {
      for (int o = 0; o < kNumReduceOps; ++o) {
        const auto type = static_cast<DataType>(t);
        const auto op = static_cast<ReduceOp>(o);
        const size_t bytes = kCount * DataTypeSize(type);
        std::vector<unsigned char> acc(bytes), in(bytes), want(bytes);
        FillInput(acc.data(), kCount, type, op, 0);
        for (int r = 1; r < world; ++r) {
          FillInput(in.data(), kCount, type, op, r);
          Reduce(acc.data(), in.data(), acc.data(), kCount, type, op);
        }
        if (op == ReduceOp::kAvg) FinishAvg(acc.data(), kCount, type, world);
        FillExpected(want.data(), kCount, type, op, world);
        EXPECT_EQ(CountMismatches(acc.data(), want.data(), kCount, type), 0u)
            << DataTypeName(type) << " " << ReduceOpName(op) << " world=" << world;
      }
    }
  }
}

TEST(ReduceTest, KnownValues) {
  std::vector<float> a = {1, -2, 3.5f}, b = {4, 5, -1};
  std::vector<float> out(3);
  Reduce(a.data(), b.data(), out.data(), 3, DataType::kFloat32, ReduceOp::kMax);
  EXPECT_EQ(out, (std::vector<float>{4, 5, 3.5f}));
  Reduce(a.data(), b.data(), out.data(), 3, DataType::kFloat32, ReduceOp::kProd);
  EXPECT_EQ(out, (std::vector<float>{4, -10, -3.5f}));
  std::vector<int32_t> s = {-7, 7};
  FinishAvg(s.data(), 2, DataType::kInt32, 2);
  EXPECT_EQ(s, (std::vector<int32_t>{-3, 3}));  // truncation toward zero
  std::vector<uint16_t> h = {FloatToHalf(1.5f)}, g = {FloatToHalf(2.25f)};
  Reduce(h.data(), g.data(), h.data(), 1, DataType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(HalfToFloat(h[0]), 3.75f);
}

TEST(ExactDataTest, ExpectedDiffersFromAnyOneRank) {
  // Guards against a reference that would accept an un-reduced buffer.
  constexpr size_t kCount = 4096;
  std::vector<float> in(kCount), want(kCount);
  FillExpected(want.data(), kCount, DataType::kFloat32, ReduceOp::kSum, 3);
  for (int r = 0; r < 3; ++r) {
    FillInput(in.data(), kCount, DataType::kFloat32, ReduceOp::kSum, r);
    EXPECT_GT(CountMismatches(in.data(), want.data(), kCount, DataType::kFloat32), kCount / 2);
  }
}

}  // namespace
}  // namespace fusebox::comm
