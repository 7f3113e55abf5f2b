// The engine over real UCX communicators (ranks as threads of one process):
// results equal, bit for bit, an independent per-tensor reference for every
// baseline plan, random layouts and ready orders, several marking threads,
// repeated iterations and a plan swap; and bad use fails clearly.
#include "bucketing/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "bucketing/planners.h"
#include "comm/testing/exact_data.h"
#include "comm/testing/loopback.h"
#include "comm/ucx/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/bucketing/engine_testing.h"
#include "tests/bucketing/test_layouts.h"
#include "tests/common/forwarding_communicator.h"
#include "tests/common/run_ranks_ucx.h"

namespace fusebox::bucketing {
namespace {

using comm::DataType;
using comm::testing::CountMismatches;
using comm::testing::FillInput;
using ::testing::HasSubstr;
using testing::BaselinePlans;
using testing::Expected;
using testing::MakeLayout;
using testing::RandomLayout;
using testing::RunRanks;
using fusebox::testing::RunRanksUcx;
using testing::Seed;


// Runs `iterations` iterations on one rank: fills each gradient, marks them
// ready in a rank- and iteration-specific random order from `threads`
// threads (tensors whose id is odd are written in place when the plan
// allows), then checks every gradient bit for bit.
void RunIterations(Engine& engine, int rank, int world, int first_iteration, int iterations,
                   int threads) {
  const GradientLayout& layout = engine.layout();
  std::vector<std::vector<unsigned char>> grads(layout.size());
  for (int it = first_iteration; it < first_iteration + iterations; ++it) {
    std::vector<void*> where(layout.size(), nullptr);
    for (int id = 0; id < layout.size(); ++id) {
      const TensorSpec& t = layout.tensor(id);
      grads[id].assign(t.numel * comm::DataTypeSize(t.dtype) + 1, 0);
      void* view = engine.TensorStorage(id);
      where[id] = (id % 2 == 1 && view != nullptr) ? view : grads[id].data();
      FillInput(where[id], t.numel, t.dtype, comm::ReduceOp::kSum, rank, Seed(it, id));
    }
    std::vector<int> order(layout.size());
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(rank * 7777 + it);
    std::shuffle(order.begin(), order.end(), rng);
    std::atomic<size_t> next{0};
    std::vector<std::thread> markers;
    for (int th = 0; th < threads; ++th) {
      markers.emplace_back([&] {
        for (size_t k; (k = next.fetch_add(1)) < order.size();) {
          const int id = order[k];
          absl::Status s = engine.MarkReady(id, where[id], layout.tensor(id).numel);
          EXPECT_TRUE(s.ok()) << s;
        }
      });
    }
    for (auto& m : markers) m.join();
    absl::Status s = engine.Finish();
    ASSERT_TRUE(s.ok()) << s;
    for (int id = 0; id < layout.size(); ++id) {
      const TensorSpec& t = layout.tensor(id);
      std::vector<unsigned char> want = Expected(t, world, Seed(it, id));
      EXPECT_EQ(CountMismatches(where[id], want.data(), t.numel, t.dtype), 0u)
          << "rank " << rank << "/" << world << " iteration " << it << " plan \""
          << engine.plan().name << "\" tensor " << id << " (" << t.numel << " "
          << comm::DataTypeName(t.dtype) << ")" << (where[id] == grads[id].data() ? "" : " view");
    }
  }
}


// Marks every gradient ready with this rank's exact data (in place where
// the engine offers a view), finishes, and checks every result.
void MarkAllAndFinish(Engine& engine, int rank, int world, int it) {
  const GradientLayout& layout = engine.layout();
  std::vector<std::vector<unsigned char>> grads(layout.size());
  std::vector<void*> where(layout.size());
  for (int id = 0; id < layout.size(); ++id) {
    const TensorSpec& t = layout.tensor(id);
    grads[id].assign(t.numel * comm::DataTypeSize(t.dtype) + 1, 0);
    where[id] = engine.TensorStorage(id) != nullptr ? engine.TensorStorage(id) : grads[id].data();
    FillInput(where[id], t.numel, t.dtype, comm::ReduceOp::kSum, rank, Seed(it, id));
    ASSERT_TRUE(engine.MarkReady(id, where[id], t.numel).ok());
  }
  ASSERT_TRUE(engine.Finish().ok());
  for (int id = 0; id < layout.size(); ++id) {
    const TensorSpec& t = layout.tensor(id);
    std::vector<unsigned char> want = Expected(t, world, Seed(it, id));
    EXPECT_EQ(CountMismatches(where[id], want.data(), t.numel, t.dtype), 0u) << "tensor " << id;
  }
}

// Every baseline plan in turn on one engine per rank, two iterations each,
// gradients marked from 3 threads, checked bit for bit.
void CheckEveryBaselinePlan(int world, Schedule schedule, bool over_ucx) {
  // Mixed dtypes, zero-size tensors, and one huge tensor that FixedSizePlan
  // splits into ~100 slices.
  const GradientLayout layout = RandomLayout(world * 31 + 5, 24, 3000, 25000, /*mixed=*/true);
  const std::vector<Plan> plans = BaselinePlans(layout);
  const testing::RankFn fn = [&](int rank, comm::Communicator& comm) {
    EngineOptions options;
    options.max_in_flight = 2;
    options.timeout = absl::Seconds(60);
    options.schedule = schedule;
    auto engine = Engine::Create(comm, layout, plans[0], options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    int it = 0;
    for (const Plan& plan : plans) {
      ASSERT_TRUE((*engine)->SetPlan(plan).ok());
      RunIterations(**engine, rank, world, it, 2, /*threads=*/3);
      it += 2;
    }
    EXPECT_EQ((*engine)->stats().size(), 2 * plans.size());
  };
  if (over_ucx) {
    RunRanksUcx(world, fn);
  } else {
    RunRanks(world, fn);
  }
}

class EngineWorldTest : public ::testing::TestWithParam<std::tuple<int, Schedule>> {};

TEST_P(EngineWorldTest, MatchesReferenceForEveryBaselinePlanAndSwap) {
  CheckEveryBaselinePlan(std::get<0>(GetParam()), std::get<1>(GetParam()), /*over_ucx=*/false);
}

// The same on real UCX communicators (the loopback above has no transport):
// completions from UCX's progress thread, its shared-memory paths.
TEST(EngineOverUcxTest, MatchesReferenceForEveryBaselinePlanAndSwap) {
  CheckEveryBaselinePlan(3, Schedule::kForwardPriority, /*over_ucx=*/true);
  CheckEveryBaselinePlan(2, Schedule::kPlanOrder, /*over_ucx=*/true);
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, EngineWorldTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(Schedule::kPlanOrder, Schedule::kForwardPriority)),
    [](const auto& info) {
      return "Np" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) == Schedule::kPlanOrder ? "PlanOrder" : "ForwardPriority");
    });

