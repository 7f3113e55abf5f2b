// The gap report (perf/explain.h): the critical chain walked back through
// hand-made bucket records with known delays, each recovered in its term,
// and on a real replay (two UCX ranks) the terms sum to the gap that the
// overlap table reports.
#include "perf/explain.h"

#include <cmath>
#include <numeric>
#include <vector>

#include "autotune/measure.h"
#include "autotune/models.h"
#include "gtest/gtest.h"
#include "perf/overlap.h"
#include "tests/common/run_ranks_ucx.h"

namespace fusebox::perf {
namespace {

using bucketing::BucketTiming;

BucketTiming At(int bucket, double ready, double launch, double start, double done,
                double noticed, double copied) {
  BucketTiming t;
  t.bucket = bucket;
  t.bytes = 1000;
  t.ready_us = ready;
  t.launch_us = launch;
  t.start_us = start;
  t.done_us = done;
  t.noticed_us = noticed;
  t.copied_us = copied;
  return t;
}

GapInput Input(const bucketing::IterationStats& st, double end, double bend, double bound, int w) {
  GapInput in;
  in.stats = &st;
  in.forward_us = 100;
  in.iteration_us = end;
  in.backward_end_us = bend;
  in.backward_us = 30;
  in.bound_us = bound;
  in.profile_ready_us = {5, 15, 25};
  in.isolated_us = [](int64_t) { return 30.0; };  // every bucket: 30 us alone
  in.max_in_flight = w;
  return in;
}

TEST(ExplainGapTest, QueuedBucketsChainThroughTheirPredecessors) {
  // Three buckets, window 2: bucket 2 launches once bucket 0 is seen done
  // (its slot), then queues behind bucket 1, which queued behind bucket 0.
  bucketing::IterationStats st;
  st.bucket_times = {At(0, 110, 111, 112, 150, 151, 153), At(1, 120, 121, 152, 190, 192, 193),
                     At(2, 130, 152, 191, 230, 231, 235)};
  const GapTerms g = ExplainGap(Input(st, 240, 135, 180, 2));
  EXPECT_DOUBLE_EQ(g.tail_us, 5);
  EXPECT_DOUBLE_EQ(g.copy_back_us, 4);
  EXPECT_DOUBLE_EQ(g.launch_to_start_us, 1 + 1 + 2 + 1);
  EXPECT_DOUBLE_EQ(g.transfer_excess_us, 9 + 8 + 8);
  EXPECT_DOUBLE_EQ(g.window_us, 1);
  EXPECT_DOUBLE_EQ(g.late_gradients_us, 110 - (100 + 5));
  EXPECT_DOUBLE_EQ(g.plan_us, 100 + 5 + 3 * 30 - 180);
  EXPECT_EQ(g.chain_buckets, 3);
  EXPECT_DOUBLE_EQ(g.sum_us(), g.gap_us());
}

TEST(ExplainGapTest, AFullWindowChainsThroughTheSlotNotItsCopyBack) {
  // Window 1: bucket 1 launches once the worker sees bucket 0 done (151),
  // while bucket 0's 9 us copy back runs: the chain runs through the slot,
  // and that copy is off it.
  bucketing::IterationStats st;
  st.bucket_times = {At(0, 110, 111, 112, 150, 151, 160), At(1, 120, 152, 153, 191, 192, 193)};
  const GapTerms g = ExplainGap(Input(st, 196, 125, 150, 1));
  EXPECT_DOUBLE_EQ(g.tail_us, 3);
  EXPECT_DOUBLE_EQ(g.copy_back_us, 1);
  EXPECT_DOUBLE_EQ(g.window_us, 1 + 1);
  EXPECT_DOUBLE_EQ(g.launch_to_start_us, 1 + 1 + 1 + 1);
  EXPECT_DOUBLE_EQ(g.transfer_excess_us, 8 + 8);
  EXPECT_DOUBLE_EQ(g.late_gradients_us, 5);
  EXPECT_DOUBLE_EQ(g.plan_us, 100 + 5 + 60 - 150);
  EXPECT_EQ(g.chain_buckets, 2);
  EXPECT_DOUBLE_EQ(g.sum_us(), g.gap_us());
}

TEST(ExplainGapTest, ASlotFreedOnCompletionChainsThroughItsFreeNotTheWorkersNotice) {
  // Window 1: bucket 0's slot was freed on the completing thread at 150.5
  // and bucket 1 launched at 151, while the worker noticed bucket 0 only at
  // 158 (Note [Freeing a slot where the collective completes]): the chain
  // runs done_0 -> freed_0 -> launch_1, and the worker's late notice and
  // copy of bucket 0 are off it (no negative window term).
  bucketing::IterationStats st;
  st.bucket_times = {At(0, 110, 111, 112, 150, 158, 160), At(1, 120, 151, 152, 190, 191, 192)};
  st.bucket_times[0].freed_us = 150.5;
  st.bucket_times[1].freed_us = 190.5;
  const GapTerms g = ExplainGap(Input(st, 195, 125, 150, 1));
  EXPECT_DOUBLE_EQ(g.tail_us, 3);
  EXPECT_DOUBLE_EQ(g.copy_back_us, 1);
  EXPECT_DOUBLE_EQ(g.window_us, 0.5 + 1);
  EXPECT_DOUBLE_EQ(g.launch_to_start_us, 1 + 1 + 0.5 + 1);
  EXPECT_DOUBLE_EQ(g.transfer_excess_us, 8 + 8);
  EXPECT_EQ(g.chain_buckets, 2);
  EXPECT_DOUBLE_EQ(g.sum_us(), g.gap_us());
}

TEST(ExplainGapTest, TheWorkerBusyCopyingChainsToTheEarlierCopy) {
  // Bucket 1 is done at 155 while the worker copies bucket 0 back until
  // 170: the worker's wait is bucket 0's copy, not bucket 1's transfer.
  bucketing::IterationStats st;
  st.bucket_times = {At(0, 110, 111, 112, 150, 151, 170), At(1, 120, 121, 150, 155, 171, 172)};
  const GapTerms g = ExplainGap(Input(st, 172, 125, 150, 4));
  EXPECT_DOUBLE_EQ(g.copy_back_us, 1 + 19);
  EXPECT_DOUBLE_EQ(g.launch_to_start_us, 1 + 1 + 1);
  EXPECT_EQ(g.chain_buckets, 1);
  EXPECT_DOUBLE_EQ(g.sum_us(), g.gap_us());
}

TEST(ExplainGapTest, HiddenCommunicationIsBackwardAgainstTheBound) {
  bucketing::IterationStats st;
  st.bucket_times = {At(0, 110, 111, 112, 120, 121, 121)};
  const GapTerms g = ExplainGap(Input(st, 140, 138, 131, 4));
  EXPECT_DOUBLE_EQ(g.late_gradients_us, 138 - 130);
  EXPECT_DOUBLE_EQ(g.plan_us, 130 - 131);
  EXPECT_DOUBLE_EQ(g.tail_us, 2);
  EXPECT_EQ(g.chain_buckets, 0);
  EXPECT_DOUBLE_EQ(g.sum_us(), g.gap_us());
}

// A real replay: two UCX ranks (threads of this process) replay ResNet-50's
// backward through the engine. The gap report's iteration (each
// iteration's slowest rank, from the engine's records, averaged) must agree
// with the table's measured iterations within 2%, and its terms sum to its
// gap.
TEST(ExplainGapTest, OnARealReplayTheTermsAddUpToTheMeasuredGap) {
  auto profile = autotune::GenerateModelProfile("resnet50");
  ASSERT_TRUE(profile.ok());
  std::vector<absl::StatusOr<OverlapReport>> reports(2, absl::UnknownError("not run"));
  fusebox::testing::RunRanksUcx(2, [&](int r, comm::Communicator& c) {
    OverlapOptions o;
    o.iters = 4;
    o.compute_scale = 0.05;
    o.plans = {"ddp", "per-tensor"};
    o.explain = true;
    reports[r] = RunOverlap(c, *profile, o, nullptr);
  });
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(reports[r].ok()) << reports[r].status();
  for (const OverlapResult& res : reports[0]->results) {
    const GapTerms& g = res.gap;
    const double mean = std::accumulate(res.iterations_us.begin(), res.iterations_us.end(), 0.0) /
                        res.iterations_us.size();
    EXPECT_NEAR(g.iteration_us, mean, 0.02 * mean) << res.plan;
    EXPECT_NEAR(g.sum_us(), g.gap_us(), 1e-6 * mean) << res.plan;
    EXPECT_DOUBLE_EQ(g.bound_us, res.bound_us) << res.plan;
    EXPECT_GT(g.chain_buckets, 0) << res.plan;  // communication is exposed at this scale
  }
  // Every rank reports the same (the slowest rank's) terms.
  for (size_t i = 0; i < reports[0]->results.size(); ++i) {
    EXPECT_DOUBLE_EQ(reports[0]->results[i].gap.plan_us, reports[1]->results[i].gap.plan_us);
  }
  // Note [The cost model beside the plans]: every size of the cost model
  // was timed again in the rounds, alike on every rank; the bound keeps the
  // least time of its sizes, so t(all) is at most their median; both
  // predictions were made.
  const CommModel& m = reports[0]->comm;
  ASSERT_EQ(m.beside_samples.size(), m.samples.size());
  ASSERT_TRUE(m.total_measured);
  for (size_t i = 0; i < m.samples.size(); ++i) {
    EXPECT_EQ(m.beside_samples[i].bytes, m.samples[i].bytes);
    EXPECT_GT(m.beside_samples[i].time_us, 0);
    EXPECT_DOUBLE_EQ(m.beside_samples[i].time_us, reports[1]->comm.beside_samples[i].time_us);
  }
  EXPECT_EQ(m.beside_samples.back().bytes, m.bound_sizes.back());
  EXPECT_LE(m.t_total_us, m.beside_samples.back().time_us);
  for (const OverlapResult& res : reports[0]->results) {
    EXPECT_GT(res.predicted_us, 0) << res.plan;
    EXPECT_GT(res.predicted_before_us, 0) << res.plan;
    // One exposed time per measured round, whose median the table reports,
    // and one prediction under each round's own sizes: communication is
    // exposed at this scale, so under every round's sizes.
    ASSERT_EQ(res.exposed_rounds_us.size(), static_cast<size_t>(4)) << res.plan;
    EXPECT_DOUBLE_EQ(autotune::Median(res.exposed_rounds_us), res.exposed_us) << res.plan;
    ASSERT_EQ(res.predicted_rounds_exposed_us.size(), static_cast<size_t>(4)) << res.plan;
    for (double p : res.predicted_rounds_exposed_us) EXPECT_GT(p, 0) << res.plan;
  }
  // The rounds' sizes are the slowest rank's, so every rank predicts the
  // same under each round's.
  for (size_t i = 0; i < reports[0]->results.size(); ++i) {
    EXPECT_EQ(reports[0]->results[i].predicted_rounds_exposed_us,
              reports[1]->results[i].predicted_rounds_exposed_us)
        << reports[0]->results[i].plan;
  }
}

}  // namespace
}  // namespace fusebox::perf
