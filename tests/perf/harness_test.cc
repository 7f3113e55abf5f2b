#include "perf/harness.h"

#include "gtest/gtest.h"

namespace fusebox::perf {
namespace {

TEST(ParseBytesTest, SuffixesAreBinaryMultiples) {
  EXPECT_EQ(*ParseBytes("8"), 8u);
  EXPECT_EQ(*ParseBytes("256K"), 256u << 10);
  EXPECT_EQ(*ParseBytes("64M"), 64u << 20);
  EXPECT_EQ(*ParseBytes("64MB"), 64u << 20);
  EXPECT_EQ(*ParseBytes("1g"), 1u << 30);
  EXPECT_EQ(*ParseBytes("8B"), 8u);
}

TEST(ParseBytesTest, RejectsGarbageAndHugeSizesNamingThem) {
  for (const char* bad : {"", "M", "12Q", "-5", "1.5M", "2T"}) {
    auto v = ParseBytes(bad);
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_NE(v.status().message().find(bad), std::string::npos) << v.status();
  }
  EXPECT_FALSE(ParseBytes("2048G").ok());
}

TEST(SweepSizesTest, FactorSweepIsAlignedAndInclusive) {
  PerfOptions o;
  o.min_bytes = 8;
  o.max_bytes = 64;
  o.factor = 2;
  EXPECT_EQ(SweepSizes(o, 4), (std::vector<size_t>{8, 16, 32, 64}));
  o.min_bytes = 6;  // aligned down to whole float elements
  o.max_bytes = 24;
  EXPECT_EQ(SweepSizes(o, 4), (std::vector<size_t>{4, 12, 24}));
}

TEST(SweepSizesTest, StepAndMultiTensorAlignment) {
  PerfOptions o;
  o.min_bytes = 100;
  o.max_bytes = 400;
  o.step_bytes = 100;
  o.tensors = 3;  // each size holds 3 equal float tensors
  EXPECT_EQ(SweepSizes(o, 4), (std::vector<size_t>{96, 192, 300, 396}));
  o.step_bytes = 0;
  o.factor = 1;  // one size only
  EXPECT_EQ(SweepSizes(o, 4), (std::vector<size_t>{96}));
}

}  // namespace
}  // namespace fusebox::perf
