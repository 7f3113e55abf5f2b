// LaunchOrder (Note [Launch order] in bucketing/launch_order.h) on its own:
// hand-worked sequences, ranks simulated in lockstep (every rank must launch
// the same sequence whatever order its buckets complete in), the engine's
// former inline logic as a reference model, and the votes' encoding.
#include "bucketing/launch_order.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::bucketing {
namespace {

using ::testing::ElementsAre;

// Per bucket i: priority i (bucket i holds tensor i), as per-tensor plans.
std::vector<int> Ascending(int nb) {
  std::vector<int> p(nb);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

// Launches whatever Next() admits, as the engine's LaunchReadyLocked does;
// returns the buckets launched.
std::vector<int> LaunchAll(LaunchOrder& order) {
  std::vector<int> out;
  for (int b = order.Next(); b >= 0; b = order.Next()) {
    const int k = order.launches();
    EXPECT_EQ(order.Launched(b), k);
    out.push_back(b);
  }
  return out;
}

// What this rank's votes say now (what WriteVotes encodes).
std::vector<uint8_t> VotesHere(const LaunchOrder& order) {
  std::vector<uint8_t> v(order.buckets());
  for (int c = 0; c < order.buckets(); ++c) v[c] = order.complete_here(c);
  return v;
}

TEST(LaunchOrderTest, EmptyPlanLaunchesNothing) {
  for (Schedule s : {Schedule::kPlanOrder, Schedule::kForwardPriority}) {
    LaunchOrder order(s, 1, {});
    EXPECT_EQ(order.buckets(), 0);
    EXPECT_EQ(order.Next(), -1);
    EXPECT_FALSE(order.Free(0));
    order.Reset();
    EXPECT_EQ(order.Next(), -1);
    EXPECT_EQ(order.launches(), 0);
  }
  LaunchOrder none;
  EXPECT_EQ(none.Next(), -1);
  EXPECT_EQ(none.buckets(), 0);
}

TEST(LaunchOrderTest, SingleBucketLaunchesOnceWhenComplete) {
  for (Schedule s : {Schedule::kPlanOrder, Schedule::kForwardPriority}) {
    LaunchOrder order(s, 1, {0});
    EXPECT_EQ(order.Next(), -1) << "not complete yet";
    EXPECT_FALSE(order.complete_here(0));
    order.Complete(0);
    EXPECT_TRUE(order.complete_here(0));
    EXPECT_EQ(order.Next(), 0);
    EXPECT_EQ(order.Launched(0), 0);
    EXPECT_TRUE(order.launched(0));
    EXPECT_EQ(order.in_window(), 1);
    EXPECT_EQ(order.Next(), -1) << "launched already";
    order.Complete(0);  // ignored once launched
    EXPECT_EQ(order.Next(), -1);
    EXPECT_TRUE(order.Free(0));
    EXPECT_FALSE(order.Free(0)) << "freed twice";
    EXPECT_EQ(order.in_window(), 0);
    EXPECT_EQ(order.Next(), -1) << "every bucket launched";
  }
}

// Buckets complete last-to-first: plan order waits for bucket 0 and then
// keeps the plan's order, at most W in the window.
TEST(LaunchOrderTest, PlanOrderKeepsThePlansOrderWithinTheWindow) {
  LaunchOrder order(Schedule::kPlanOrder, 2, Ascending(5));
  for (int b : {4, 3, 2}) order.Complete(b);
  EXPECT_EQ(order.Next(), -1) << "bucket 0 is not complete: nothing else may go first";
  order.Complete(0);
  EXPECT_THAT(LaunchAll(order), ElementsAre(0)) << "bucket 1 is not complete";
  order.Complete(1);
  EXPECT_THAT(LaunchAll(order), ElementsAre(1));
  EXPECT_EQ(order.in_window(), 2);
  EXPECT_EQ(order.Next(), -1) << "the window is full, though bucket 2 is complete";
  EXPECT_FALSE(order.Free(1)) << "slots free in launch order";
  EXPECT_TRUE(order.Free(0));
  EXPECT_THAT(LaunchAll(order), ElementsAre(2));
  EXPECT_TRUE(order.Free(1));
  EXPECT_TRUE(order.Free(2));
  EXPECT_THAT(LaunchAll(order), ElementsAre(3, 4));
  EXPECT_EQ(order.launches(), 5);
  EXPECT_EQ(order.Next(), -1);
}

TEST(LaunchOrderTest, WindowOfOneLaunchesOneAtATime) {
  LaunchOrder order(Schedule::kPlanOrder, 1, Ascending(3));
  for (int b : {0, 1, 2}) order.Complete(b);
  for (int k = 0; k < 3; ++k) {
    EXPECT_THAT(LaunchAll(order), ElementsAre(k));
    EXPECT_EQ(order.Next(), -1);
    EXPECT_TRUE(order.Free(k));
  }
  EXPECT_EQ(order.Next(), -1);
}

TEST(LaunchOrderTest, AWindowLargerThanThePlanLaunchesEverythingComplete) {
  LaunchOrder order(Schedule::kForwardPriority, 8, Ascending(3));
  for (int b : {2, 1, 0}) order.Complete(b);
  EXPECT_THAT(LaunchAll(order), ElementsAre(0, 1, 2)) << "the first W launches go in plan order";
}

// The engine test's case (EngineScheduleTest.ForwardPriority...): W = 1,
// complete last-to-first: 0 (plan order), then 2 (it holds the latest-ready
// tensor), then 1.
TEST(LaunchOrderTest, ForwardPriorityTakesWhatTheNextForwardNeedsFirst) {
  LaunchOrder order(Schedule::kForwardPriority, 1, Ascending(3));
  for (int b : {2, 1, 0}) order.Complete(b);
  EXPECT_THAT(LaunchAll(order), ElementsAre(0));
  const std::vector<uint8_t> votes0 = VotesHere(order);
  EXPECT_THAT(votes0, ElementsAre(1, 1, 1));
  EXPECT_TRUE(order.Free(0));
  EXPECT_EQ(order.Next(), -1) << "launch 1 needs launch 0's votes";
  order.Agreed(0, votes0);
  EXPECT_THAT(LaunchAll(order), ElementsAre(2));
  EXPECT_TRUE(order.Free(1));
  order.Agreed(1, VotesHere(order));
  EXPECT_THAT(LaunchAll(order), ElementsAre(1));
}

// Complete here is not enough: with launch 0's votes showing nothing
// complete everywhere, launch 1 is the next bucket in plan order, not the
// higher-priority bucket that happens to be complete here.
TEST(LaunchOrderTest, ForwardPriorityFollowsAgreedNotLocalReadiness) {
  LaunchOrder order(Schedule::kForwardPriority, 1, Ascending(3));
  order.Complete(0);
  EXPECT_THAT(LaunchAll(order), ElementsAre(0));
  order.Complete(2);  // here, after launch 0 voted
  EXPECT_TRUE(order.Free(0));
  order.Agreed(0, {1, 0, 0});
  EXPECT_EQ(order.Next(), -1) << "bucket 1 is next in plan order and not complete here";
  order.Complete(1);
  EXPECT_THAT(LaunchAll(order), ElementsAre(1));
  EXPECT_TRUE(order.Free(1));
  order.Agreed(1, {1, 1, 0});  // another rank had not completed 2 then
  EXPECT_THAT(LaunchAll(order), ElementsAre(2));
}

TEST(LaunchOrderTest, ForwardPriorityTiesGoToTheLowerBucket) {
  // A tensor split over buckets 1 and 2 gives both its id.
  LaunchOrder order(Schedule::kForwardPriority, 1, {0, 5, 5, 3});
  for (int b = 0; b < 4; ++b) order.Complete(b);
  EXPECT_THAT(LaunchAll(order), ElementsAre(0));
  ASSERT_TRUE(order.Free(0));
  order.Agreed(0, {1, 1, 1, 1});
  EXPECT_THAT(LaunchAll(order), ElementsAre(1));
  ASSERT_TRUE(order.Free(1));
  order.Agreed(1, {1, 1, 1, 1});
  EXPECT_THAT(LaunchAll(order), ElementsAre(2));
  ASSERT_TRUE(order.Free(2));
  order.Agreed(2, {1, 1, 1, 1});
  EXPECT_THAT(LaunchAll(order), ElementsAre(3));
}

// With W = 2 launch k is chosen by the votes of launch k - 2, not k - 1.
TEST(LaunchOrderTest, ForwardPriorityReadsTheVotesOfLaunchKMinusW) {
  LaunchOrder order(Schedule::kForwardPriority, 2, Ascending(5));
  order.Complete(0);
  order.Complete(1);
  EXPECT_THAT(LaunchAll(order), ElementsAre(0, 1));
  for (int b : {2, 3, 4}) order.Complete(b);
  ASSERT_TRUE(order.Free(0));
  order.Agreed(0, {1, 1, 0, 1, 0});  // launch 0 saw 3 complete everywhere
  EXPECT_THAT(LaunchAll(order), ElementsAre(3));
  ASSERT_TRUE(order.Free(1));
  order.Agreed(1, {1, 1, 1, 1, 1});
  EXPECT_THAT(LaunchAll(order), ElementsAre(4)) << "launch 3 reads launch 1's votes";
  ASSERT_TRUE(order.Free(2));
  order.Agreed(2, {1, 1, 1, 1, 1});
  EXPECT_THAT(LaunchAll(order), ElementsAre(2));
}

TEST(LaunchOrderTest, ResetStartsAnIterationAfresh) {
  LaunchOrder order(Schedule::kForwardPriority, 1, Ascending(2));
  order.Complete(0);
  order.Complete(1);
  EXPECT_THAT(LaunchAll(order), ElementsAre(0));
  ASSERT_TRUE(order.Free(0));
  order.Agreed(0, {1, 1});
  order.Reset();
  EXPECT_EQ(order.launches(), 0);
  EXPECT_EQ(order.in_window(), 0);
  EXPECT_FALSE(order.complete_here(0));
  EXPECT_FALSE(order.launched(0));
  EXPECT_EQ(order.Next(), -1);
  order.Complete(1);
  order.Complete(0);
  EXPECT_THAT(LaunchAll(order), ElementsAre(0));
  ASSERT_TRUE(order.Free(0));
  EXPECT_EQ(order.Next(), -1) << "the previous iteration's votes are gone";
}

// Ranks in lockstep. Each rank completes its buckets in its own random
// order, at its own pace; a launch's collective completes once every rank
// has launched it (and must be the same bucket everywhere, or ranks would
// reduce different buckets together), with votes that say 1 where every
// rank voted 1; each rank then learns of the completions in launch order,
// late and at its own pace. Any order logic that looks at local readiness
// alone, launches twice or early, or overfills the window fails here.
struct SimResult {
  std::vector<std::vector<int>> sequences;  // per rank
  bool finished = false;
};

SimResult Simulate(int ranks, int nb, int window, Schedule schedule, std::vector<int> priority,
                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<LaunchOrder> orders(ranks, LaunchOrder(schedule, window, priority));
  std::vector<std::vector<int>> ready_order(ranks, Ascending(nb));
  for (auto& o : ready_order) std::shuffle(o.begin(), o.end(), rng);
  std::vector<int> completed(ranks, 0);  // per rank: how many of ready_order are complete
  std::vector<int> told(ranks, 0);       // per rank: completions it has learnt of
  // Per launch index: the bucket and each rank's votes.
  std::vector<int> bucket_at(nb, -1);
  std::vector<std::vector<std::vector<uint8_t>>> votes(nb);
  SimResult r;
  r.sequences.assign(ranks, {});
  auto launch = [&](int rank) {
    LaunchOrder& o = orders[rank];
    for (int b = o.Next(); b >= 0; b = o.Next()) {
      EXPECT_TRUE(o.complete_here(b)) << "rank " << rank << " launches bucket " << b << " early";
      EXPECT_FALSE(o.launched(b)) << "rank " << rank << " launches bucket " << b << " twice";
      EXPECT_LT(o.in_window(), window);
      const int k = o.launches();
      if (bucket_at[k] < 0) bucket_at[k] = b;
      EXPECT_EQ(bucket_at[k], b) << "rank " << rank << " launch " << k;
      votes[k].push_back(VotesHere(o));
      EXPECT_EQ(o.Launched(b), k);
      EXPECT_LE(o.in_window(), window);
      r.sequences[rank].push_back(b);
    }
  };
  for (int rank = 0; rank < ranks; ++rank) launch(rank);
  for (int step = 0; step < 100000; ++step) {
    if (::testing::Test::HasFailure()) return r;
    // What each rank can do next: complete a bucket, or learn of the next
    // collective to complete (every rank launched it).
    std::vector<std::pair<int, bool>> moves;  // (rank, learn)
    for (int rank = 0; rank < ranks; ++rank) {
      if (completed[rank] < nb) moves.push_back({rank, false});
      if (told[rank] < nb && static_cast<int>(votes[told[rank]].size()) == ranks) {
        moves.push_back({rank, true});
      }
    }
    if (moves.empty()) break;
    const auto [rank, learn] = moves[rng() % moves.size()];
    LaunchOrder& o = orders[rank];
    if (!learn) {
      o.Complete(ready_order[rank][completed[rank]++]);
    } else {
      const int k = told[rank]++;
      EXPECT_FALSE(o.Free(k + 1)) << "freed out of order";
      EXPECT_TRUE(o.Free(k));
      std::vector<uint8_t> everywhere(nb, 1);
      for (const auto& v : votes[k]) {
        for (int c = 0; c < nb; ++c) everywhere[c] &= v[c];
      }
      o.Agreed(k, everywhere);
    }
    launch(rank);
  }
  r.finished = true;
  for (int rank = 0; rank < ranks; ++rank) {
    r.finished &= orders[rank].launches() == nb && told[rank] == nb;
  }
  return r;
}

TEST(LaunchOrderTest, EveryRankLaunchesTheSameSequenceWhateverTheTiming) {
  for (Schedule schedule : {Schedule::kPlanOrder, Schedule::kForwardPriority}) {
    for (int ranks : {1, 2, 3, 5}) {
      for (int nb : {0, 1, 2, 7, 20}) {
        for (int window : {1, 2, 3, nb + 1}) {
          for (uint64_t seed = 0; seed < 8; ++seed) {
            std::vector<int> priority = Ascending(nb);
            if (seed % 2 == 1) std::shuffle(priority.begin(), priority.end(), std::mt19937(seed));
            const std::string what =
                absl::StrCat(schedule == Schedule::kPlanOrder ? "plan order" : "forward priority",
                             ", ", ranks, " ranks, ", nb, " buckets, window ", window, ", seed ",
                             seed);
            const SimResult r = Simulate(ranks, nb, window, schedule, priority, seed);
            ASSERT_FALSE(::testing::Test::HasFailure()) << what;
            ASSERT_TRUE(r.finished) << what << ": stuck";
            std::vector<int> sorted = r.sequences[0];
            std::sort(sorted.begin(), sorted.end());
            EXPECT_EQ(sorted, Ascending(nb)) << what << ": every bucket exactly once";
            for (int rank = 1; rank < ranks; ++rank) {
              EXPECT_EQ(r.sequences[rank], r.sequences[0]) << what << ": rank " << rank;
            }
            if (schedule == Schedule::kPlanOrder) {
              EXPECT_EQ(r.sequences[0], Ascending(nb)) << what;
            } else {
              for (int k = 0; k < std::min(window, nb); ++k) {
                EXPECT_EQ(r.sequences[0][k], k) << what << ": the first W go in plan order";
              }
            }
          }
        }
      }
    }
  }
}

// The engine's launch order as it was inline in engine.cc (ChooseNextLocked,
// LaunchReadyLocked, Launch's and FreeSlotLocked's bookkeeping), kept here
// as the reference the extracted unit must match call for call.
class Reference {
 public:
  enum class St { kFilling, kReady, kLaunched, kDone };
  Reference(Schedule schedule, int w, std::vector<int> priority)
      : schedule_(schedule), w_(w), priority_(std::move(priority)),
        state_(priority_.size(), St::kFilling), votes_(priority_.size()) {}
  int nb() const { return static_cast<int>(priority_.size()); }
  int Choose() const {
    const int k = launched_count_;
    if (schedule_ == Schedule::kForwardPriority && k >= w_) {
      const std::vector<uint8_t>& everywhere = votes_[k - w_];
      int best = -1;
      for (int b = 0; b < nb(); ++b) {
        if (everywhere[b] && state_[b] != St::kLaunched && state_[b] != St::kDone &&
            (best < 0 || priority_[b] > priority_[best])) {
          best = b;
        }
      }
      if (best >= 0) return best;
    }
    return next_launch_;
  }
  int Next() const {
    if (launched_count_ < nb() && window_ < w_) {
      const int b = Choose();
      if (state_[b] == St::kReady) return b;
    }
    return -1;
  }
  void Ready(int b) { state_[b] = St::kReady; }
  void Launch(int b) {
    state_[b] = St::kLaunched;
    while (next_launch_ < nb() &&
           (state_[next_launch_] == St::kLaunched || state_[next_launch_] == St::kDone)) {
      ++next_launch_;
    }
    ++launched_count_;
    ++window_;
  }
  bool Free(int index, std::vector<uint8_t> votes) {
    if (index != freed_count_) return false;
    ++freed_count_;
    --window_;
    votes_[index] = std::move(votes);
    return true;
  }
  void Done(int b) { state_[b] = St::kDone; }
  St state(int b) const { return state_[b]; }

 private:
  Schedule schedule_;
  int w_;
  std::vector<int> priority_;
  std::vector<St> state_;
  int next_launch_ = 0, launched_count_ = 0, window_ = 0, freed_count_ = 0;
  std::vector<std::vector<uint8_t>> votes_;
};

TEST(LaunchOrderTest, MatchesTheEnginesFormerInlineOrder) {
  for (Schedule schedule : {Schedule::kPlanOrder, Schedule::kForwardPriority}) {
    for (uint64_t seed = 0; seed < 300; ++seed) {
      std::mt19937_64 rng(seed);
      const int nb = static_cast<int>(rng() % 12);
      const int w = 1 + static_cast<int>(rng() % 4);
      std::vector<int> priority(nb);
      for (int& p : priority) p = static_cast<int>(rng() % 6);  // ties too
      LaunchOrder order(schedule, w, priority);
      Reference ref(schedule, w, priority);
      std::vector<int> seq;             // launches, in order
      std::vector<std::vector<uint8_t>> at_launch;  // votes here when each launched
      int freed = 0, done = 0;
      for (int step = 0; step < 200 && done < nb; ++step) {
        const std::string what = absl::StrCat("seed ", seed, " step ", step);
        ASSERT_EQ(order.Next(), ref.Next()) << what;
        switch (rng() % 4) {
          case 0: {  // a bucket completes here
            const int b = nb > 0 ? static_cast<int>(rng() % nb) : 0;
            if (nb > 0 && ref.state(b) == Reference::St::kFilling) {
              order.Complete(b);
              ref.Ready(b);
            }
            break;
          }
          case 1: {  // launch what is admitted
            const int b = ref.Next();
            if (b >= 0) {
              at_launch.push_back(VotesHere(order));
              order.Launched(b);
              ref.Launch(b);
              seq.push_back(b);
            }
            break;
          }
          case 2: {  // the next launch completes; everywhere: a subset of here
            if (freed < static_cast<int>(seq.size())) {
              std::vector<uint8_t> everywhere = at_launch[freed];
              for (auto& v : everywhere) v &= rng() % 3 != 0;
              ASSERT_TRUE(order.Free(freed)) << what;
              order.Agreed(freed, everywhere);
              ASSERT_TRUE(ref.Free(freed, everywhere)) << what;
              ++freed;
            }
            break;
          }
          default: {  // the worker copies the oldest freed bucket back
            if (done < freed) {
              ref.Done(seq[done]);
              ++done;
            }
            break;
          }
        }
      }
      EXPECT_EQ(order.launches(), static_cast<int>(seq.size()));
    }
  }
}

TEST(LaunchOrderTest, PrioritiesAreEachBucketsLatestReadyTensor) {
  Plan plan;
  plan.buckets.push_back(Bucket{comm::DataType::kFloat32, {{3, 0, 4}, {1, 0, 2}}});
  plan.buckets.push_back(Bucket{comm::DataType::kFloat32, {{0, 0, 8}, {2, 0, 3}}});
  plan.buckets.push_back(Bucket{comm::DataType::kFloat32, {{2, 3, 5}}});  // split
  plan.buckets.push_back(Bucket{comm::DataType::kFloat32, {}});
  EXPECT_THAT(ForwardPriorities(plan), ElementsAre(3, 2, 2, -1));
  EXPECT_TRUE(ForwardPriorities(Plan{}).empty());
}

TEST(LaunchOrderTest, VoteLimits) {
  EXPECT_EQ(MaxVotingRanks(comm::DataType::kBFloat16), 256);
  EXPECT_EQ(MaxVotingRanks(comm::DataType::kFloat16), 2048);
  EXPECT_EQ(MaxVotingRanks(comm::DataType::kFloat32), 1 << 24);
  EXPECT_EQ(MaxVotingRanks(comm::DataType::kFloat64), 1 << 24);
  EXPECT_EQ(kMaxPriorityBuckets, 8192);
}

// One element of `type` holding `v`, rounded as the backend's result is.
std::vector<char> Element(comm::DataType type, double v) {
  std::vector<char> e(comm::DataTypeSize(type));
  switch (type) {
    case comm::DataType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(e.data(), &f, 4);
      break;
    }
    case comm::DataType::kFloat64:
      std::memcpy(e.data(), &v, 8);
      break;
    case comm::DataType::kFloat16: {
      const uint16_t h = comm::FloatToHalf(static_cast<float>(v));
      std::memcpy(e.data(), &h, 2);
      break;
    }
    default: {
      const uint16_t h = comm::FloatToBFloat16(static_cast<float>(v));
      std::memcpy(e.data(), &h, 2);
      break;
    }
  }
  return e;
}

TEST(LaunchOrderTest, VotesRoundTripInEveryFloatType) {
  for (comm::DataType type : {comm::DataType::kFloat32, comm::DataType::kFloat64,
                              comm::DataType::kFloat16, comm::DataType::kBFloat16}) {
    LaunchOrder order(Schedule::kForwardPriority, 1, Ascending(4));
    order.Complete(1);
    order.Complete(3);
    std::vector<char> buf(4 * comm::DataTypeSize(type), 0x7f);
    WriteVotes(order, type, buf.data());
    EXPECT_EQ(std::vector<char>(buf.begin(), buf.begin() + comm::DataTypeSize(type)),
              Element(type, 0.0));
    EXPECT_THAT(ReadVotes(buf.data(), 4, type, 1.0), ElementsAre(0, 1, 0, 1))
        << comm::DataTypeName(type);
    EXPECT_TRUE(ReadVotes(buf.data(), 0, type, 1.0).empty());
  }
  LaunchOrder empty;
  char untouched = 0x55;
  WriteVotes(empty, comm::DataType::kFloat32, &untouched);
  EXPECT_EQ(untouched, 0x55);
}

// Within MaxVotingRanks, one rank voting 0 never averages (or sums) to what
// every rank voting 1 gives: "complete everywhere" is exact.
TEST(LaunchOrderTest, AOneVoteShortIsNeverUnanimousWithinTheLimits) {
  for (comm::DataType type : {comm::DataType::kFloat32, comm::DataType::kFloat64,
                              comm::DataType::kFloat16, comm::DataType::kBFloat16}) {
    const int limit = std::min(MaxVotingRanks(type), 4096);
    for (int n : {1, 2, 3, 7, limit - 1, limit}) {
      if (n < 1) continue;
      // Averaged: the exact sum divided once by n, in the element type.
      std::vector<char> all = Element(type, 1.0);
      std::vector<char> short_one = Element(type, static_cast<double>(n - 1) / n);
      EXPECT_THAT(ReadVotes(all.data(), 1, type, 1.0), ElementsAre(1));
      EXPECT_THAT(ReadVotes(short_one.data(), 1, type, 1.0), ElementsAre(0))
          << comm::DataTypeName(type) << " n=" << n;
      // Summed.
      all = Element(type, n);
      short_one = Element(type, n - 1);
      EXPECT_THAT(ReadVotes(all.data(), 1, type, n), ElementsAre(1));
      EXPECT_THAT(ReadVotes(short_one.data(), 1, type, n), ElementsAre(0))
          << comm::DataTypeName(type) << " n=" << n;
    }
  }
}

}  // namespace
}  // namespace fusebox::bucketing
