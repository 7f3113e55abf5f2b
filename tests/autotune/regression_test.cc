// The regression checks of Note [Catching small regressions]
// (autotune/regression.h): the detector on hand-made pair streams, its pure
// helpers, and its false alarms and power on seeded synthetic runs that
// resample recorded step times (perf/regression_runs.h, the same runs
// fusebox-regression-sim reports).
#include "autotune/regression.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "perf/regression_runs.h"

namespace fusebox::autotune {
namespace {

using ::testing::HasSubstr;

// Gaussian noise from mt19937_64's raw output (Box-Muller): the same numbers
// with every standard library.
class Noise {
 public:
  explicit Noise(uint64_t seed) : gen_(seed) {}
  double Uniform() { return (static_cast<double>(gen_() >> 11) + 0.5) * 0x1.0p-53; }
  double Normal() {
    const double u = Uniform(), v = Uniform();
    return std::sqrt(-2 * std::log(u)) * std::cos(2 * M_PI * v);
  }

 private:
  std::mt19937_64 gen_;
};

// Pairs with log(kept / baseline) = log(ratio) + N(0, sigma), baseline 100 ms
// drifting slowly (paired samples cancel it).
struct Pair {
  double baseline, kept;
};
Pair MakePair(Noise& noise, int i, double ratio, double sigma) {
  const double base = 100e3 * (1 + 0.2 * std::sin(i / 50.0));
  return {base, base * ratio * std::exp(sigma * noise.Normal())};
}

TEST(RegressionCheckTest, CatchesAConstantThreePercentWithinTheStatedPairs) {
  const RegressionOptions options;
  for (double sigma : {0.005, 0.01, 0.03}) {
    const double stated = ExpectedDetectionPairs(options, sigma, 0.03);
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      Noise noise(seed);
      RegressionCheck check(options, sigma);
      int i = 0;
      while (!check.detected() && i < 3 * stated) {
        const Pair p = MakePair(noise, i++, 1.03, sigma);
        check.Add(p.baseline, p.kept);
      }
      EXPECT_TRUE(check.detected()) << "sigma " << sigma << " seed " << seed << ": "
                                    << check.Describe() << "; stated " << stated << " pairs";
      EXPECT_EQ(check.detected_at(), i);
    }
  }
}

TEST(RegressionCheckTest, EqualPlansWithSmallNoiseDoNotAlarm) {
  const RegressionOptions options;
  for (double ratio : {1.0, 0.98, 0.90}) {
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      Noise noise(seed);
      RegressionCheck check(options, 0.01);
      for (int i = 0; i < 500; ++i) {
        const Pair p = MakePair(noise, i, ratio, 0.01);
        check.Add(p.baseline, p.kept);
      }
      EXPECT_FALSE(check.detected())
          << "ratio " << ratio << " seed " << seed << ": " << check.Describe();
      EXPECT_EQ(check.pairs(), 500);
      EXPECT_NEAR(check.sigma(), 0.01, 0.002);
    }
  }
}

TEST(RegressionCheckTest, ASingleFiveTimesSlowerStepDoesNotAlarm) {
  const RegressionOptions options;
  for (double sigma : {0.005, 0.01, 0.05}) {
    // At the start (S = 0) and after 100 quiet pairs, on the kept plan's side.
    for (int at : {0, 100}) {
      Noise noise(7);
      RegressionCheck check(options, sigma);
      for (int i = 0; i < at; ++i) {
        const Pair p = MakePair(noise, i, 1.0, sigma);
        check.Add(p.baseline, p.kept);
      }
      EXPECT_FALSE(check.Add(100e3, 5 * 100e3)) << "sigma " << sigma << " at " << at;
      EXPECT_LT(check.statistic(), check.threshold());
      // The pairs after it show no regression: S falls back.
      for (int i = 0; i < 50; ++i) {
        const Pair p = MakePair(noise, at + 1 + i, 1.0, sigma);
        EXPECT_FALSE(check.Add(p.baseline, p.kept)) << check.Describe();
      }
    }
  }
}

TEST(RegressionCheckTest, DetectionIsSticky) {
  RegressionCheck check(RegressionOptions{}, 0.01);
  int pairs = 0;
  while (!check.detected() && pairs < 100) {
    check.Add(100, 110);  // 10% slower, no noise
    ++pairs;
  }
  ASSERT_TRUE(check.detected());
  const int at = check.detected_at();
  EXPECT_EQ(at, pairs);
  for (int i = 0; i < 200; ++i) EXPECT_TRUE(check.Add(100, 80));  // faster again
  EXPECT_TRUE(check.detected());
  EXPECT_EQ(check.detected_at(), at);
  EXPECT_EQ(check.pairs(), pairs + 200);
  EXPECT_THAT(check.Describe(), HasSubstr("regression detected at pair"));
}

