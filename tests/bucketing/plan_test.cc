// Plans: validation (exact coverage), hashing and the plan file format.
#include "bucketing/plan.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "bucketing/plan_io.h"
#include "bucketing/planners.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/bucketing/test_layouts.h"

namespace fusebox::bucketing {
namespace {

using testing::MakeLayout;
using ::testing::HasSubstr;

Plan TwoBuckets() {
  // t0 (10) whole, t1 (6) split 4 + 2, t2 (0) empty.
  Plan p;
  p.buckets.push_back(Bucket{comm::DataType::kFloat32, {{0, 0, 10}, {1, 0, 4}}});
  p.buckets.push_back(Bucket{comm::DataType::kFloat32, {{1, 4, 2}, {2, 0, 0}}});
  return p;
}

TEST(PlanTest, AcceptsExactCoverWithSplitAndEmptyTensor) {
  GradientLayout layout = MakeLayout({10, 6, 0});
  EXPECT_TRUE(ValidatePlan(layout, TwoBuckets()).ok()) << ValidatePlan(layout, TwoBuckets());
}

TEST(PlanTest, RejectsMissingElements) {
  GradientLayout layout = MakeLayout({10, 6, 0});
  Plan p = TwoBuckets();
  p.buckets[1].slices[0].count = 1;  // element 5 of t1 uncovered
  absl::Status s = ValidatePlan(layout, p);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("elements [5, 6) are in no bucket"));
}

TEST(PlanTest, RejectsDuplicatedElements) {
  GradientLayout layout = MakeLayout({10, 6, 0});
  Plan p = TwoBuckets();
  p.buckets[1].slices[0] = Slice{1, 3, 3};  // element 3 twice
  absl::Status s = ValidatePlan(layout, p);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("covered twice"));
}

TEST(PlanTest, RejectsTensorInNoBucket) {
  GradientLayout layout = MakeLayout({10, 6, 0});
  Plan p = TwoBuckets();
  p.buckets[1].slices.pop_back();  // the zero-size tensor
  EXPECT_THAT(std::string(ValidatePlan(layout, p).message()), HasSubstr("\"t2\") is in no bucket"));
}

TEST(PlanTest, RejectsOutOfRangeSliceAndUnknownTensor) {
  GradientLayout layout = MakeLayout({10, 6, 0});
  Plan p = TwoBuckets();
  p.buckets[0].slices[0].count = 11;
  EXPECT_THAT(std::string(ValidatePlan(layout, p).message()), HasSubstr("outside tensor 0"));
  p = TwoBuckets();
  p.buckets[0].slices[0].tensor = 3;
  EXPECT_THAT(std::string(ValidatePlan(layout, p).message()), HasSubstr("tensor id 3 is not"));
}

TEST(PlanTest, RejectsMixedDtypesAndEmptyBuckets) {
  std::vector<TensorSpec> specs = {{"a", 4, comm::DataType::kFloat32},
                                   {"b", 4, comm::DataType::kFloat16}};
  GradientLayout layout = *GradientLayout::Create(specs);
  Plan p;
  p.buckets.push_back(Bucket{comm::DataType::kFloat32, {{0, 0, 4}, {1, 0, 4}}});
  EXPECT_THAT(std::string(ValidatePlan(layout, p).message()), HasSubstr("is half but the bucket is float"));
  p.buckets = {Bucket{comm::DataType::kFloat32, {{0, 0, 4}}}, Bucket{comm::DataType::kFloat16, {}},
               Bucket{comm::DataType::kFloat16, {{1, 0, 4}}}};
  EXPECT_THAT(std::string(ValidatePlan(layout, p).message()), HasSubstr("bucket 1 has no slices"));
}

TEST(PlanTest, RejectsEmptySliceOfNonEmptyTensor) {
  GradientLayout layout = MakeLayout({4});
  Plan p;
  p.buckets.push_back(Bucket{comm::DataType::kFloat32, {{0, 0, 4}, {0, 4, 0}}});
  EXPECT_THAT(std::string(ValidatePlan(layout, p).message()), HasSubstr("empty slice"));
}

