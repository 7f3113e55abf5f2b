// Fusion buffers (Note [Fusion buffers and views] in
// bucketing/fusion_buffers.h) on their own, in host memory.
#include "bucketing/fusion_buffers.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/bucketing/test_layouts.h"

namespace fusebox::bucketing {
namespace {

using testing::MakeLayout;

// Tensors 0 (4), 1 (3, split 1 + 2 over buckets 0 and 1), 2 (0), 3 (5).
Plan SplitPlan() {
  Plan plan;
  plan.buckets.push_back(Bucket{comm::DataType::kFloat32, {{0, 0, 4}, {1, 0, 1}}});
  plan.buckets.push_back(Bucket{comm::DataType::kFloat32, {{1, 1, 2}, {2, 0, 0}, {3, 0, 5}}});
  return plan;
}

bool Same(const Placement& p, int bucket, int64_t buffer_offset, int64_t tensor_offset,
          int64_t count) {
  return p.bucket == bucket && p.buffer_offset == buffer_offset &&
         p.tensor_offset == tensor_offset && p.count == count;
}

TEST(FusionBuffersTest, SlicesArePlacedBackToBackInPlanOrder) {
  const auto placements = PlaceSlices(SplitPlan(), 4);
  ASSERT_EQ(placements.size(), 4u);
  ASSERT_EQ(placements[0].size(), 1u);
  EXPECT_TRUE(Same(placements[0][0], 0, 0, 0, 4));
  ASSERT_EQ(placements[1].size(), 2u);
  EXPECT_TRUE(Same(placements[1][0], 0, 4, 0, 1));
  EXPECT_TRUE(Same(placements[1][1], 1, 0, 1, 2));
  ASSERT_EQ(placements[2].size(), 1u);
  EXPECT_TRUE(Same(placements[2][0], 1, 2, 0, 0));
  ASSERT_EQ(placements[3].size(), 1u);
  EXPECT_TRUE(Same(placements[3][0], 1, 2, 0, 5));
  EXPECT_TRUE(PlaceSlices(Plan{}, 2)[1].empty());
}

TEST(FusionBuffersTest, EachBucketHasAnAlignedBufferWithRoomForVotes) {
  const Plan plan = SplitPlan();
  auto buffers = FusionBuffers::Allocate(plan, /*vote_slots=*/2, nullptr, false, true);
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  EXPECT_EQ((*buffers)->vote_slots(), 2);
  for (int b = 0; b < 2; ++b) {
    char* data = (*buffers)->data(b);
    ASSERT_NE(data, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % 64, 0u);
    EXPECT_EQ((*buffers)->votes(b, plan.buckets[b]), data + plan.buckets[b].count() * 4);
    // The data and the votes are writable (ASan would say otherwise).
    std::fill(data, data + (plan.buckets[b].count() + 2) * 4, 0x11);
  }
}

TEST(FusionBuffersTest, ExternalBuffersAllocateNothing) {
  auto buffers = FusionBuffers::Allocate(SplitPlan(), 0, nullptr, false, /*allocate=*/false);
  ASSERT_TRUE(buffers.ok());
  EXPECT_EQ((*buffers)->data(0), nullptr);
  EXPECT_EQ((*buffers)->data(1), nullptr);
}

TEST(FusionBuffersTest, ABucketOfZeroSizeTensorsHasNoBuffer) {
  Plan plan;
  plan.buckets.push_back(Bucket{comm::DataType::kFloat32, {{0, 0, 0}}});
  plan.buckets.push_back(Bucket{comm::DataType::kFloat64, {{1, 0, 3}}});
  auto buffers = FusionBuffers::Allocate(plan, 0, nullptr, false, true);
  ASSERT_TRUE(buffers.ok());
  EXPECT_EQ((*buffers)->data(0), nullptr);
  EXPECT_NE((*buffers)->data(1), nullptr);
  // With votes, every bucket has a buffer (its votes).
  auto voting = FusionBuffers::Allocate(plan, 2, nullptr, false, true);
  ASSERT_TRUE(voting.ok());
  EXPECT_NE((*voting)->data(0), nullptr);
}

TEST(FusionBuffersTest, ViewsAreTensorsWholeInOneBucket) {
  const GradientLayout layout = MakeLayout({4, 3, 0, 5});
  const Plan plan = SplitPlan();
  const auto placements = PlaceSlices(plan, layout.size());
  auto buffers = FusionBuffers::Allocate(plan, 0, nullptr, false, true);
  ASSERT_TRUE(buffers.ok());
  const std::vector<void*> views = TensorViews(layout, placements, **buffers, true);
  ASSERT_EQ(views.size(), 4u);
  EXPECT_EQ(views[0], (*buffers)->data(0));
  EXPECT_EQ(views[1], nullptr) << "split";
  EXPECT_EQ(views[2], nullptr) << "zero-size";
  EXPECT_EQ(views[3], (*buffers)->data(1) + 2 * 4);
  for (void* v : TensorViews(layout, placements, **buffers, false)) EXPECT_EQ(v, nullptr);
  auto external = FusionBuffers::Allocate(plan, 0, nullptr, false, false);
  ASSERT_TRUE(external.ok());
  for (void* v : TensorViews(layout, placements, **external, true)) EXPECT_EQ(v, nullptr);
}

}  // namespace
}  // namespace fusebox::bucketing