// Gradients ready last-to-first with one bucket in flight: plan order
// issues 0, 1, 2; forward priority issues 0 (plan order for the first
// launch), then 2 (needed first by the next forward: it holds the
// latest-ready tensor), then 1, on every rank alike.
TEST(EngineScheduleTest, ForwardPriorityLaunchesWhatForwardNeedsFirst) {
  const GradientLayout layout = MakeLayout({8, 8, 8});
  for (Schedule schedule : {Schedule::kPlanOrder, Schedule::kForwardPriority}) {
    RunRanks(2, [&](int rank, comm::Communicator& comm) {
      EngineOptions options;
      options.max_in_flight = 1;
      options.schedule = schedule;
      auto engine = Engine::Create(comm, layout, PerTensorPlan(layout), options);
      ASSERT_TRUE(engine.ok()) << engine.status();
      std::vector<std::vector<float>> g(3, std::vector<float>(8, 1.0f + rank));
      for (int id : {2, 1, 0}) ASSERT_TRUE((*engine)->MarkReady(id, g[id].data(), 8).ok());
      ASSERT_TRUE((*engine)->Finish().ok());
      const std::vector<int> want =
          schedule == Schedule::kPlanOrder ? std::vector<int>{0, 1, 2} : std::vector<int>{0, 2, 1};
      EXPECT_EQ((*engine)->stats().back().launch_order, want) << "rank " << rank;
      for (const auto& v : g) EXPECT_EQ(v, std::vector<float>(8, 1.5f));
    });
  }
}