TEST(RegressionCheckTest, IgnoresPairsThatAreNotTimes) {
  RegressionCheck check(RegressionOptions{}, 0.01);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (auto [b, k] : std::vector<std::pair<double, double>>{
           {0, 1}, {1, 0}, {-1, 1}, {nan, 1}, {1, nan}, {inf, 1}, {1, inf}}) {
    EXPECT_FALSE(check.Add(b, k));
  }
  EXPECT_EQ(check.pairs(), 0);
  EXPECT_EQ(check.statistic(), 0);
}

TEST(RegressionCheckTest, WithoutSigmaZeroTheStatisticWaitsForFourPairs) {
  RegressionCheck check(RegressionOptions{}, 0);
  EXPECT_EQ(check.sigma(), 0);
  for (int i = 0; i < 3; ++i) {
    check.Add(100, 200);  // 2x slower: would count at once with a sigma
    EXPECT_EQ(check.statistic(), 0);
  }
  check.Add(100, 200);
  EXPECT_GT(check.sigma(), 0);  // the floor: the four ratios are equal
  check.Add(100, 200);
  EXPECT_GT(check.statistic(), 0);
}

TEST(RegressionCheckTest, SigmaFollowsTheCheckPairsAndIgnoresOutliers) {
  // sigma0 from verification was 0.02; the check pairs show 0.05.
  Noise noise(3);
  RegressionCheck check(RegressionOptions{}, 0.02);
  for (int i = 0; i < 200; ++i) {
    Pair p = MakePair(noise, i, 1.0, 0.05);
    if (i % 50 == 7) p.kept *= 4;       // a checkpoint step on the kept side
    if (i % 50 == 31) p.baseline *= 3;  // an evaluation step on the baseline's
    check.Add(p.baseline, p.kept);
  }
  EXPECT_NEAR(check.sigma(), 0.05, 0.01) << check.Describe();
  EXPECT_FALSE(check.detected());
}

TEST(RegressionCheckTest, NoiseFromPairsIsRobust) {
  Noise noise(11);
  std::vector<double> b, k;
  for (int i = 0; i < 2000; ++i) {
    const Pair p = MakePair(noise, i, 0.95, 0.04);
    b.push_back(p.baseline);
    k.push_back(p.kept);
  }
  const double clean = NoiseFromPairs(b, k);
  EXPECT_NEAR(clean, 0.04, 0.004);
  // One step 1000x slower barely moves it; 5% of the steps 5x slower count
  // as 2.5 sigma each, no more.
  std::vector<double> one = k, many = k;
  one[100] *= 1000;
  for (size_t i = 0; i < many.size(); i += 20) many[i] *= 5;
  EXPECT_NEAR(NoiseFromPairs(b, one), clean, 0.02 * clean);
  EXPECT_GT(NoiseFromPairs(b, many), clean);
  EXPECT_LT(NoiseFromPairs(b, many), 1.25 * clean);
  // Two plans 20% apart in spells (a bimodal machine): the spread counts.
  std::vector<double> spells = k;
  for (size_t i = 0; i < spells.size(); ++i) spells[i] *= (i / 10) % 4 == 0 ? 1.2 : 1.0;
  EXPECT_GT(NoiseFromPairs(b, spells), 1.5 * clean);
  EXPECT_EQ(NoiseFromPairs({1.0}, {1.0}), 0);
  EXPECT_EQ(NoiseFromPairs({1.0, 2.0}, {1.0}), 0);
  EXPECT_EQ(NoiseFromPairs({1.0, -1.0, 3.0}, {1.0, 1.0, 0.0}), 0);  // one valid pair
  EXPECT_EQ(NoiseFromPairs({1.0, 1.0, 1.0}, {2.0, 2.0, 2.0}), 0);   // no spread
}

TEST(RegressionCheckTest, ValidateNamesTheField) {
  EXPECT_TRUE(Validate(RegressionOptions{}).ok());
  auto message = [](RegressionOptions o) { return std::string(Validate(o).message()); };
  RegressionOptions o;
  o.regression = 0;
  EXPECT_THAT(message(o), HasSubstr("regression.regression"));
  o = {};
  o.regression = 1.5;
  EXPECT_THAT(message(o), HasSubstr("regression.regression"));
  o = {};
  o.clip = 0.5;
  EXPECT_THAT(message(o), HasSubstr("regression.clip"));
  o = {};
  o.false_alarm_pairs = 10;
  EXPECT_THAT(message(o), HasSubstr("regression.false_alarm_pairs"));
  o = {};
  o.sigma_floor = 0;
  EXPECT_THAT(message(o), HasSubstr("regression.sigma_floor"));
  o = {};
  o.window = 4;
  EXPECT_THAT(message(o), HasSubstr("regression.window"));
  o = {};
  o.prior_pairs = -1;
  EXPECT_THAT(message(o), HasSubstr("regression.prior_pairs"));
  o = {};
  o.clip = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(Validate(o).ok());
}

