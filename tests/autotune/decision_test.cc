// The statistics of Note [Decisions under noise] (autotune/decision.h) and
// the online tuner's decisions on synthetic timing streams: the tuner is fed
// fabricated iteration times (a set multiple of the plan's true time, with
// noise) through the policy interface, on a one-rank communicator, so that
// every decision can be replayed over many seeds in milliseconds.
#include "autotune/decision.h"

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autotune/tuner.h"
#include "bucketing/planners.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/run_ranks.h"

namespace fusebox::autotune {
namespace {

TEST(DecisionTest, BinomialTailsAreExact) {
  EXPECT_NEAR(BinomialHalfCdf(8, 0), 1.0 / 256, 1e-12);
  EXPECT_NEAR(BinomialHalfCdf(8, 1), 9.0 / 256, 1e-12);
  EXPECT_NEAR(BinomialHalfCdf(10, 2), 56.0 / 1024, 1e-12);
  EXPECT_DOUBLE_EQ(BinomialHalfCdf(5, 5), 1.0);
  EXPECT_DOUBLE_EQ(BinomialHalfCdf(5, -1), 0.0);
}

TEST(DecisionTest, BoundsAreTheSignTestsOrderStatistics) {
  // 8 values: the one-sided 95% bounds are the 2nd smallest and 2nd largest.
  const std::vector<double> v = {5, 1, 7, 3, 8, 2, 6, 4};
  EXPECT_EQ(MedianLowerBound(v, 0.95), 2);
  EXPECT_EQ(MedianUpperBound(v, 0.95), 7);
  // 5 values: only the extremes reach 95% (1/32 = 3.1%).
  EXPECT_EQ(MedianLowerBound({3, 1, 2, 5, 4}, 0.95), 1);
  EXPECT_EQ(MinimumPairs(0.95), 5);
  const MedianInterval ci = MedianCI({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 0.95);
  EXPECT_EQ(ci.median, 6.5);
  EXPECT_EQ(ci.low, 3);  // P(X <= 2) = 79/4096 = 1.9% <= 2.5% per side
  EXPECT_EQ(ci.high, 10);
  EXPECT_TRUE(ci.exact);
  EXPECT_FALSE(MedianCI({1, 2, 3}, 0.95).exact);
}

TEST(DecisionTest, IntervalCoversTheTrueMedianAtLeastAsOftenAsClaimed) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(0, 0.5);  // median exactly 1
  int covered = 0;
  const int trials = 4000;
  for (int t = 0; t < trials; ++t) {
    std::vector<double> v(15);
    for (double& x : v) x = dist(rng);
    const MedianInterval ci = MedianCI(v, 0.95);
    covered += ci.low <= 1 && 1 <= ci.high;
  }
  EXPECT_GE(covered, 0.94 * trials);
}

TEST(DecisionTest, RandomizedBlocksArePermutationsThatAvoidARepeat) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    std::vector<int> b = RandomizedBlock(5, seed, 3);
    std::vector<int> sorted = b;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3, 4}));
    EXPECT_NE(b[0], 3);
    EXPECT_EQ(RandomizedBlock(5, seed, 3), b);  // same seed, same order on every rank
  }
}

TEST(DecisionTest, ReplaceNeedsTheBoundAboveTheMinimumEffect) {
  SwitchRule rule;
  const std::vector<double> base(8, 100.0);
  std::vector<double> faster = {90, 91, 89, 92, 90, 88, 91, 90};
  Verdict v = DecideReplace(base, faster, rule);
  EXPECT_TRUE(v.replace) << v.why;
  EXPECT_NEAR(v.gain, 0.10, 0.011);
  // One pair against it is tolerated (8 pairs: the 2nd smallest gain);
  // two are not.
  faster[0] = 101;
  EXPECT_TRUE(DecideReplace(base, faster, rule).replace);
  faster[1] = 101;
  v = DecideReplace(base, faster, rule);
  EXPECT_FALSE(v.replace);
  EXPECT_THAT(v.why, ::testing::HasSubstr("not above the minimum effect"));
  // A consistent 1% gain is below the 2% minimum effect.
  EXPECT_FALSE(DecideReplace(base, std::vector<double>(8, 99.0), rule).replace);
  EXPECT_FALSE(DecideReplace({100, 100}, {50, 50}, rule).replace);  // too few pairs
  EXPECT_TRUE(ProvenSlower(base, std::vector<double>(8, 110.0), rule));
  EXPECT_FALSE(ProvenSlower(base, std::vector<double>(8, 101.0), rule));
}

// The tuner on a synthetic stream: plan -> true iteration time (by name;
// every other plan takes `base_us`), lognormal noise of `cv`, and a slow
// drift of the machine shared by every plan.
class SyntheticRun {
 public:
  explicit SyntheticRun(comm::Communicator& comm) : comm_(comm) {
    std::vector<bucketing::TensorSpec> specs;
    for (int i = 0; i < 40; ++i) {
      specs.push_back({absl::StrCat("t", i), int64_t{1} << 18, comm::DataType::kFloat32});
    }
    layout_ = *bucketing::GradientLayout::Create(std::move(specs));
  }

  struct Outcome {
    std::string chosen;
    int tuning_iterations = 0;
    int fallbacks = 0;
    int after_degrade = -1;  // iterations from the degradation to the fallback
  };