// Ranks see different local readiness when the second launch is chosen:
// rank 0 has every gradient, rank 1 only the first (it sleeps, then marks
// the rest last-to-first). The choice must follow what is complete on every
// rank (the votes), not what is complete locally, or the ranks would reduce
// different buckets together.
TEST(EngineScheduleTest, ForwardPriorityFollowsAgreedNotLocalReadiness) {
  const GradientLayout layout = MakeLayout({8, 8, 8});
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    EngineOptions options;
    options.max_in_flight = 1;
    options.schedule = Schedule::kForwardPriority;
    auto engine = Engine::Create(comm, layout, PerTensorPlan(layout), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<std::vector<float>> g;
    for (int id = 0; id < 3; ++id) g.emplace_back(8, static_cast<float>(10 * id + 2 * rank));
    ASSERT_TRUE((*engine)->MarkReady(0, g[0].data(), 8).ok());
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::vector<int> rest = rank == 0 ? std::vector<int>{1, 2} : std::vector<int>{2, 1};
    for (int id : rest) ASSERT_TRUE((*engine)->MarkReady(id, g[id].data(), 8).ok());
    ASSERT_TRUE((*engine)->Finish().ok());
    for (int id = 0; id < 3; ++id) {
      EXPECT_EQ(g[id], std::vector<float>(8, 10.0f * id + 1.0f)) << "rank " << rank << " tensor " << id;
    }
    EXPECT_EQ((*engine)->stats().back().launch_order, (std::vector<int>{0, 1, 2})) << "rank " << rank;
  });
}

// A window slot frees when the worker sees the collective done, before it
// copies the bucket back (Note [Launch order]): with one bucket in flight
// and bucket 1 complete first, bucket 1 is launched before bucket 0's copy
// back has ended. (Launched after the copy, as when the slot was held until
// then, its launch time would follow bucket 0's copied time.)
// With launches on completion off, only the worker frees slots: the second
// launch follows its notice of the first bucket and precedes that bucket's
// copy back. On (the default), the slot may free sooner, on the completing
// thread, and still before the copy back.
class CopyBackWindowTest : public ::testing::TestWithParam<bool> {};

TEST_P(CopyBackWindowTest, ACopyBackDoesNotHoldTheWindow) {
  const GradientLayout layout = MakeLayout({1 << 16, 1 << 16});
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    EngineOptions options;
    options.max_in_flight = 1;
    options.launch_on_completion = GetParam();
    auto engine = Engine::Create(comm, layout, PerTensorPlan(layout), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    // The caller's own buffers (not the buckets'): reduced values are
    // copied back.
    std::vector<std::vector<float>> g(2, std::vector<float>(1 << 16, 1.0f + rank));
    for (int id : {1, 0}) ASSERT_TRUE((*engine)->MarkReady(id, g[id].data(), 1 << 16).ok());
    ASSERT_TRUE((*engine)->Finish().ok());
    for (const auto& v : g) EXPECT_EQ(v, std::vector<float>(1 << 16, 1.5f));
    const IterationStats st = (*engine)->stats().back();  // a copy: stats() returns one
    ASSERT_EQ(st.launch_order, (std::vector<int>{0, 1}));
    ASSERT_EQ(st.bucket_times.size(), 2u);
    const BucketTiming& first = st.bucket_times[0];
    const BucketTiming& second = st.bucket_times[1];
    ASSERT_EQ(first.bucket, 0);
    EXPECT_GE(second.launch_us, GetParam() ? first.done_us : first.noticed_us) << "rank " << rank;
    EXPECT_GE(second.launch_us, first.freed_us) << "rank " << rank;
    EXPECT_LT(second.launch_us, first.copied_us) << "rank " << rank;
    if (!GetParam()) {
      EXPECT_EQ(st.launches_on_completion, 0);
    }
  });
}

