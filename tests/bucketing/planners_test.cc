// Baseline planners: each reproduces a known policy on hand-built layouts,
// and every planner yields a valid plan on random layouts.
#include "bucketing/planners.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/bucketing/test_layouts.h"

namespace fusebox::bucketing {
namespace {

using testing::MakeLayout;
using testing::RandomLayout;
using ::testing::HasSubstr;

// Tensor ids of each bucket (whole tensors only).
std::vector<std::vector<int>> Groups(const Plan& plan) {
  std::vector<std::vector<int>> out;
  for (const Bucket& b : plan.buckets) {
    out.emplace_back();
    for (const Slice& s : b.slices) out.back().push_back(s.tensor);
  }
  return out;
}

using G = std::vector<std::vector<int>>;

TEST(PlannersTest, PerTensorIsOneBucketEach) {
  GradientLayout layout = MakeLayout({3, 0, 5});
  Plan p = PerTensorPlan(layout);
  EXPECT_EQ(Groups(p), (G{{0}, {1}, {2}}));
  EXPECT_TRUE(ValidatePlan(layout, p).ok());
}

TEST(PlannersTest, DdpClosesFirstBucketAtOneMiBThenAtCap) {
  // fp32: 0.5 MiB + 0.5 MiB reaches the 1 MiB first limit; then 10 + 10 + 10
  // MiB reaches 25 MiB after the third; the rest stays open.
  const int64_t half_mib = kMiB / 8;  // elements
  GradientLayout layout =
      MakeLayout({half_mib, half_mib, 20 * half_mib, 20 * half_mib, 20 * half_mib, 3, 4});
  Plan p = DdpPlan(layout);
  EXPECT_EQ(Groups(p), (G{{0, 1}, {2, 3, 4}, {5, 6}}));
  EXPECT_TRUE(ValidatePlan(layout, p).ok());
}

TEST(PlannersTest, DdpNeverSplitsATensorLargerThanTheCap) {
  GradientLayout layout = MakeLayout({1, 100 * kMiB / 4, 1});
  Plan p = DdpPlan(layout);
  EXPECT_EQ(Groups(p), (G{{0, 1}, {2}}));
}

TEST(PlannersTest, DdpKeepsDtypesApartAndOrdersByFirstTensor) {
  std::vector<TensorSpec> specs = {{"a", 4, comm::DataType::kFloat32},
                                   {"b", 4, comm::DataType::kFloat16},
                                   {"c", 4, comm::DataType::kFloat32},
                                   {"d", 4, comm::DataType::kFloat16}};
  GradientLayout layout = *GradientLayout::Create(specs);
  Plan p = DdpPlan(layout, DdpOptions{32, 32});
  // fp32: a + c = 32 bytes closes at c; fp16: b + d = 16 bytes stays open
  // until the end. Sorted by first tensor: {a, c} before {b, d}.
  EXPECT_EQ(Groups(p), (G{{0, 2}, {1, 3}}));
  EXPECT_TRUE(ValidatePlan(layout, p).ok());
}

TEST(PlannersTest, HorovodFusesWhatIsReadyWithinOneCycle) {
  GradientLayout layout = MakeLayout({10, 10, 10, 10, 10});
  // Cycles of 1000 us: (0,1000] holds t0, t1; (1000,2000] t2; (3000,4000] t3, t4.
  const std::vector<double> ready = {0, 1000, 1500, 3100, 3900};
  auto p = HorovodPlan(layout, ready);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Groups(*p), (G{{0, 1}, {2}, {3, 4}}));
}

TEST(PlannersTest, HorovodStartsNewFusionAtTheThreshold) {
  GradientLayout layout = MakeLayout({10, 10, 30, 10});  // 40, 40, 120, 40 bytes
  auto p = HorovodPlan(layout, {1, 2, 3, 4}, HorovodOptions{100, 1000});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Groups(*p), (G{{0, 1}, {2}, {3}}));
  EXPECT_FALSE(HorovodPlan(layout, {1, 2, 3}).ok()) << "one time per tensor";
  EXPECT_THAT(std::string(HorovodPlan(layout, {1, 2, 1, 4}).status().message()),
              HasSubstr("earlier than the one before"));
}

TEST(PlannersTest, SplitIndicesMakeSegments) {
  GradientLayout layout = MakeLayout({1, 2, 3, 4, 5});
  auto p = SplitIndicesPlan(layout, {2, 4});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Groups(*p), (G{{0, 1}, {2, 3}, {4}}));
  EXPECT_FALSE(SplitIndicesPlan(layout, {2, 2}).ok());
  EXPECT_FALSE(SplitIndicesPlan(layout, {0}).ok());
  EXPECT_FALSE(SplitIndicesPlan(layout, {5}).ok());
}

TEST(PlannersTest, HcclSplitsByBytes) {
  // 100 tensors of 1 element: 96.54% of the bytes is reached at tensor 96.
  GradientLayout layout = MakeLayout(std::vector<int64_t>(100, 1));
  auto p = SplitBytesPlan(layout, kHcclDefaultSplit);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->buckets.size(), 2u);
  EXPECT_EQ(p->buckets[0].slices.size(), 97u);
  EXPECT_EQ(p->buckets[1].slices.size(), 3u);
  EXPECT_FALSE(SplitBytesPlan(layout, {0.5, 0.4}).ok()) << "must sum to 1";
  EXPECT_FALSE(SplitBytesPlan(layout, std::vector<double>(9, 1.0 / 9)).ok()) << "at most 8";
}

TEST(PlannersTest, FixedSizeSplitsLargeTensors) {
  GradientLayout layout = MakeLayout({3, 10, 2});  // 12, 40, 8 bytes
  auto p = FixedSizePlan(layout, 16);               // 4 elements per bucket
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(ValidatePlan(layout, *p).ok()) << ValidatePlan(layout, *p);
  std::vector<int64_t> counts;
  for (const Bucket& b : p->buckets) counts.push_back(b.count());
  EXPECT_EQ(counts, (std::vector<int64_t>{4, 4, 4, 3}));
  EXPECT_EQ(p->buckets[0].slices, (std::vector<Slice>{{0, 0, 3}, {1, 0, 1}}));
  EXPECT_FALSE(FixedSizePlan(layout, 0).ok());
}

TEST(PlannersTest, EveryPlannerCoversRandomLayoutsExactly) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    GradientLayout layout = RandomLayout(seed, 1 + static_cast<int>(seed % 40), 5000, 100000,
                                         /*mixed=*/seed % 2 == 0);
    std::vector<double> ready;
    for (int i = 0; i < layout.size(); ++i) ready.push_back(i * 37.5);
    std::vector<Plan> plans = {PerTensorPlan(layout), DdpPlan(layout, DdpOptions{1000, 20000}),
                               *HorovodPlan(layout, ready, HorovodOptions{30000, 100}),
                               *SplitBytesPlan(layout, kHcclDefaultSplit),
                               *FixedSizePlan(layout, 4096)};
    if (layout.size() > 2) plans.push_back(*SplitIndicesPlan(layout, {1, layout.size() - 1}));
    for (const Plan& p : plans) {
      EXPECT_TRUE(ValidatePlan(layout, p).ok())
          << "seed " << seed << " plan " << p.name << ": " << ValidatePlan(layout, p);
    }
  }
}

}  // namespace
}  // namespace fusebox::bucketing
