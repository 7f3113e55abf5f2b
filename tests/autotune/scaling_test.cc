// Scaling predictions (autotune/scaling.h): the invariants any weak-scaling
// model must keep, for every shipped profile and preset.
#include "autotune/scaling.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "autotune/cost_model.h"
#include "autotune/models.h"
#include "autotune/simulator.h"
#include "bucketing/planners.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fusebox::autotune {
namespace {

using ::testing::HasSubstr;

const std::vector<int> kWorlds = {1, 2, 8, 64, 512, 4096};

ScalingOptions EightPerNode() {
  ScalingOptions o;
  o.planner.sim.ranks_per_node = 8;
  o.batch_per_rank = 32;
  return o;
}

// (world, plan) -> point
std::map<std::pair<int, std::string>, ScalingPoint> ByKey(const std::vector<ScalingPoint>& v) {
  std::map<std::pair<int, std::string>, ScalingPoint> m;
  for (const ScalingPoint& p : v) m[{p.world, p.plan}] = p;
  return m;
}

class ScalingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ScalingTest, EfficiencyAtMostOneAndTunedNeverBehindABaseline) {
  auto profile = GenerateModelProfile(GetParam());
  ASSERT_TRUE(profile.ok());
  for (const std::string& preset : PresetNames()) {
    auto cost = PresetCostModel(preset);
    ASSERT_TRUE(cost.ok());
    auto points = PredictScaling(*profile, *cost, kWorlds, EightPerNode());
    ASSERT_TRUE(points.ok()) << points.status();
    ASSERT_EQ(points->size(), kWorlds.size() * (1 + BaselineNames().size()));
    auto m = ByKey(*points);
    for (int world : kWorlds) {
      const ScalingPoint& tuned = m.at({world, "tuned"});
      EXPECT_EQ(tuned.nodes, (world + 7) / 8);
      for (const std::string& plan : BaselineNames()) {
        const ScalingPoint& b = m.at({world, plan});
        EXPECT_LE(b.efficiency, 1.0 + 1e-12) << preset << " " << world << " " << plan;
        EXPECT_GT(b.efficiency, 0.0);
        EXPECT_LE(tuned.iteration_us, b.iteration_us * (1 + 1e-9))
            << GetParam() << " " << preset << " world " << world << ": tuned behind " << plan;
        EXPECT_NEAR(b.throughput, world * 32 / (b.iteration_us / 1e6), 1e-6 * b.throughput);
      }
      EXPECT_LE(tuned.efficiency, 1.0 + 1e-12);
      EXPECT_GE(tuned.iteration_us, tuned.lower_bound_us * (1 - 1e-9));
    }
  }
}

TEST_P(ScalingTest, MoreBandwidthNeverHurts) {
  auto profile = GenerateModelProfile(GetParam());
  ASSERT_TRUE(profile.ok());
  for (const char* preset : {"ib-400g", "25gbe"}) {
    auto cost = PresetCostModel(preset);
    ASSERT_TRUE(cost.ok());
    auto slow = ByKey(*PredictScaling(*profile, cost->Scaled(1.0, 2.0), kWorlds, EightPerNode()));
    auto base = ByKey(*PredictScaling(*profile, *cost, kWorlds, EightPerNode()));
    auto fast = ByKey(*PredictScaling(*profile, cost->Scaled(1.0, 0.5), kWorlds, EightPerNode()));
    for (const auto& [key, p] : base) {
      EXPECT_LE(p.iteration_us, slow.at(key).iteration_us * (1 + 1e-9))
          << preset << " world " << key.first << " " << key.second;
      EXPECT_LE(fast.at(key).iteration_us, p.iteration_us * (1 + 1e-9))
          << preset << " world " << key.first << " " << key.second;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryShippedProfile, ScalingTest, ::testing::ValuesIn(ModelNames()));

TEST(ScalingWorldOneTest, EqualsTheComputeTime) {
  auto profile = GenerateModelProfile("bert_large");
  auto cost = PresetCostModel("25gbe");
  ASSERT_TRUE(profile.ok() && cost.ok());
  auto points = PredictScaling(*profile, *cost, {1}, EightPerNode());
  ASSERT_TRUE(points.ok());
  const double compute = profile->forward_us + profile->backward_us;
  for (const ScalingPoint& p : *points) {
    EXPECT_EQ(p.iteration_us, compute) << p.plan;
    EXPECT_EQ(p.exposed_us, 0) << p.plan;
    EXPECT_EQ(p.efficiency, 1.0) << p.plan;
  }
  // The simulator agrees: at world size 1 allreduce costs nothing, so with
  // gradients in place every plan takes the compute time.
  SimOptions so;
  so.world_size = 1;
  auto layout = LayoutFromProfile(*profile);
  ASSERT_TRUE(layout.ok());
  for (const bucketing::Plan& plan : {bucketing::DdpPlan(*layout), bucketing::PerTensorPlan(*layout)}) {
    auto sim = Simulate(*profile, plan, *cost, so);
    ASSERT_TRUE(sim.ok()) << sim.status();
    EXPECT_NEAR(sim->iteration_us, compute, 1e-6 * compute) << plan.name;
  }
}

TEST(ScalingOutputTest, CsvAndJsonCarryEveryPoint) {
  auto profile = GenerateModelProfile("resnet50");
  auto cost = PresetCostModel("ib-400g");
  ASSERT_TRUE(profile.ok() && cost.ok());
  profile->model = "resnet,50";  // a comma must be quoted in CSV
  auto points = PredictScaling(*profile, *cost, {1, 64}, EightPerNode());
  ASSERT_TRUE(points.ok());
  const std::string csv = ScalingCsv(*points);
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), points->size() + 1);
  EXPECT_EQ(lines[0],
            "model,network,plan,world,nodes,buckets,compute_ms,iteration_ms,exposed_ms,"
            "lower_bound_ms,efficiency,throughput");
  EXPECT_THAT(lines[1], ::testing::StartsWith("\"resnet,50\",ib-400g,tuned,1,1,0,"));
  auto json = nlohmann::json::parse(ScalingJson(*points));
  ASSERT_EQ(json.size(), points->size());
  for (size_t i = 0; i < points->size(); ++i) {
    EXPECT_EQ(json[i]["plan"], (*points)[i].plan);
    EXPECT_EQ(json[i]["world"], (*points)[i].world);
    EXPECT_DOUBLE_EQ(json[i]["iteration_ms"].get<double>(), (*points)[i].iteration_us / 1e3);
    EXPECT_DOUBLE_EQ(json[i]["efficiency"].get<double>(), (*points)[i].efficiency);
  }
}

TEST(ScalingInputTest, BadInputIsNamed) {
  auto profile = GenerateModelProfile("resnet50");
  auto cost = PresetCostModel("ib-400g");
  ASSERT_TRUE(profile.ok() && cost.ok());
  auto zero = PredictScaling(*profile, *cost, {8, 0}, EightPerNode());
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(std::string(zero.status().message()), HasSubstr("world size 0"));
  EXPECT_FALSE(PredictScaling(*profile, *cost, {}, EightPerNode()).ok());
  ScalingOptions o = EightPerNode();
  o.batch_per_rank = 0;
  auto batch = PredictScaling(*profile, *cost, {8}, o);
  ASSERT_FALSE(batch.ok());
  EXPECT_THAT(std::string(batch.status().message()), HasSubstr("batch per rank"));
}

}  // namespace
}  // namespace fusebox::autotune