// A communicator whose AllReduce returns only after the collective has
// started (and, on the loopback, finished): as when the executor takes the
// core from the issuing thread at once.
class SlowToReturn final : public fusebox::testing::ForwardingCommunicator {
 public:
  explicit SlowToReturn(comm::Communicator& inner)
      : ForwardingCommunicator(inner, "slow-to-return") {}
  absl::StatusOr<std::shared_ptr<comm::Work>> DoIssue(const comm::CollectiveArgs& a) override {
    auto work = ForwardingCommunicator::DoIssue(a);
    if (a.kind == comm::CollectiveKind::kAllReduce && work.ok()) {
      while ((*work)->started_ns() == 0 && !(*work)->Test()) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    return work;
  }
};

// A bucket's launch is when the engine called the communicator, so it
// never follows the collective's start (stamped when the call returned, it
// did here, by 3 ms).
TEST(EngineScheduleTest, ALaunchIsStampedBeforeTheCommunicatorIsCalled) {
  const GradientLayout layout = MakeLayout({1024, 1024, 1024});
  RunRanks(2, [&](int rank, comm::Communicator& inner) {
    SlowToReturn comm(inner);
    // Every launch from MarkReady, none from a completion callback: there
    // the communicator's call would run on the loopback's executor, which
    // SlowToReturn would then wait on.
    EngineOptions options;
    options.max_in_flight = 3;
    options.launch_on_completion = false;
    auto engine = Engine::Create(comm, layout, PerTensorPlan(layout), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<std::vector<float>> g(3, std::vector<float>(1024, 1.0f + rank));
    for (int id = 0; id < 3; ++id) ASSERT_TRUE((*engine)->MarkReady(id, g[id].data(), 1024).ok());
    ASSERT_TRUE((*engine)->Finish().ok());
    for (const auto& v : g) EXPECT_EQ(v, std::vector<float>(1024, 1.5f));
    const IterationStats st = (*engine)->stats().back();
    ASSERT_EQ(st.bucket_times.size(), 3u);
    for (const BucketTiming& bt : st.bucket_times) {
      ASSERT_GE(bt.start_us, 0) << "rank " << rank << ": the loopback marks starts";
      EXPECT_LE(bt.launch_us, bt.start_us) << "rank " << rank << ", bucket " << bt.bucket;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(LaunchOnCompletion, CopyBackWindowTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "On" : "Off";
                         });

// Note [Freeing a slot where the collective completes]: with one bucket in
// flight and every gradient ready, each completion admits the next launch on
// the thread that completed the collective (the loopback's executor), not
// only once the worker has woken. Launches stay in plan order, each after
// its predecessor completed, and the results exact.
TEST(EngineScheduleTest, ACompletedCollectiveAdmitsTheNextLaunchWithoutTheWorker) {
  std::vector<int64_t> sizes(64, 256);
  const GradientLayout layout = MakeLayout(sizes);
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    EngineOptions options;
    options.max_in_flight = 1;
    auto engine = Engine::Create(comm, layout, PerTensorPlan(layout), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<std::vector<float>> g(64, std::vector<float>(256, 1.0f + rank));
    for (int id = 63; id >= 0; --id) {
      ASSERT_TRUE((*engine)->MarkReady(id, g[id].data(), 256).ok());
    }
    ASSERT_TRUE((*engine)->Finish().ok());
    for (const auto& v : g) EXPECT_EQ(v, std::vector<float>(256, 1.5f));
    const IterationStats st = (*engine)->stats().back();
    std::vector<int> order(64);
    std::iota(order.begin(), order.end(), 0);
    EXPECT_EQ(st.launch_order, order);
    EXPECT_GT(st.launches_on_completion, 0) << "rank " << rank;
    ASSERT_EQ(st.bucket_times.size(), 64u);
    for (int k = 1; k < 64; ++k) {
      EXPECT_GE(st.bucket_times[k].launch_us, st.bucket_times[k - 1].done_us)
          << "rank " << rank << ", launch " << k;
    }
  });
}

// ...but only where the communicator would otherwise go idle: a launch on
// a completing thread delays every collective queued behind the one that
// completed (they start once its callbacks return), so with four buckets
// in flight a completion launches (as many as its freed slots admit, one
// run of launches) only once every launch before that run has completed;
// the worker launches meanwhile.
TEST(EngineScheduleTest, ACompletionLaunchesOnlyWhereNothingIsQueuedBehindIt) {
  std::vector<int64_t> sizes(64, 4096);
  const GradientLayout layout = MakeLayout(sizes);
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    EngineOptions options;
    options.max_in_flight = 4;
    auto engine = Engine::Create(comm, layout, PerTensorPlan(layout), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<std::vector<float>> g(64, std::vector<float>(4096, 1.0f + rank));
    for (int iter = 0; iter < 3; ++iter) {
      for (int id = 63; id >= 0; --id) {
        ASSERT_TRUE((*engine)->MarkReady(id, g[id].data(), 4096).ok());
      }
      ASSERT_TRUE((*engine)->Finish().ok());
      for (auto& v : g) {
        ASSERT_EQ(v, std::vector<float>(4096, 1.5f));
        std::fill(v.begin(), v.end(), 1.0f + rank);
      }
      const IterationStats st = (*engine)->stats().back();
      ASSERT_EQ(st.bucket_times.size(), 64u);
      int on_completion = 0;
      size_t run = 0;  // the first launch of the run of completion launches k is in
      for (size_t k = 0; k < st.bucket_times.size(); ++k) {
        if (!st.bucket_times[k].on_completion) continue;
        ++on_completion;
        if (k == 0 || !st.bucket_times[k - 1].on_completion) run = k;
        for (size_t j = 0; j < run; ++j) {
          EXPECT_GE(st.bucket_times[run].launch_us, st.bucket_times[j].done_us)
              << "rank " << rank << ": launch " << run << " made on completion while launch " << j
              << " was queued";
        }
      }
      EXPECT_EQ(on_completion, st.launches_on_completion) << "rank " << rank;
    }
  });
}

TEST(EngineScheduleTest, ForwardPriorityRefusesTooManyBuckets) {
  // Each allreduce carries one vote per bucket: beyond the limit the plan is
  // refused with a clear error rather than made quadratic.
  std::vector<TensorSpec> specs;
  for (int i = 0; i <= kMaxPriorityBuckets; ++i) specs.push_back({"t" + std::to_string(i), 1});
  const GradientLayout layout = *GradientLayout::Create(specs);
  RunRanks(1, [&](int, comm::Communicator& comm) {
    EngineOptions options;
    options.schedule = Schedule::kForwardPriority;
    auto engine = Engine::Create(comm, layout, PerTensorPlan(layout), options);
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(engine.status().message()), HasSubstr("at most 8192 buckets"));
  });
}

TEST(EngineTest, WindowOfOneAndRingPathMatchReference) {
  // One bucket in flight at a time, over the ring algorithm with tiny chunks.
  comm::UcxOptions ring;
  ring.small_message_bytes = 0;
  ring.chunk_bytes = 256;
  ring.use_shared_memory = false;
  const GradientLayout layout = RandomLayout(99, 12, 2000, 9000, /*mixed=*/false);
  RunRanksUcx(
      3,
      [&](int rank, comm::Communicator& comm) {
        EngineOptions options;
        options.max_in_flight = 1;
        auto engine = Engine::Create(comm, layout, *FixedSizePlan(layout, 512), options);
        ASSERT_TRUE(engine.ok()) << engine.status();
        RunIterations(**engine, rank, 3, 0, 3, /*threads=*/2);
      },
      ring);
}

TEST(EngineTest, TensorReducedCallbackFiresOnceWithTheResultInPlace) {
  // A tensor split across buckets is reported only after its last slice is
  // back; every report comes before Finish returns and sees the final
  // average in the caller's buffer.
  const GradientLayout layout = RandomLayout(5, 9, 100, 5000, /*mixed=*/false);
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    std::vector<std::vector<unsigned char>> grads(layout.size());
    std::vector<std::atomic<int>> calls(layout.size());
    std::vector<std::atomic<int>> correct(layout.size());
    int iteration = 0;
    EngineOptions options;
    options.max_in_flight = 2;
    options.on_tensor_reduced = [&](int id) {
      calls[id].fetch_add(1);
      const TensorSpec& t = layout.tensor(id);
      std::vector<unsigned char> want = Expected(t, 2, Seed(iteration, id));
      if (CountMismatches(grads[id].data(), want.data(), t.numel, t.dtype) == 0) {
        correct[id].fetch_add(1);
      }
    };
    // Slices of 700 elements: the larger tensors are split across buckets.
    auto engine = Engine::Create(comm, layout, *FixedSizePlan(layout, 700 * 4), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (iteration = 0; iteration < 3; ++iteration) {
      for (int id = 0; id < layout.size(); ++id) {
        const TensorSpec& t = layout.tensor(id);
        grads[id].assign(t.numel * comm::DataTypeSize(t.dtype) + 1, 0);
        FillInput(grads[id].data(), t.numel, t.dtype, comm::ReduceOp::kSum, rank,
                  Seed(iteration, id));
      }
      for (int id = layout.size() - 1; id >= 0; --id) {
        ASSERT_TRUE((*engine)->MarkReady(id, grads[id].data(), layout.tensor(id).numel).ok());
      }
      ASSERT_TRUE((*engine)->Finish().ok());
      for (int id = 0; id < layout.size(); ++id) {
        EXPECT_EQ(calls[id].load(), iteration + 1) << "tensor " << id;
        EXPECT_EQ(correct[id].load(), iteration + 1) << "tensor " << id;
      }
    }
  });
}

TEST(EngineTest, CallerOwnedBucketsAreReducedInPlaceBitForBit) {
  // EngineOptions::external_buffers (a DDP bucket that the plan maps 1:1):
  // each bucket arrives whole, packed in slice order, and is averaged in
  // place; results equal the reference, and each bucket is reported once.
  const GradientLayout layout = RandomLayout(11, 12, 3000, 20000, /*mixed=*/true);
  RunRanks(3, [&](int rank, comm::Communicator& comm) {
    EngineOptions options;
    options.external_buffers = true;
    std::vector<std::atomic<int>> reported(64);
    options.on_bucket_reduced = [&](int b, const absl::Status& s) {
      if (s.ok()) reported[b].fetch_add(1);
    };
    auto engine = Engine::Create(comm, layout, DdpPlan(layout, DdpOptions{2048, 8192}), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    // The engine owns no buffers: no tensor has a place of its own there.
    for (int id = 0; id < layout.size(); ++id) EXPECT_EQ((*engine)->TensorStorage(id), nullptr);
    for (int it = 0; it < 3; ++it) {
      if (it == 2) {  // a plan swap, as the tuner makes between iterations
        ASSERT_TRUE((*engine)->SetPlan(PerTensorPlan(layout)).ok());
        for (auto& r : reported) r = 0;
      }
      const Plan& plan = (*engine)->plan();
      ASSERT_TRUE((*engine)->StartIteration().ok());
      std::vector<std::vector<unsigned char>> buckets(plan.buckets.size());
      for (size_t b = 0; b < plan.buckets.size(); ++b) {
        const size_t esize = comm::DataTypeSize(plan.buckets[b].dtype);
        buckets[b].assign(plan.buckets[b].count() * esize + 1, 0);
        int64_t at = 0;
        for (const Slice& sl : plan.buckets[b].slices) {
          FillInput(buckets[b].data() + at * esize, sl.count, plan.buckets[b].dtype,
                    comm::ReduceOp::kSum, rank, Seed(it, sl.tensor));
          at += sl.count;
        }
        absl::Status s = (*engine)->MarkBucketReady(static_cast<int>(b), buckets[b].data(),
                                                    plan.buckets[b].count());
        ASSERT_TRUE(s.ok()) << s;
      }
      ASSERT_TRUE((*engine)->Finish().ok());
      for (size_t b = 0; b < plan.buckets.size(); ++b) {
        EXPECT_EQ(reported[b].load(), it == 2 ? 1 : it + 1) << "bucket " << b;
        const size_t esize = comm::DataTypeSize(plan.buckets[b].dtype);
        int64_t at = 0;
        for (const Slice& sl : plan.buckets[b].slices) {
          std::vector<unsigned char> want = Expected(layout.tensor(sl.tensor), 3, Seed(it, sl.tensor));
          EXPECT_EQ(CountMismatches(buckets[b].data() + at * esize, want.data(), sl.count,
                                    plan.buckets[b].dtype),
                    0u)
              << "rank " << rank << " iteration " << it << " tensor " << sl.tensor;
          at += sl.count;
        }
      }
    }
  });
}

TEST(EngineTest, CallerOwnedBucketsRefuseMisuse) {
  const GradientLayout layout = MakeLayout({100, 200, 300});
  RunRanks(1, [&](int, comm::Communicator& comm) {
    EngineOptions options;
    options.external_buffers = true;
    // A plan that splits a tensor has no single place in a caller's bucket.
    auto split = Engine::Create(comm, layout, *FixedSizePlan(layout, 250 * 4), options);
    ASSERT_FALSE(split.ok());
    EXPECT_THAT(split.status().message(), HasSubstr("splits tensor"));
    EngineOptions priority = options;
    priority.schedule = Schedule::kForwardPriority;
    EXPECT_FALSE(Engine::Create(comm, layout, PerTensorPlan(layout), priority).ok());
    // The buckets' memory outlives the engine (the collective runs in it).
    std::vector<float> data(300);
    auto engine = Engine::Create(comm, layout, PerTensorPlan(layout), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_THAT((*engine)->MarkReady(0, data.data(), 100).message(), HasSubstr("MarkBucketReady"));
    EXPECT_THAT((*engine)->MarkBucketReady(0, data.data(), 99).message(), HasSubstr("100"));
    EXPECT_THAT((*engine)->MarkBucketReady(3, data.data(), 1).message(), HasSubstr("not in plan"));
    ASSERT_TRUE((*engine)->MarkBucketReady(0, data.data(), 100).ok());
    EXPECT_THAT((*engine)->MarkBucketReady(0, data.data(), 100).message(),
                HasSubstr("already marked"));
    ASSERT_TRUE((*engine)->MarkBucketReady(1, data.data() + 100, 200).ok());
    std::vector<float> third(300);
    ASSERT_TRUE((*engine)->MarkBucketReady(2, third.data(), 300).ok());
    EXPECT_TRUE((*engine)->Finish().ok());
  });
}

// A policy that records what the engine tells it and asks for the
// per-tensor plan after the second iteration.
class RecordingPolicy : public PlanPolicy {
 public:
  explicit RecordingPolicy(std::vector<IterationStats>* seen) : seen_(seen) {}
  absl::StatusOr<std::optional<Plan>> OnIterationEnd(const IterationStats& last,
                                                     const Plan& current) override {
    seen_->push_back(last);
    if (seen_->size() == 2) {
      Plan p = PerTensorPlan(MakeLayout({300, 500, 700}));
      p.name = "from-policy";
      return p;
    }
    return std::optional<Plan>();
  }

 private:
  std::vector<IterationStats>* seen_;
};

TEST(EngineTest, PolicyIsConsultedBetweenIterationsWithWholeStepTimes) {
  const GradientLayout layout = MakeLayout({300, 500, 700});
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    auto engine = Engine::Create(comm, layout, DdpPlan(layout), {});
    ASSERT_TRUE(engine.ok()) << engine.status();
    std::vector<IterationStats> seen;
    (*engine)->SetPolicy(std::make_unique<RecordingPolicy>(&seen));
    for (int it = 0; it < 4; ++it) {
      ASSERT_TRUE((*engine)->StartIteration().ok());
      // "Forward": 20 ms before any gradient, then an "optimizer" of 10 ms
      // after Finish: both inside the whole step, outside StartIteration's
      // backward-only figures.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      MarkAllAndFinish(**engine, rank, 2, it);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(seen.size(), 3u);  // after iterations 0, 1, 2 (each at the next start)
    for (const IterationStats& st : seen) {
      EXPECT_GT(st.next_start_us, 0);
      EXPECT_GE(st.whole_us(), 30000);
      EXPECT_GE(st.whole_us() - st.iteration_us(), 10000);  // the optimizer's part
    }
    EXPECT_EQ((*engine)->plan().name, "from-policy");
  });
}

TEST(EngineTest, RetainedPlanBuffersComeBackOnASwitchBack) {
  const GradientLayout layout = MakeLayout({300, 500, 700});
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    EngineOptions options;
    options.retain_plans = 2;
    auto engine = Engine::Create(comm, layout, DdpPlan(layout), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    void* first = (*engine)->TensorStorage(1);
    ASSERT_NE(first, nullptr);
    MarkAllAndFinish(**engine, rank, 2, 0);
    ASSERT_TRUE((*engine)->SetPlan(PerTensorPlan(layout)).ok());
    MarkAllAndFinish(**engine, rank, 2, 1);
    ASSERT_TRUE((*engine)->SetPlan(DdpPlan(layout)).ok());
    EXPECT_EQ((*engine)->TensorStorage(1), first);
    MarkAllAndFinish(**engine, rank, 2, 2);  // still exact on the reused buffers
  });
}

TEST(EngineTest, StatisticsAndTimelineDescribeTheIteration) {
  const GradientLayout layout = MakeLayout({100, 200, 300});
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    EngineOptions options;
    options.record_timeline = true;
    auto engine = Engine::Create(comm, layout, PerTensorPlan(layout), options);
    ASSERT_TRUE(engine.ok());
    RunIterations(**engine, rank, 2, 0, 2, 1);
    auto stats = (*engine)->stats();
    ASSERT_EQ(stats.size(), 2u);
    for (const IterationStats& s : stats) {
      EXPECT_LE(s.start_us, s.backward_end_us);
      EXPECT_LE(s.backward_end_us, s.finish_us);
      EXPECT_GT(s.comm_us, 0);
      EXPECT_EQ(s.buckets, 3);
    }
    EXPECT_EQ(stats[1].iteration, 1);
    EXPECT_EQ((*engine)->last_stats().iteration, 1);
    EXPECT_EQ((*engine)->last_stats().finish_us, stats[1].finish_us);
    const std::string trace = (*engine)->timeline()->ToChromeTrace(rank, "rank");
    EXPECT_THAT(trace, HasSubstr("\"name\":\"backward end\""));
    EXPECT_THAT(trace, HasSubstr("\"name\":\"bucket 2\""));
    EXPECT_THAT(trace, HasSubstr("\"name\":\"t1\""));
  });
}