TEST(RegressionCheckTest, CheckEveryKeepsTheCostUnderItsShare) {
  EXPECT_EQ(CheckEvery(0, 0.01), kMinCheckEvery);
  EXPECT_EQ(CheckEvery(-0.1, 0.01), kMinCheckEvery);
  EXPECT_EQ(CheckEvery(0.02, 0.01), kMinCheckEvery);
  EXPECT_EQ(CheckEvery(0.05, 0.01), 5);
  EXPECT_EQ(CheckEvery(0.051, 0.01), 6);
  EXPECT_EQ(CheckEvery(0.10, 0.01), 10);
  EXPECT_EQ(CheckEvery(0.30, 0.001), kMaxCheckEvery);
  EXPECT_EQ(CheckEvery(0.10, 0), kMaxCheckEvery);
  EXPECT_EQ(kMinCheckEvery, 5);
  EXPECT_EQ(kMaxCheckEvery, 200);
  for (double gain = 0.001; gain < 0.6; gain *= 1.3) {
    for (double cost : {0.002, 0.005, 0.01, 0.05}) {
      const int every = CheckEvery(gain, cost);
      EXPECT_GE(every, kMinCheckEvery);
      EXPECT_LE(every, kMaxCheckEvery);
      if (every < kMaxCheckEvery) {
        EXPECT_LE(gain / every, cost * (1 + 1e-9)) << gain << " " << cost;
      }
      if (every > kMinCheckEvery) {
        EXPECT_GT(gain / (every - 1), cost) << "not the least interval: " << gain << " " << cost;
      }
    }
  }
}

TEST(RegressionCheckTest, TheStatedDelayMatchesTheNote) {
  const RegressionOptions o;
  // The worked table of Note [Catching small regressions].
  EXPECT_NEAR(ExpectedDetectionPairs(o, 0.01, 0.03), 3.1, 0.05);
  EXPECT_NEAR(ExpectedDetectionPairs(o, 0.02, 0.03), 9.2, 0.05);
  EXPECT_NEAR(ExpectedDetectionPairs(o, 0.05, 0.03), 46.8, 0.5);
  EXPECT_NEAR(ExpectedDetectionPairs(o, 0.10, 0.03), 154.9, 0.5);
  EXPECT_NEAR(ExpectedDetectionPairs(o, 0.20, 0.03), 491.9, 0.5);
  EXPECT_NEAR(RegressionThreshold(o, 0.01), 3.5, 0.05);
  EXPECT_NEAR(RegressionThreshold(o, 0.10), 24.9, 0.05);
  EXPECT_NEAR(RegressionThreshold(o, 0.20), 41.6, 0.05);
  // At least 1 above the clip, so one outlier cannot cross it.
  EXPECT_GE(RegressionThreshold(o, 0.001), o.clip + 1);
  // More noise or a smaller regression: longer; at or below the reference
  // (half the regression): never.
  double last = 0;
  for (double sigma = 0.005; sigma < 0.5; sigma *= 1.5) {
    const double d = ExpectedDetectionPairs(o, sigma, 0.03);
    EXPECT_GT(d, last);
    EXPECT_LT(ExpectedDetectionPairs(o, sigma, 0.06), d);
    last = d;
  }
  EXPECT_TRUE(std::isinf(ExpectedDetectionPairs(o, 0.05, 0.014)));
  EXPECT_TRUE(std::isinf(ExpectedDetectionPairs(o, 0.05, -0.05)));
}

TEST(RegressionCheckTest, RecordedTracesKeepTheirProvenance) {
  std::ifstream in(FUSEBOX_STEP_TRACES);
  ASSERT_TRUE(in) << FUSEBOX_STEP_TRACES;
  const nlohmann::json doc = nlohmann::json::parse(in);
  ASSERT_TRUE(doc.contains("traces"));
  EXPECT_GE(doc["traces"].size(), 20u);
  for (const nlohmann::json& t : doc["traces"]) {
    EXPECT_FALSE(t.value("id", "").empty());
    EXPECT_EQ(t.value("commit", "").size(), 8u) << t.value("id", "");
    ASSERT_TRUE(t.contains("paths") && !t["paths"].empty()) << t.value("id", "");
    EXPECT_GE(t["ms"].size(), 40u) << t.value("id", "");
  }
  auto traces = perf::LoadStepTraces(FUSEBOX_STEP_TRACES);
  ASSERT_TRUE(traces.ok()) << traces.status();
  for (const perf::StepTrace& t : *traces) {
    EXPECT_GT(t.sigma, 0.01) << t.id;
    EXPECT_LT(t.sigma, 0.5) << t.id;
  }
}

