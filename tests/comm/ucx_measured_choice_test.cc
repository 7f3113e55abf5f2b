// The UCX backend's measured choice (comm/ucx/measured_choice.h, Note
// [Measured choice]): the trial's schedule is the same on every rank, rank 0
// decides for what its timings say, every rank applies its announcements
// alike, and over real UCX every call of a measured class is exact and every
// rank ends with the same choice.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "comm/options.h"
#include "comm/ucx/algorithms.h"
#include "comm/ucx/measured_choice.h"
#include "gtest/gtest.h"
#include "tests/common/run_ranks_ucx.h"

namespace fusebox::comm::ucx {
namespace {

constexpr Algorithm kRd = Algorithm::kRecursiveDoublingAllReduce;
constexpr Algorithm kRab = Algorithm::kRabenseifnerAllReduce;
constexpr Algorithm kLinear = Algorithm::kLinearAllReduce;
constexpr Algorithm kRing = Algorithm::kRingAllReduce;

std::vector<AlgorithmTable::MeasuredClass> TwoClasses() {
  return {{4096, 8192, {kRd, kRab, kLinear}}, {8192, 16384, {kRd, kRab}}};
}

// Runs calls of `bytes` on rank 0 and another rank in step: each call's
// round carries rank 0's announcement to both, and rank 0 records a time
// of cost(algorithm) for it, every call following the last one back to
// back. Returns the algorithms rank 0 ran (the other rank's are checked
// equal as they go). `stop`, where given, ends the calls early once it
// holds after one.
std::vector<Algorithm> RunInStep(MeasuredChoice& zero, MeasuredChoice& other, size_t bytes,
                                 int calls, const std::map<Algorithm, double>& cost_us,
                                 absl::Time* clock, const std::function<bool()>& stop = nullptr) {
  std::vector<Algorithm> ran;
  for (int i = 0; i < calls && (stop == nullptr || !stop()); ++i) {
    const std::optional<MeasuredChoice::Pick> a = zero.Next(bytes);
    const std::optional<MeasuredChoice::Pick> b = other.Next(bytes);
    EXPECT_EQ(a.has_value(), b.has_value()) << "call " << i;
    if (a.has_value() && b.has_value()) {
      EXPECT_EQ(a->algorithm, b->algorithm) << "call " << i;
    }
    const uint8_t pad = zero.TakeAnnouncement();
    EXPECT_EQ(other.TakeAnnouncement(), 0) << "only rank 0 announces";
    EXPECT_TRUE(zero.Apply(pad).ok());
    EXPECT_TRUE(other.Apply(pad).ok());
    const Algorithm alg = a.has_value() ? a->algorithm : Algorithm::kNone;
    const absl::Time start = *clock;
    *clock += absl::Microseconds(cost_us.count(alg) ? cost_us.at(alg) : 100.0);
    zero.Record(a, start, *clock);
    ran.push_back(alg);
  }
  return ran;
}

// One call of `bytes` on both ranks: rank 0's pick, its announcement
// applied on both (as the call's round does).
std::optional<MeasuredChoice::Pick> NextInStep(MeasuredChoice& zero, MeasuredChoice& other,
                                               size_t bytes) {
  const std::optional<MeasuredChoice::Pick> a = zero.Next(bytes);
  other.Next(bytes);
  const uint8_t pad = zero.TakeAnnouncement();
  EXPECT_TRUE(zero.Apply(pad).ok());
  EXPECT_TRUE(other.Apply(pad).ok());
  return a;
}

TEST(MeasuredChoiceTest, WarmsUpThenRotatesBlocksThenRunsTheCheapestOnEveryRank) {
  MeasuredChoice zero(TwoClasses(), /*decides=*/true), other(TwoClasses(), /*decides=*/false);
  absl::Time clock = absl::UnixEpoch();
  const std::map<Algorithm, double> cost = {{kRd, 100}, {kRab, 120}, {kLinear, 80}};
  const std::vector<Algorithm> ran = RunInStep(zero, other, 5000, 200, cost, &clock);
  // The table's choice first, untimed.
  for (int i = 0; i < kTrialWarmCalls; ++i) EXPECT_EQ(ran[i], Algorithm::kNone) << i;
  // Then a block of each candidate in the class's order.
  for (int i = 0; i < 3 * kTrialBlock; ++i) {
    EXPECT_EQ(ran[kTrialWarmCalls + i],
              (std::vector<Algorithm>{kRd, kRab, kLinear})[i / kTrialBlock])
        << "trial call " << i;
  }
  // Decided for the linear round on both ranks, which run nothing else at the end.
  EXPECT_EQ(zero.decided(0), 2);
  EXPECT_EQ(other.decided(0), 2);
  EXPECT_EQ(zero.decided(1), -1) << "the other class saw no call";
  for (int i = 150; i < 200; ++i) EXPECT_EQ(ran[i], kLinear) << i;
  EXPECT_TRUE(absl::StrContains(zero.Describe(), "(4096, 8192] B: linear (rank 0, mean per call:"))
      << zero.Describe();
  EXPECT_EQ(other.Describe(), "(4096, 8192] B: linear");
}

// The linear round at 4x is dropped on the first kTrialEarlyDrop samples of
// its block, before it settles: it costs a few calls, not a block.
TEST(MeasuredChoiceTest, ACandidateFarDearerIsDroppedBeforeItsBlockSettles) {
  MeasuredChoice zero(TwoClasses(), true), other(TwoClasses(), false);
  absl::Time clock = absl::UnixEpoch();
  const std::map<Algorithm, double> cost = {{kRd, 100}, {kRab, 110}, {kLinear, 400}};
  const std::vector<Algorithm> ran = RunInStep(zero, other, 6000, 200, cost, &clock);
  EXPECT_FALSE(zero.live(0, 2));
  EXPECT_FALSE(other.live(0, 2));
  // Its block's first call is no sample; the drop is queued on the
  // kTrialEarlyDrop-th sample and applied after the next call.
  const int linear = std::count(ran.begin(), ran.end(), kLinear);
  EXPECT_EQ(linear, kTrialEarlyDrop + 2);
  EXPECT_EQ(zero.decided(0), 0);
  EXPECT_EQ(other.decided(0), 0);
  EXPECT_EQ(ran.back(), kRd);
  EXPECT_TRUE(absl::StrContains(zero.Describe(), "linear 400 us (dropped)")) << zero.Describe();
}

// A candidate close to the cheapest is not dropped early: the linear round
// at 1.4x is run to the end of its block, and decided against.
TEST(MeasuredChoiceTest, ACandidateWithinTheRatioRunsItsWholeBlock) {
  MeasuredChoice zero(TwoClasses(), true), other(TwoClasses(), false);
  absl::Time clock = absl::UnixEpoch();
  const std::map<Algorithm, double> cost = {{kRd, 100}, {kRab, 110}, {kLinear, 140}};
  const std::vector<Algorithm> ran = RunInStep(zero, other, 6000, 200, cost, &clock);
  EXPECT_EQ(std::count(ran.begin(), ran.end(), kLinear), kTrialBlock);
  EXPECT_EQ(zero.decided(0), 0);
  EXPECT_EQ(other.decided(0), 0);
}

// The decision is taken with the last settled sample and announced before
// the drop taken with it: the class runs one more trial call (a new block
// of the first candidate) and the choice from the call after.
TEST(MeasuredChoiceTest, TheDecisionIsAnnouncedBeforeItsDropsOnTheNextCall) {
  MeasuredChoice zero(TwoClasses(), true), other(TwoClasses(), false);
  absl::Time clock = absl::UnixEpoch();
  const std::map<Algorithm, double> cost = {{kRd, 300}, {kRab, 100}};
  const int first_round = kTrialWarmCalls + 2 * kTrialBlock;
  const std::vector<Algorithm> ran = RunInStep(zero, other, 10000, first_round + 4, cost, &clock);
  EXPECT_EQ(zero.decided(1), 1);
  EXPECT_EQ(other.decided(1), 1);
  EXPECT_FALSE(other.live(1, 0)) << "recursive doubling, at 3x, is dropped after the decision";
  EXPECT_EQ(ran[first_round], kRd);
  for (int i = first_round + 1; i < first_round + 4; ++i) EXPECT_EQ(ran[i], kRab) << i;
  EXPECT_EQ(std::count(ran.begin(), ran.end(), kRd), kTrialBlock + 1);
}

// Rank 0's link as a token bucket (tc tbf): `rate` bytes per us, a burst
// of `burst` bytes. A call of an algorithm takes its latency, or longer
// where the bytes it sends through rank 0's link exceed the tokens: the
// rest go at the rate. Tokens come back at the rate while the call runs.
struct TokenBucketLink {
  double rate = 125;  // 1 Gbit
  double burst = 262144;
  double tokens = 262144;
  double Call(double latency_us, double bytes) {
    const double short_of = std::max(0.0, bytes - tokens);
    const double t = std::max(latency_us, short_of / rate);
    tokens = std::min(burst, tokens - bytes + t * rate);
    return t;
  }
};

// On a shaped link, a candidate that sends more bytes runs at the burst's
// speed for its first calls and at the rate once it has drained the
// bucket. The linear round here sends 7 x 8 KiB through rank 0's link a
// call (8 ranks): 250 us while tokens last, 459 us at 1 Gbit once they are
// gone. Recursive doubling sends 3 x 8 KiB in 420 us, under the rate. Only
// settled samples show that recursive doubling is the cheaper: the mean of
// the linear round's whole block is about 390 us, and blocks of 6 calls in
// turn saw 250.
TEST(MeasuredChoiceTest, ACandidateIsJudgedOnceTheLinksBurstIsSpent) {
  const std::vector<AlgorithmTable::MeasuredClass> classes = {{4096, 8192, {kRd, kLinear}}};
  MeasuredChoice zero(classes, true), other(classes, false);
  TokenBucketLink link;
  absl::Time clock = absl::UnixEpoch();
  std::vector<double> linear_us;
  for (int i = 0; i < 200; ++i) {
    const std::optional<MeasuredChoice::Pick> a = NextInStep(zero, other, 8192);
    const bool linear = a.has_value() && a->algorithm == kLinear;
    const double us = linear ? link.Call(250, 7 * 8192) : link.Call(420, 3 * 8192);
    if (linear) linear_us.push_back(us);
    const absl::Time start = clock;
    clock += absl::Microseconds(us);
    zero.Record(a, start, clock);
  }
  ASSERT_GE(linear_us.size(), static_cast<size_t>(kTrialBlock));
  EXPECT_LT(linear_us[1], 300) << "the burst flatters the linear round's first calls";
  EXPECT_GT(linear_us[kTrialBlock - 1], 450) << "and no longer at the block's end";
  EXPECT_EQ(zero.decided(0), 0) << zero.Describe();
  EXPECT_EQ(other.decided(0), 0);
  // Judged on its settled calls, within the ratio: not dropped.
  EXPECT_TRUE(absl::StrContains(zero.Describe(), "recursive-doubling 420 us, linear 459 us)"))
      << zero.Describe();
}

// A call is timed from the end of the one before it where that was the
// previous call of its block: where ranks share cores, rank 0's own round
// can be short while the loop is long (it arrives last and finds its
// peers' messages waiting). Here recursive doubling's rounds take 10 us but
// its calls come 200 us apart; Rabenseifner's take 150 us, back to back.
TEST(MeasuredChoiceTest, CallsBackToBackAreTimedFromTheEndOfTheLast) {
  MeasuredChoice zero(TwoClasses(), true), other(TwoClasses(), false);
  absl::Time clock = absl::UnixEpoch();
  for (int i = 0; i < 200 && zero.decided(1) < 0; ++i) {
    const std::optional<MeasuredChoice::Pick> a = NextInStep(zero, other, 12000);
    const bool rd = a.has_value() && a->algorithm == kRd;
    clock += absl::Microseconds(rd ? 190 : 0);  // rank 0 away between calls
    const absl::Time start = clock;
    clock += absl::Microseconds(rd ? 10 : 150);
    zero.Record(a, start, clock);
  }
  EXPECT_EQ(zero.decided(1), 1) << zero.Describe();
}

// Another collective between two calls of a block (any kind: Record with
// no pick) makes the second call timed from its own start. Here one of 1 ms
// runs before every recursive-doubling call (whose own round takes 10 us);
// Rabenseifner's calls come back to back at 150 us. Timed from the last
// call's end, recursive doubling would cost 1010 us and lose.
TEST(MeasuredChoiceTest, ACollectiveBetweenCallsMakesTheNextTimedFromItsStart) {
  MeasuredChoice zero(TwoClasses(), true), other(TwoClasses(), false);
  absl::Time clock = absl::UnixEpoch();
  for (int i = 0; i < 200 && zero.decided(1) < 0; ++i) {
    const std::optional<MeasuredChoice::Pick> a = NextInStep(zero, other, 12000);
    const bool rd = a.has_value() && a->algorithm == kRd;
    if (rd) {
      const absl::Time before = clock;
      clock += absl::Milliseconds(1);
      zero.Record(std::nullopt, before, clock);
    }
    const absl::Time start = clock;
    clock += absl::Microseconds(rd ? 10 : 150);
    zero.Record(a, start, clock);
  }
  EXPECT_EQ(zero.decided(1), 0) << zero.Describe();
}

TEST(MeasuredChoiceTest, AnnouncementsThisRankCannotApplyAreDataLoss) {
  MeasuredChoice m(TwoClasses(), false);
  EXPECT_TRUE(m.Apply(0).ok());
  // No announcement bit.
  EXPECT_EQ(m.Apply(0x01).code(), absl::StatusCode::kDataLoss);
  // Class 2 of 2.
  EXPECT_EQ(m.Apply(0x80 | (2 << 2)).code(), absl::StatusCode::kDataLoss);
  // Candidate 2 of class 1's two.
  EXPECT_EQ(m.Apply(0x80 | (1 << 2) | 2).code(), absl::StatusCode::kDataLoss);
  // Dropping class 1's candidates one by one: the last is refused.
  EXPECT_TRUE(m.Apply(0x80 | 0x40 | (1 << 2) | 0).ok());
  EXPECT_EQ(m.Apply(0x80 | 0x40 | (1 << 2) | 1).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(m.Apply(0x80 | (1 << 2) | 1).ok());
  EXPECT_EQ(m.decided(1), 1);
  // A choice of the dropped candidate.
  EXPECT_EQ(m.Apply(0x80 | (1 << 2) | 0).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(m.decided(1), 1);
}

// Note [Watching the choice]. Decided for recursive doubling (100 us a call
// against Rabenseifner's 120; the linear round dropped), which then slows to
// 400 us: rank 0 switches the class to Rabenseifner after the decision's
// settling calls and two dear windows, and every rank runs it from the call
// after the announcement.
TEST(MeasuredChoiceTest, AChoiceThatBecomesDearIsLeftForTheNextCheapest) {
  MeasuredChoice zero(TwoClasses(), true), other(TwoClasses(), false);
  absl::Time clock = absl::UnixEpoch();
  RunInStep(zero, other, 5000, 1000, {{kRd, 100}, {kRab, 120}, {kLinear, 200}}, &clock,
            [&] { return zero.decided(0) >= 0; });
  ASSERT_EQ(zero.decided(0), 0) << zero.Describe();
  const std::vector<Algorithm> ran =
      RunInStep(zero, other, 5000, 200, {{kRd, 400}, {kRab, 120}, {kLinear, 200}}, &clock);
  EXPECT_EQ(zero.decided(0), 1) << zero.Describe();
  EXPECT_EQ(other.decided(0), 1);
  EXPECT_EQ(zero.switches(0), 1);
  EXPECT_EQ(other.switches(0), 1);
  // Settling, the dear windows, whose last call queues the switch, and the
  // call that carries it.
  const int watched = kTrialSettle + kWatchDearWindows * kWatchWindow + 1;
  EXPECT_EQ(std::count(ran.begin(), ran.end(), kRd), watched);
  for (size_t i = watched; i < ran.size(); ++i) EXPECT_EQ(ran[i], kRab) << i;
  EXPECT_TRUE(absl::StrContains(zero.Describe(), "(4096, 8192] B: rabenseifner (rank 0"))
      << zero.Describe();
  EXPECT_TRUE(
      absl::StrContains(zero.Describe(), "(dropped)) (left in use: recursive-doubling 400 us)"))
      << zero.Describe();
  EXPECT_EQ(other.Describe(), "(4096, 8192] B: rabenseifner");
}

// A choice that slows by less than kSwitchRatio over the next cheapest's
// cost is kept, and so is one with a dear window between cheap ones; two
// dear windows in a row switch it, stalls counted in full.
TEST(MeasuredChoiceTest, AChoiceIsLeftOnlyForDearWindowsInARow) {
  MeasuredChoice zero(TwoClasses(), true), other(TwoClasses(), false);
  absl::Time clock = absl::UnixEpoch();
  RunInStep(zero, other, 5000, 1000, {{kRd, 100}, {kRab, 120}, {kLinear, 200}}, &clock,
            [&] { return zero.decided(0) >= 0; });
  ASSERT_EQ(zero.decided(0), 0) << zero.Describe();
  // Settling and four windows at 170 (< 1.5 x 120), so that the calls below
  // begin a window.
  RunInStep(zero, other, 5000, kTrialSettle + 4 * kWatchWindow,
            {{kRd, 170}, {kRab, 120}, {kLinear, 200}}, &clock);
  EXPECT_EQ(zero.decided(0), 0) << zero.Describe();
  // Windows at 100 us a call but for one stalled for 10 ms, each dear
  // window followed by a cheap one.
  const auto window = [&](bool stalled) {
    for (int i = 0; i < kWatchWindow; ++i) {
      const std::optional<MeasuredChoice::Pick> a = NextInStep(zero, other, 5000);
      const absl::Time start = clock;
      clock += absl::Microseconds(stalled && i == 7 ? 10000 : 100);
      zero.Record(a, start, clock);
    }
  };
  for (int k = 0; k < 5; ++k) {
    window(/*stalled=*/true);
    window(/*stalled=*/false);
  }
  EXPECT_EQ(zero.decided(0), 0) << zero.Describe();
  EXPECT_EQ(zero.switches(0), 0);
  // Two in a row.
  window(true);
  window(true);
  NextInStep(zero, other, 5000);  // carries the switch
  EXPECT_EQ(zero.decided(0), 1) << zero.Describe();
  EXPECT_EQ(other.decided(0), 1);
  // (31 x 100 + 10000) / 32.
  EXPECT_TRUE(absl::StrContains(zero.Describe(), "(left in use: recursive-doubling 409 us)"))
      << zero.Describe();
}

// A slowdown every candidate shares does not switch: here one call in 16
// stalls for 5 ms whatever runs, which the trial's costs (less the largest
// sample) count half and the windows count in full.
TEST(MeasuredChoiceTest, AStallEveryCandidateSharesDoesNotSwitch) {
  MeasuredChoice zero(TwoClasses(), true), other(TwoClasses(), false);
  absl::Time clock = absl::UnixEpoch();
  for (int i = 1; i <= 2000; ++i) {
    const std::optional<MeasuredChoice::Pick> a = NextInStep(zero, other, 10000);
    const bool rd = a.has_value() && a->algorithm == kRd;
    const absl::Time start = clock;
    clock += absl::Microseconds(i % 16 == 0 ? 5000 : (rd ? 100 : 130));
    zero.Record(a, start, clock);
  }
  EXPECT_EQ(zero.decided(1), 0) << zero.Describe();
  EXPECT_EQ(zero.switches(1), 0) << zero.Describe();
}

// The call that carries a switch was picked before it and ran the candidate
// left; its time is not the new candidate's. Here Rabenseifner, switched to
// at once, is dear from its first call: it is left at exactly its own cost.
TEST(MeasuredChoiceTest, TheCallCarryingASwitchIsNotTheNewCandidatesSample) {
  MeasuredChoice zero(TwoClasses(), true), other(TwoClasses(), false);
  absl::Time clock = absl::UnixEpoch();
  const auto decided = [&](int candidate) {
    return [&, candidate] { return zero.decided(1) == candidate; };
  };
  RunInStep(zero, other, 10000, 1000, {{kRd, 100}, {kRab, 120}}, &clock, decided(0));
  RunInStep(zero, other, 10000, 1000, {{kRd, 400}, {kRab, 1000}}, &clock, decided(1));
  ASSERT_EQ(zero.decided(1), 1) << zero.Describe();
  RunInStep(zero, other, 10000, 1000, {{kRd, 400}, {kRab, 1000}}, &clock, decided(0));
  EXPECT_EQ(zero.switches(1), 2);
  EXPECT_TRUE(absl::StrContains(zero.Describe(),
                                " (left in use: recursive-doubling 400 us, rabenseifner 1000 us)"))
      << zero.Describe();
}

// A switch queued behind other announcements (one rides each collective)
// is the only one: the calls until it arrives are not watched.
TEST(MeasuredChoiceTest, CallsBeforeAQueuedSwitchArrivesQueueNoOther) {
  MeasuredChoice zero(TwoClasses(), true), other(TwoClasses(), false);
  absl::Time clock = absl::UnixEpoch();
  RunInStep(zero, other, 10000, 1000, {{kRd, 100}, {kRab, 120}}, &clock,
            [&] { return zero.decided(1) >= 0; });
  ASSERT_EQ(zero.decided(1), 0) << zero.Describe();
  // Rank 0 runs on without taking its announcements (as if other
  // announcements were ahead) long enough for three more dear windows.
  for (int i = 0; i < kTrialSettle + 5 * kWatchWindow; ++i) {
    const std::optional<MeasuredChoice::Pick> a = zero.Next(10000);
    other.Next(10000);
    const absl::Time start = clock;
    clock += absl::Microseconds(400);
    zero.Record(a, start, clock);
  }
  std::vector<uint8_t> pads;
  for (uint8_t pad = zero.TakeAnnouncement(); pad != 0; pad = zero.TakeAnnouncement()) {
    pads.push_back(pad);
  }
  ASSERT_EQ(pads.size(), 1u);
  EXPECT_TRUE(zero.Apply(pads[0]).ok());
  EXPECT_TRUE(other.Apply(pads[0]).ok());
  EXPECT_EQ(zero.decided(1), 1);
  EXPECT_EQ(other.decided(1), 1);
  EXPECT_EQ(zero.switches(1), 1);
}

// A class goes back to a candidate it left only where the new one costs
// kSwitchRatio times what the old one was left at, and switches at most
// kMaxSwitches times, whatever its costs do.
TEST(MeasuredChoiceTest, SwitchesGoBackOnlyToCheaperAndAreBounded) {
  MeasuredChoice zero(TwoClasses(), true), other(TwoClasses(), false);
  absl::Time clock = absl::UnixEpoch();
  const auto decided = [&](int candidate) {
    return [&, candidate] { return zero.decided(1) == candidate; };
  };
  RunInStep(zero, other, 10000, 1000, {{kRd, 100}, {kRab, 120}}, &clock, decided(0));
  ASSERT_EQ(zero.decided(1), 0) << zero.Describe();
  // Left at 400 for Rabenseifner (120 in its trial).
  RunInStep(zero, other, 10000, 1000, {{kRd, 400}, {kRab, 120}}, &clock, decided(1));
  ASSERT_EQ(zero.decided(1), 1) << zero.Describe();
  // Rabenseifner at 590 is within 1.5 x 400: kept (settling and four
  // windows, so that the calls below begin a window).
  RunInStep(zero, other, 10000, kTrialSettle + 4 * kWatchWindow, {{kRd, 100}, {kRab, 590}}, &clock);
  EXPECT_EQ(zero.decided(1), 1) << zero.Describe();
  // At 610 it is not: back to recursive doubling.
  RunInStep(zero, other, 10000, 1000, {{kRd, 100}, {kRab, 610}}, &clock, decided(0));
  EXPECT_EQ(zero.decided(1), 0) << zero.Describe();
  EXPECT_EQ(zero.switches(1), 2);
  EXPECT_TRUE(absl::StrContains(zero.Describe(),
                                " (left in use: recursive-doubling 400 us, rabenseifner 610 us)"))
      << zero.Describe();
  // Every candidate ever dearer: one more switch, then no more.
  double dear = 1e3;
  for (int k = 0; k < 6; ++k) {
    dear *= 10;
    RunInStep(zero, other, 10000, 200, {{kRd, dear}, {kRab, dear}}, &clock);
  }
  EXPECT_EQ(zero.switches(1), kMaxSwitches);
  EXPECT_EQ(other.switches(1), kMaxSwitches);
  EXPECT_EQ(zero.decided(1), other.decided(1));
}

TEST(MeasuredChoiceTest, SizesOutsideTheClassesAreTheTables) {
  MeasuredChoice m(TwoClasses(), true);
  EXPECT_FALSE(m.Next(4096).has_value());
  EXPECT_FALSE(m.Next(16385).has_value());
  EXPECT_FALSE(m.Next(0).has_value());
}

// The table's classes (Note [Algorithm table]).
AlgorithmInputs Messages(int world, bool oversubscribed) {
  AlgorithmInputs in;
  in.world = world;
  in.cores = 2;
  in.small_message_bytes = UcxOptions{}.small_message_bytes;
  in.recursive_doubling_bytes = UcxOptions{}.recursive_doubling_bytes;
  in.rabenseifner_bytes = UcxOptions{}.rabenseifner_bytes;
  in.rabenseifner_from_bytes = UcxOptions{}.rabenseifner_from_bytes;
  in.linear_bytes = UcxOptions{}.linear_bytes;
  in.machine_oversubscribed = oversubscribed;
  in.measured_bytes = 64 << 10;
  return in;
}

std::vector<std::vector<Algorithm>> Candidates(const AlgorithmTable& t) {
  std::vector<std::vector<Algorithm>> out;
  for (const AlgorithmTable::MeasuredClass& c : t.measured()) out.push_back(c.candidates);
  return out;
}

TEST(MeasuredChoiceTableTest, ClassesDoubleFromFourKibToTheOptionWithTheCandidatesThatApply) {
  const AlgorithmTable four = BuildAlgorithmTable(Messages(4, /*oversubscribed=*/true));
  ASSERT_EQ(four.measured().size(), 4u) << four.Describe();
  size_t lo = 4096;
  for (const AlgorithmTable::MeasuredClass& c : four.measured()) {
    EXPECT_EQ(c.lo, lo);
    EXPECT_EQ(c.hi, 2 * lo);
    // The ring from kMeasuredRingFromBytes, after Rabenseifner (as many
    // bytes through a link).
    EXPECT_EQ(c.candidates, lo < kMeasuredRingFromBytes
                                ? (std::vector<Algorithm>{kRab, kRd, kLinear})
                                : (std::vector<Algorithm>{kRab, kRing, kRd, kLinear}))
        << c.lo;
    lo *= 2;
  }
  EXPECT_TRUE(four.linear_watched());
  EXPECT_FALSE(four.linear()) << "4 ranks do not open with the linear round";
  EXPECT_GE(four.carried_bytes(), 65536u);
  EXPECT_GE(four.linear_bytes(), 65536u);
  // Where the linear round opens (8 ranks, oversubscribed), its static
  // range stays the option's, not the measured range's.
  const AlgorithmTable eight = BuildAlgorithmTable(Messages(8, true));
  ASSERT_TRUE(eight.linear());
  EXPECT_EQ(eight.Select(Kind::kAllReduce, UcxOptions{}.linear_bytes), kLinear);
  EXPECT_EQ(eight.Select(Kind::kAllReduce, UcxOptions{}.linear_bytes + 1), kRd);
  EXPECT_GE(eight.linear_bytes(), 65536u);
  EXPECT_TRUE(absl::StrContains(four.Describe(),
                                "Measured: (4096, 8192] B "
                                "rabenseifner|recursive-doubling|linear"))
      << four.Describe();

  // Not oversubscribed: no linear round, so nothing watched.
  const AlgorithmTable idle = BuildAlgorithmTable(Messages(4, false));
  const std::vector<std::vector<Algorithm>> rab_rd = {
      {kRab, kRd}, {kRab, kRd}, {kRab, kRd}, {kRab, kRing, kRd}};
  EXPECT_EQ(Candidates(idle), rab_rd);
  EXPECT_FALSE(idle.linear_watched());
  // 3 ranks: Rabenseifner needs a power of two.
  EXPECT_EQ(Candidates(BuildAlgorithmTable(Messages(3, true))),
            (std::vector<std::vector<Algorithm>>{
                {kRd, kLinear}, {kRd, kLinear}, {kRd, kLinear}, {kRing, kRd, kLinear}}));
  EXPECT_EQ(Candidates(BuildAlgorithmTable(Messages(3, false))),
            (std::vector<std::vector<Algorithm>>{{kRing, kRd}}))
      << "below the ring's classes, recursive doubling alone";
  EXPECT_TRUE(BuildAlgorithmTable(Messages(2, true)).measured().empty());
  // Above kMeasuredLinearMaxRanks the linear round is not a candidate.
  EXPECT_EQ(Candidates(BuildAlgorithmTable(Messages(32, true))), rab_rd);
  // Off, and on one host.
  AlgorithmInputs off = Messages(8, true);
  off.measured_bytes = 0;
  EXPECT_TRUE(BuildAlgorithmTable(off).measured().empty());
  AlgorithmInputs shm = Messages(8, true);
  shm.shm_exchange = true;
  EXPECT_TRUE(BuildAlgorithmTable(shm).measured().empty());
  // An option between powers of two ends the last class there.
  AlgorithmInputs odd = Messages(8, false);
  odd.measured_bytes = 12000;
  const AlgorithmTable t = BuildAlgorithmTable(odd);
  ASSERT_EQ(t.measured().size(), 2u);
  EXPECT_EQ(t.measured()[1].hi, 12000u);
  // Classes end where the table stops carrying AllReduce in a round (the
  // ring alone above it), and Rabenseifner is a candidate only up to
  // rabenseifner_bytes.
  AlgorithmInputs short_rd = Messages(6, true);
  short_rd.recursive_doubling_bytes = 16384;
  ASSERT_EQ(BuildAlgorithmTable(short_rd).measured().size(), 2u);
  EXPECT_EQ(BuildAlgorithmTable(short_rd).measured()[1].hi, 16384u);
  AlgorithmInputs short_rab = Messages(8, false);
  short_rab.rabenseifner_bytes = 16384;
  EXPECT_EQ(Candidates(BuildAlgorithmTable(short_rab)),
            (std::vector<std::vector<Algorithm>>{{kRab, kRd}, {kRab, kRd}, {kRing, kRd}}))
      << "a class with recursive doubling alone is left to the table";
  // The recursive-doubling opening keeps the linear round out.
  AlgorithmInputs rd = Messages(8, true);
  rd.opening = UcxOptions::Opening::kRecursiveDoubling;
  EXPECT_EQ(Candidates(BuildAlgorithmTable(rd)), rab_rd);
}

// The default range, 512 KiB: the classes go on above 64 KiB where the
// table carries AllReduce in a round (Rabenseifner up to
// rabenseifner_bytes at a power of two), with the ring beside it; the
// linear round stays a candidate only up to kMeasuredLinearMaxBytes, and
// carries no more than that.
TEST(MeasuredChoiceTableTest, AboveSixtyFourKibTheRingIsACandidateAndTheLinearRoundIsNot) {
  ASSERT_EQ(UcxOptions{}.measured_choice_bytes, size_t{512} << 10);
  AlgorithmInputs in = Messages(8, /*oversubscribed=*/true);
  in.measured_bytes = UcxOptions{}.measured_choice_bytes;
  const AlgorithmTable eight = BuildAlgorithmTable(in);
  ASSERT_EQ(eight.measured().size(), 7u) << eight.Describe();
  for (const AlgorithmTable::MeasuredClass& c : eight.measured()) {
    if (c.lo < kMeasuredRingFromBytes) {
      EXPECT_EQ(c.candidates, (std::vector<Algorithm>{kRab, kRd, kLinear})) << c.lo;
    } else if (c.hi <= kMeasuredLinearMaxBytes) {
      EXPECT_EQ(c.candidates, (std::vector<Algorithm>{kRab, kRing, kRd, kLinear})) << c.lo;
    } else {
      EXPECT_EQ(c.candidates, (std::vector<Algorithm>{kRab, kRing, kRd})) << c.lo;
    }
  }
  EXPECT_EQ(eight.measured().back().hi, size_t{512} << 10);
  EXPECT_EQ(eight.linear_bytes(), kMeasuredLinearMaxBytes);
  EXPECT_EQ(eight.carried_bytes(), size_t{512} << 10);
  // Above the classes, and where the trial has not decided, the table's
  // static choice: Rabenseifner up to rabenseifner_bytes, the ring above.
  EXPECT_EQ(eight.Select(Kind::kAllReduce, 256 << 10), kRab);
  EXPECT_EQ(eight.Select(Kind::kAllReduce, (512 << 10) + 4), kRing);
  EXPECT_TRUE(absl::StrContains(
      eight.Describe(), "(262144, 524288] B rabenseifner|ring-allreduce|recursive-doubling"))
      << eight.Describe();

  // 6 ranks: no Rabenseifner, so the table carries AllReduce in a round
  // only up to recursive_doubling_bytes; the classes end there.
  AlgorithmInputs six = Messages(6, /*oversubscribed=*/false);
  six.measured_bytes = UcxOptions{}.measured_choice_bytes;
  const AlgorithmTable t6 = BuildAlgorithmTable(six);
  ASSERT_FALSE(t6.measured().empty());
  EXPECT_EQ(t6.measured().back().hi, UcxOptions{}.recursive_doubling_bytes) << t6.Describe();
  EXPECT_EQ(Candidates(t6), (std::vector<std::vector<Algorithm>>{{kRing, kRd}}));
  EXPECT_EQ(t6.carried_bytes(), UcxOptions{}.recursive_doubling_bytes);
}

// Over real UCX: TCP between threads, the measured choice on; `opening`
// kLinear makes the linear round a candidate on any machine, kAuto only
// where the ranks outnumber the cores (then it carries measured classes
// without opening the other collectives).
UcxOptions Measured(UcxOptions::Opening opening) {
  UcxOptions o;
  o.use_shared_memory = false;
  o.transports = "tcp,self";
  o.opening = opening;
  o.measured_choice_bytes = 64 << 10;
  o.timeout = absl::Seconds(60);
  return o;
}

bool Oversubscribed(int world) {
  return std::thread::hardware_concurrency() < static_cast<unsigned>(world);
}

// "Chosen: (4096, 8192] B: linear (rank 0, ...); ..." on rank 0; the
// names alone elsewhere.
std::vector<std::string> ChosenNames(const std::string& algorithms) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(algorithms, '\n')) {
    if (!absl::ConsumePrefix(&line, "Chosen: ")) continue;
    for (absl::string_view part : absl::StrSplit(line, "; ")) {
      out.push_back(std::string(part.substr(0, part.find(" (rank 0"))));
    }
  }
  return out;
}

// kCalls calls: AllReduce of every measured class and above them, Barrier,
// Broadcast and AllGather between; every result exact on every call, and
// every rank ends with the same choice for every class that has one (each
// class sees enough calls, about 250, for a trial of four whole blocks).
// `rank0`, where given, gets rank 0's description of its choices.
void CheckMixedCalls(int world, const UcxOptions& options, size_t want_classes,
                     std::string* rank0 = nullptr) {
  constexpr int kCalls = 1500;
  std::vector<std::string> chosen(world);
  fusebox::testing::RunRanksUcx(
      world,
      [&](int rank, Communicator& comm) {
        // 6-160 KB of floats, each size in a sixth of the calls.
        const size_t counts[] = {1500, 3000, 3001, 6000, 12000, 40000};
        const int sum = world * (world + 1) / 2;
        for (int i = 0; i < kCalls; ++i) {
          const size_t count = counts[(i * 7 + i / 6) % 6];
          std::vector<float> in(count), out(count, -1.0f), want(count);
          for (size_t j = 0; j < count; ++j) {
            in[j] = static_cast<float>((rank + 1) * ((i + j) % 13));
            want[j] = static_cast<float>(sum * ((i + j) % 13));
          }
          absl::Status s =
              AllReduceSync(comm, in.data(), out.data(), count, DataType::kFloat32, ReduceOp::kSum);
          ASSERT_TRUE(s.ok()) << s;
          ASSERT_EQ(out, want) << "rank " << rank << ", call " << i << ", count " << count;
          if (i % 9 == 0) {
            ASSERT_TRUE(comm.BarrierBlocking().ok());
          }
          if (i % 11 == 0) {
            std::vector<int32_t> b(2000, rank == i % world ? i : -1);
            ASSERT_TRUE(
                comm.BroadcastBlocking(b.data(), b.size(), DataType::kInt32, i % world).ok());
            ASSERT_EQ(b, std::vector<int32_t>(2000, i)) << "rank " << rank << ", call " << i;
          }
          if (i % 13 == 0) {
            std::vector<int32_t> mine(1000, rank * 1000 + i), all(1000 * world);
            ASSERT_TRUE(
                comm.AllGatherBlocking(mine.data(), all.data(), 1000, DataType::kInt32).ok());
            for (int r = 0; r < world; ++r) {
              ASSERT_EQ(all[r * 1000 + 999], r * 1000 + i) << "rank " << rank << ", call " << i;
            }
          }
        }
        chosen[rank] = comm.Algorithms();
      },
      options);
  const std::vector<std::string> zero = ChosenNames(chosen[0]);
  EXPECT_EQ(zero.size(), want_classes) << chosen[0];
  // Where the range reaches the ring's classes, the ring ran in the trial:
  // rank 0 lists what it cost.
  if (options.measured_choice_bytes > kMeasuredRingFromBytes) {
    const size_t at = chosen[0].find("Chosen: ");
    ASSERT_NE(at, std::string::npos) << chosen[0];
    EXPECT_TRUE(absl::StrContains(chosen[0].substr(at), "ring-allreduce ")) << chosen[0];
  }
  for (int r = 1; r < world; ++r) EXPECT_EQ(ChosenNames(chosen[r]), zero) << "rank " << r;
  if (rank0 != nullptr) *rank0 = chosen[0];
}

TEST(MeasuredChoiceUcxTest, EveryCallIsExactAndEveryRankEndsWithTheSameChoice) {
  CheckMixedCalls(4, Measured(UcxOptions::Opening::kLinear), 4);
}

// The default range, 512 KiB: the 160 KB calls fall in (128, 256] KiB,
// whose candidates are Rabenseifner, the ring and recursive doubling, and
// which is decided like the others (no call falls in (64, 128] KiB).
TEST(MeasuredChoiceUcxTest, TheRingIsTimedAboveSixtyFourKibOnTheDefaultRange) {
  UcxOptions o = Measured(UcxOptions::Opening::kLinear);
  o.measured_choice_bytes = UcxOptions{}.measured_choice_bytes;
  std::string chosen;
  CheckMixedCalls(4, o, 5, &chosen);
  const size_t at = chosen.find("(131072, 262144] B: ");
  ASSERT_NE(at, std::string::npos) << chosen;
  const std::string cls = chosen.substr(at, chosen.find("; ", at) - at);
  EXPECT_TRUE(absl::StrContains(cls, "ring-allreduce ")) << cls;
  EXPECT_TRUE(absl::StrContains(cls, "rabenseifner ")) << cls;
  EXPECT_FALSE(absl::StrContains(cls, "linear ")) << "no linear round above 64 KiB: " << cls;
}

// 3 ranks: rank 0 hands its message to rank 1 and sits the exchanges out,
// and learns rank 0's announcements back in the hand-back.
TEST(MeasuredChoiceUcxTest, ThreeRanksWhereRankZeroSitsTheExchangesOut) {
  CheckMixedCalls(3, Measured(UcxOptions::Opening::kLinear), 4);
}

// The linear round a candidate without opening the other collectives:
// every descriptor round is watched, and the linear round runs only for
// the measured calls that pick it.
TEST(MeasuredChoiceUcxTest, TheLinearRoundAsACandidateOnly) {
  int ran = 0;
  for (int world : {3, 4}) {
    if (!Oversubscribed(world)) continue;
    CheckMixedCalls(world, Measured(UcxOptions::Opening::kAuto), 4);
    ++ran;
  }
  if (ran == 0) {
    GTEST_SKIP() << "the linear round is a candidate without opening only where the ranks "
                    "outnumber the cores";
  }
}

// Ranks that call different sizes while a class is in its trial, where the
// others run recursive doubling, Rabenseifner or the linear round: every
// rank fails with the same mismatch, none hangs.
TEST(MeasuredChoiceUcxTest, AMismatchDuringTheTrialFailsEveryRank) {
  constexpr int kWorld = 4;
  for (const UcxOptions::Opening opening :
       {UcxOptions::Opening::kLinear, UcxOptions::Opening::kAuto}) {
    if (opening == UcxOptions::Opening::kAuto && !Oversubscribed(kWorld)) continue;
    for (int at :
         {kTrialWarmCalls, kTrialWarmCalls + kTrialBlock, kTrialWarmCalls + 2 * kTrialBlock}) {
      std::vector<std::string> errors(kWorld);
      fusebox::testing::RunRanksUcx(
          kWorld,
          [&](int rank, Communicator& comm) {
            for (int i = 0; i <= at; ++i) {
              // Rank 2 calls 100 KB (unmeasured) at call `at`.
              const size_t count = rank == 2 && i == at ? 25000 : 2000;
              std::vector<float> buf(count, 1.0f);
              absl::Status s = AllReduceSync(comm, buf.data(), buf.data(), count,
                                             DataType::kFloat32, ReduceOp::kSum);
              if (i < at) {
                ASSERT_TRUE(s.ok()) << s;
              } else {
                errors[rank] = std::string(s.message());
                EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
              }
            }
          },
          Measured(opening));
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_TRUE(absl::StrContains(errors[r], "collective mismatch"))
            << "opening " << static_cast<int>(opening) << ", at " << at << ", rank " << r << ": "
            << errors[r];
      }
    }
  }
}

}  // namespace
}  // namespace fusebox::comm::ucx