// --- bad use --------------------------------------------------------------

class EngineBadUseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = comm::testing::CreateLoopbackGroup(1);
    ASSERT_TRUE(c.ok()) << c.status();
    comm_ = std::move((*c)[0]);
  }
  std::unique_ptr<comm::Communicator> comm_;
};

TEST_F(EngineBadUseTest, RejectsDoubleMarkUnknownIdAndWrongSize) {
  const GradientLayout layout = MakeLayout({4, 4});
  auto engine = Engine::Create(*comm_, layout, PerTensorPlan(layout));
  ASSERT_TRUE(engine.ok());
  std::vector<float> g(4, 1.0f), h(4, 2.0f);
  ASSERT_TRUE((*engine)->MarkReady(0, g.data(), 4).ok());
  absl::Status twice = (*engine)->MarkReady(0, g.data(), 4);
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(twice.message()), HasSubstr("\"t0\") was already marked ready"));
  EXPECT_THAT(std::string((*engine)->MarkReady(2, g.data(), 4).message()),
              HasSubstr("tensor id 2 is not in the layout"));
  EXPECT_THAT(std::string((*engine)->MarkReady(-1, g.data(), 4).message()),
              HasSubstr("tensor id -1"));
  EXPECT_THAT(std::string((*engine)->MarkReady(1, h.data(), 3).message()),
              HasSubstr("gradient has 3 elements, the layout says 4"));
  // None of the rejected calls counted: the iteration still completes.
  ASSERT_TRUE((*engine)->MarkReady(1, h.data(), 4).ok());
  ASSERT_TRUE((*engine)->Finish().ok());
  EXPECT_EQ(g, std::vector<float>(4, 1.0f));
  EXPECT_EQ(h, std::vector<float>(4, 2.0f));
}