// The evaluation that fusebox-regression-sim prints, with its defaults: 1000
// null and 1000 power runs at each gain (0, 2, 5, 10%), each resampling one
// recorded trace; the targets hold at every gain.
TEST(RegressionCheckTest, CatchesThreePercentOnRecordedTraces) {
  auto traces = perf::LoadStepTraces(FUSEBOX_STEP_TRACES);
  ASSERT_TRUE(traces.ok()) << traces.status();
  const perf::RegressionSimOptions options;
  const perf::SimResult r = perf::RunRegressionSim(*traces, options);
  ASSERT_EQ(r.by_gain.size(), 4u);
  for (size_t g = 0; g < r.by_gain.size(); ++g) {
    const perf::SimCell& c = r.by_gain[g];
    EXPECT_EQ(c.null_runs, 1000);
    EXPECT_EQ(c.power_runs, 1000);
    EXPECT_LT(perf::FalseAlarmRate(c), perf::kMaxFalseAlarmRate)
        << "gain " << options.gains[g] << ": " << c.false_alarms << " false alarms";
    EXPECT_GE(perf::Power(c), perf::kMinPower)
        << "gain " << options.gains[g] << ": " << c.detected << " detected in time";
  }
  EXPECT_TRUE(perf::TargetsMet(r)) << perf::MarkdownReport(r, FUSEBOX_STEP_TRACES);
  // The stated delay is the expected one: the median detection comes
  // about then (it is a mean; delays are skewed to the right).
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  for (size_t g = 0; g < r.by_gain.size(); ++g) {
    const perf::SimCell& c = r.by_gain[g];
    const double expected = median(c.expected_steps);
    EXPECT_GT(median(c.delay_steps), 0.5 * expected) << "gain " << options.gains[g];
    EXPECT_LT(median(c.delay_steps), 1.25 * expected) << "gain " << options.gains[g];
  }
}

TEST(RegressionCheckTest, SyntheticRunsAreDeterministic) {
  auto traces = perf::LoadStepTraces(FUSEBOX_STEP_TRACES);
  ASSERT_TRUE(traces.ok()) << traces.status();
  const perf::RegressionSimOptions options;
  for (uint64_t seed : {1, 2, 3}) {
    const perf::RunOutcome a = perf::SimulateRun((*traces)[seed], 0.05, true, seed, options);
    const perf::RunOutcome b = perf::SimulateRun((*traces)[seed], 0.05, true, seed, options);
    EXPECT_EQ(a.pairs, b.pairs);
    EXPECT_EQ(a.alarm_step, b.alarm_step);
    EXPECT_EQ(a.sigma0, b.sigma0);
    EXPECT_EQ(a.expected_steps, b.expected_steps);
    EXPECT_GT(a.pairs, 0);
    EXPECT_EQ(a.check_every, 5);
  }
}

// Note [Checking more often once the gain is gone].
TEST(CheckIntervalTest, FollowsTheGainThePairsShowButNeverExceedsTheVerifiedOne) {
  CheckInterval i(0.2, kMinCheckEvery, 0.01);
  EXPECT_EQ(i.every(), 20);
  // Two pairs are not enough to move it; three that show the gain keep it.
  i.Add(100, 104);
  i.Add(100, 104);
  EXPECT_EQ(i.every(), 20);
  for (int k = 0; k < 3; ++k) i.Add(100, 80);
  EXPECT_EQ(i.every(), 20);
  // A lucky spell (40%) never thins the checks beyond the verified gain.
  for (int k = 0; k < 3; ++k) i.Add(100, 60);
  EXPECT_EQ(i.every(), 20);
  // The gain gone (3% slower): the least interval, once the median of the
  // last three pairs shows it (two of three here).
  i.Add(100, 103);
  EXPECT_EQ(i.every(), 20);
  i.Add(100, 103);
  EXPECT_EQ(i.every(), kMinCheckEvery);
  // A part of the gain back (10%): the interval that gain pays for.
  for (int k = 0; k < 3; ++k) i.Add(100, 90);
  EXPECT_EQ(i.every(), 10);
  // Pairs that are not two positive times are ignored.
  i.Add(0, 103);
  i.Add(100, std::nan(""));
  i.Add(-1, 5);
  EXPECT_EQ(i.every(), 10);
  // The user's check_every is the floor.
  CheckInterval floor(0.2, 12, 0.01);
  for (int k = 0; k < 3; ++k) floor.Add(100, 110);
  EXPECT_EQ(floor.every(), 12);
  // No gain verified: the least interval from the start.
  EXPECT_EQ(CheckInterval(0.0, kMinCheckEvery, 0.01).every(), kMinCheckEvery);
}

}  // namespace
}  // namespace fusebox::autotune