  // Runs until tuned, then `extra` iterations; from `degrade_at` (counted
  // after tuning) on, the chosen plan costs `degrade` times its time.
  Outcome Run(uint64_t seed, const std::map<std::string, double>& speed, double cv, int extra = 0,
              int degrade_at = -1, double degrade = 1.0) {
    TunerOptions o;
    o.seed = seed;
    o.candidates = 2;
    CostModel m;
    m.name = "synthetic";
    m.ranks_per_node = 64;
    m.intra_busbw_gbps = m.inter_busbw_gbps = 2;
    m.simple = ProtocolLatency{20, 10, 10, 10};
    o.cost_model = m;
    o.check_every = 5;
    o.check_pairs = 8;
    auto tuner = OnlineTuner::Create(comm_, layout_, o, absl::Seconds(10));
    EXPECT_TRUE(tuner.ok()) << tuner.status();
    std::mt19937_64 rng(seed * 7919 + 1);
    std::normal_distribution<double> noise(0, cv);
    bucketing::Plan current = (*tuner)->initial_plan();
    std::string chosen_name;
    Outcome out;
    double drift = 1.0;
    for (int it = 0; it < 400; ++it) {
      const bool tuned = (*tuner)->phase() == TunerPhase::kTuned;
      if (tuned && chosen_name.empty()) {
        chosen_name = current.name;
        out.tuning_iterations = (*tuner)->tuning_iterations();
        out.chosen = (*tuner)->chosen() >= 0 ? (*tuner)->measured()[(*tuner)->chosen()].name : "";
      }
      const int after = tuned ? it - out.tuning_iterations : -1;
      if (tuned && after > extra) break;
      drift *= std::exp(0.002 * noise(rng) / cv);  // slow random walk
      double t = 1000.0;
      if (auto f = speed.find(current.name); f != speed.end()) t *= f->second;
      if (degrade_at >= 0 && after >= degrade_at && current.name == chosen_name &&
          chosen_name != "ddp") {
        t *= degrade;
      }
      bucketing::IterationStats st;
      st.start_us = 0;
      st.next_start_us = t * drift * std::exp(noise(rng));
      st.backward_end_us = 0.6 * st.next_start_us;
      st.ready_us.assign(layout_.size(), 0);
      for (int id = 0; id < layout_.size(); ++id) st.ready_us[id] = 15.0 * id;
      auto next = (*tuner)->OnIterationEnd(st, current);
      EXPECT_TRUE(next.ok()) << next.status();
      if (next.ok() && next->has_value()) current = **next;
      if ((*tuner)->fallbacks() > 0 && out.after_degrade < 0 && degrade_at >= 0) {
        out.after_degrade = after - degrade_at;
      }
    }
    out.fallbacks = (*tuner)->fallbacks();
    return out;
  }

 private:
  comm::Communicator& comm_;
  bucketing::GradientLayout layout_;
};

void OnOneRank(const std::function<void(comm::Communicator&)>& fn) {
  fusebox::testing::RunRanks(1, [&](int, comm::Communicator& comm) { fn(comm); });
}

TEST(TunerDecisionTest, EqualPlansRarelyReplaceTheDefault) {
  OnOneRank([](comm::Communicator& comm) {
    SyntheticRun run(comm);
    int switched = 0, total = 0;
    for (uint64_t seed = 1; seed <= 200; ++seed) {
      const SyntheticRun::Outcome o = run.Run(seed, {}, 0.05);
      EXPECT_LE(o.tuning_iterations, 40) << "seed " << seed;
      switched += o.chosen != "ddp";
      ++total;
    }
    // The rule's level is 5%; with the minimum effect it is far lower.
    EXPECT_LE(switched, total / 20) << switched << " of " << total << " runs switched";
  });
}

TEST(TunerDecisionTest, ATenPercentFasterCapIsFound) {
  OnOneRank([](comm::Communicator& comm) {
    SyntheticRun run(comm);
    int found = 0;
    for (uint64_t seed = 1; seed <= 100; ++seed) {
      const SyntheticRun::Outcome o = run.Run(seed, {{"ddp-cap1mb", 0.9}}, 0.03);
      found += o.chosen == "ddp-cap1mb";
      EXPECT_LE(o.tuning_iterations, 40);
    }
    EXPECT_GE(found, 90) << "found in " << found << " of 100 runs";
  });
}

TEST(TunerDecisionTest, APlanThatDegradesAfterTheDecisionIsDropped) {
  OnOneRank([](comm::Communicator& comm) {
    SyntheticRun run(comm);
    // check_every 5, 8 pairs: a window is 8 * 6 = 48 iterations; a
    // degradation may start mid-window, so two windows at most.
    const int window = 2 * 8 * 6;
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      const SyntheticRun::Outcome o =
          run.Run(seed, {{"ddp-cap1mb", 0.8}}, 0.03, /*extra=*/150, /*degrade_at=*/10, 1.5);
      ASSERT_EQ(o.chosen, "ddp-cap1mb") << "seed " << seed;
      EXPECT_EQ(o.fallbacks, 1) << "seed " << seed;
      EXPECT_GE(o.after_degrade, 0);
      EXPECT_LE(o.after_degrade, window) << "seed " << seed;
    }
    // Without the degradation, no fallback.
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      EXPECT_EQ(run.Run(seed, {{"ddp-cap1mb", 0.8}}, 0.03, 150).fallbacks, 0) << "seed " << seed;
    }
  });
}

}  // namespace
}  // namespace fusebox::autotune