TEST_F(EngineBadUseTest, FinishNamesGradientsNeverMarkedAfterDeadline) {
  const GradientLayout layout = MakeLayout({4, 4, 4});
  EngineOptions options;
  options.timeout = absl::Milliseconds(200);
  auto engine = Engine::Create(*comm_, layout, DdpPlan(layout), options);
  ASSERT_TRUE(engine.ok());
  std::vector<float> g(4, 1.0f);
  ASSERT_TRUE((*engine)->MarkReady(1, g.data(), 4).ok());
  const absl::Time start = absl::Now();
  absl::Status s = (*engine)->Finish();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 of 3 gradients were never marked ready"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("0 (\"t0\")"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 (\"t2\")"));
  // The engine is failed from now on.
  EXPECT_EQ((*engine)->MarkReady(0, g.data(), 4).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(EngineBadUseTest, RejectsPlansThatMissOrDuplicateElements) {
  const GradientLayout layout = MakeLayout({4, 4});
  Plan missing;
  missing.buckets = {Bucket{DataType::kFloat32, {{0, 0, 4}, {1, 0, 3}}}};
  auto e1 = Engine::Create(*comm_, layout, missing);
  EXPECT_EQ(e1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(e1.status().message()), HasSubstr("elements [3, 4) are in no bucket"));
  Plan dup;
  dup.buckets = {Bucket{DataType::kFloat32, {{0, 0, 4}, {1, 0, 4}}},
                 Bucket{DataType::kFloat32, {{1, 2, 1}}}};
  auto engine = Engine::Create(*comm_, layout, PerTensorPlan(layout));
  ASSERT_TRUE(engine.ok());
  EXPECT_THAT(std::string((*engine)->SetPlan(dup).message()), HasSubstr("covered twice"));
}

TEST_F(EngineBadUseTest, SetPlanRefusedDuringAnIteration) {
  const GradientLayout layout = MakeLayout({4, 4});
  auto engine = Engine::Create(*comm_, layout, PerTensorPlan(layout));
  ASSERT_TRUE(engine.ok());
  // One buffer per gradient: the engine writes tensor 0's result back while
  // tensor 1 is being marked (TSan flagged a shared buffer here).
  std::vector<float> g0(4, 1.0f), g1(4, 1.0f);
  ASSERT_TRUE((*engine)->MarkReady(0, g0.data(), 4).ok());
  EXPECT_EQ((*engine)->SetPlan(DdpPlan(layout)).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*engine)->MarkReady(1, g1.data(), 4).ok());
  ASSERT_TRUE((*engine)->Finish().ok());
  EXPECT_TRUE((*engine)->SetPlan(DdpPlan(layout)).ok());
}

TEST(EngineAgreementTest, RanksWithDifferentPlansFailOnEveryRank) {
  const GradientLayout layout = MakeLayout({64, 64, 64});
  RunRanks(3, [&](int rank, comm::Communicator& comm) {
    Plan plan = rank == 2 ? DdpPlan(layout) : PerTensorPlan(layout);
    auto engine = Engine::Create(comm, layout, plan);
    ASSERT_FALSE(engine.ok()) << "rank " << rank;
    EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(engine.status().message()), HasSubstr("rank 2 has layout"));
  });
}

}  // namespace
}  // namespace fusebox::bucketing