TEST(PlanTest, HashIsStableAndSensitive) {
  Plan a = TwoBuckets();
  Plan b = TwoBuckets();
  b.name = "another label";
  EXPECT_EQ(PlanHash(a), PlanHash(b)) << "the name is a label, not part of the plan";
  // The encoding is fixed (value computed independently in Python from the
  // documented encoding): a change here breaks every cached plan.
  EXPECT_EQ(PlanHash(a), 0xe5f30a803ce5952dull) << std::hex << PlanHash(a);
  b.buckets[1].slices[0].offset = 5;
  EXPECT_NE(PlanHash(a), PlanHash(b));
  b = TwoBuckets();
  b.buckets[0].dtype = comm::DataType::kFloat64;
  EXPECT_NE(PlanHash(a), PlanHash(b));
  std::swap(b.buckets[0], b.buckets[1]);
  EXPECT_NE(PlanHash(a), PlanHash(b)) << "order is part of the plan";
}

TEST(PlanTest, LayoutRejectsBadTensors) {
  EXPECT_FALSE(GradientLayout::Create({{"", 1}}).ok());
  EXPECT_THAT(std::string(GradientLayout::Create({{"a", 1}, {"a", 2}}).status().message()),
              HasSubstr("appears twice"));
  EXPECT_THAT(std::string(GradientLayout::Create({{"a", -1}}).status().message()),
              HasSubstr("element count -1"));
  EXPECT_THAT(
      std::string(GradientLayout::Create({{"a", 1, comm::DataType::kInt32}}).status().message()),
      HasSubstr("not a floating-point"));
  GradientLayout a = MakeLayout({1, 2});
  GradientLayout b = MakeLayout({1, 3});
  EXPECT_NE(a.Hash(), b.Hash());
  EXPECT_EQ(a.Hash(), MakeLayout({1, 2}).Hash());
}

TEST(PlanFileTest, RoundTrips) {
  GradientLayout layout = MakeLayout({10, 6, 0});
  Plan p = TwoBuckets();
  p.name = "two";
  auto parsed = ParsePlan(SerializePlan(p, &layout));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, p);
  EXPECT_EQ(parsed->name, "two");
  const std::string path = ::testing::TempDir() + "/plan_roundtrip.json";
  ASSERT_TRUE(WritePlanFile(path, p, &layout).ok());
  auto read = ReadPlanFile(path, layout);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, p);
  // The same file against another model's layout is refused by its hash.
  auto other = ReadPlanFile(path, MakeLayout({10, 6, 1}));
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("layout_hash"));
  std::remove(path.c_str());
}

TEST(PlanFileTest, RejectsBadFilesNamingTheField) {
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"{", "malformed JSON"},
      {"[]", "(root)"},
      {R"({"format": "x", "version": 1, "buckets": []})", "format"},
      {R"({"format": "fusebox-plan", "version": 9, "buckets": []})", "version 9 is not supported"},
      {R"({"format": "fusebox-plan", "version": 1})", "buckets"},
      {R"({"format": "fusebox-plan", "version": 1, "buckets": [{"slices": []}]})",
       "buckets[0].dtype"},
      {R"({"format": "fusebox-plan", "version": 1, "buckets": [{"dtype": "float128", "slices": []}]})",
       "buckets[0].dtype"},
      {R"({"format": "fusebox-plan", "version": 1, "buckets": [{"dtype": "float", "slices": [[0, 0]]}]})",
       "buckets[0].slices[0]"},
      {R"({"format": "fusebox-plan", "version": 1, "buckets": [{"dtype": "float", "slices": [[0, -1, 2]]}]})",
       "buckets[0].slices[0][1]"},
      {R"({"format": "fusebox-plan", "version": 1, "buckets": [{"dtype": "float", "slices": [[0, 0, 1e99]]}]})",
       "buckets[0].slices[0][2]"},
      // A number beyond double's range (found by tests/fuzz: it escaped as
      // an exception).
      {R"({"format": "fusebox-plan", "version": 1, "buckets": [{"dtype": "float", "slices": [[0, 0, 1e999]]}]})",
       "number overflow"},
      {R"({"format": "fusebox-plan", "version": 1, "buckets": [[[[[[[[1]]]]]]]]})", "nested deeper"},
  };
  for (const Case& c : cases) {
    auto p = ParsePlan(c.text);
    EXPECT_FALSE(p.ok()) << c.text;
    EXPECT_THAT(std::string(p.status().message()), HasSubstr(c.want)) << c.text;
  }
}

TEST(PlanFileTest, ReadRejectsPlanThatMissesElements) {
  GradientLayout layout = MakeLayout({10, 6, 0});
  Plan p = TwoBuckets();
  p.buckets[0].slices[0].count = 9;
  const std::string path = ::testing::TempDir() + "/plan_bad.json";
  ASSERT_TRUE(WritePlanFile(path, p).ok());
  auto read = ReadPlanFile(path, layout);
  EXPECT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("in no bucket"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace fusebox::bucketing
