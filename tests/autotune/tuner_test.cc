// The online tuner, as the engine's policy, over real UCX communicators
// (ranks as threads of one process) and a real policy-cache directory: it
// tunes, never changes what is computed (every iteration's average is
// checked bit for bit), agrees across ranks, caches, hits the cache with
// zero tuning iterations, seeds a new world size from the nearest cached
// one, falls back by itself when the kept plan turns out slower, survives a
// corrupted entry, and fails clearly when ranks have different models.
#include "autotune/tuner.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bucketing/planners.h"
#include "comm/testing/exact_data.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/run_ranks.h"

namespace fusebox::autotune {
namespace {

using bucketing::GradientLayout;
using ::testing::HasSubstr;

using fusebox::testing::RunRanks;

GradientLayout Layout(int n, int64_t scale = 1) {
  std::vector<bucketing::TensorSpec> specs;
  for (int i = 0; i < n; ++i) {
    specs.push_back({absl::StrCat("layer", i, ".weight"), scale * (1000 + 7919 * (i % 11)),
                     comm::DataType::kFloat32});
  }
  auto layout = GradientLayout::Create(std::move(specs));
  EXPECT_TRUE(layout.ok());
  return *std::move(layout);
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "/fusebox_tuner_XXXXXX";
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A cost model that makes latency matter (so fused plans win in the model).
CostModel TestModel() {
  CostModel m;
  m.name = "test";
  m.ranks_per_node = 64;
  m.intra_busbw_gbps = m.inter_busbw_gbps = 2;
  m.simple = ProtocolLatency{20, 10, 10, 10};
  return m;
}

TunerOptions Options(PolicyCache* cache) {
  TunerOptions o;
  o.candidates = 2;
  o.candidates_when_derived = 1;
  o.profile_iterations = 2;
  o.screening_blocks = 2;
  o.verify_pairs = 5;
  o.cost_model = TestModel();
  o.cache = cache;
  o.backend = "ucx";
  o.network = "test";
  o.model_label = "tuner-test";
  o.check_every = 0;
  o.skip_predicted_slower = 0;  // every candidate screened (but in the test of it)
  return o;
}

// The most iterations a tuning may take with `o` and `candidates` plans
// (the baseline included): profiling, the warm-up block, screening,
// verification (rounds of the baseline, the leader and the runner-up).
int Budget(const TunerOptions& o, int candidates) {
  return o.profile_iterations + (o.warmup_block ? candidates - 1 : 0) +
         o.screening_blocks * candidates + std::min(candidates, 3) * o.verify_pairs;
}

// One replayed iteration: gradients marked in layout order with a short
// gap, each filled with this rank's exact data; after Finish, every
// gradient must hold the exact average. A plan named "slow*" costs 100 ms more
// per iteration (a plan that turned bad).
void Iterate(bucketing::Engine& e, const GradientLayout& layout, int rank, int world,
             std::vector<std::vector<float>>& grads, int* wrong) {
  ASSERT_TRUE(e.StartIteration().ok());
  if (e.plan().name.rfind("slow", 0) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int id = 0; id < layout.size(); ++id) {
    const int64_t n = layout.tensor(id).numel;
    grads[id].resize(n);
    comm::testing::FillInput(grads[id].data(), n, comm::DataType::kFloat32, comm::ReduceOp::kSum,
                             rank, id);
    std::this_thread::sleep_for(std::chrono::microseconds(30));
    ASSERT_TRUE(e.MarkReady(id, grads[id].data(), n).ok());
  }
  absl::Status s = e.Finish();
  ASSERT_TRUE(s.ok()) << s;
  for (int id = 0; id < layout.size(); ++id) {
    const int64_t n = layout.tensor(id).numel;
    std::vector<float> sum(n), want(n);
    comm::testing::FillExpected(sum.data(), n, comm::DataType::kFloat32, comm::ReduceOp::kSum,
                                world, id);
    for (int64_t i = 0; i < n; ++i) want[i] = sum[i] / static_cast<float>(world);
    *wrong += static_cast<int>(comm::testing::CountMismatches(grads[id].data(), want.data(), n,
                                                              comm::DataType::kFloat32));
  }
}

// A tuner on `comm` as the policy of an engine over `layout`; engine null
// (and the test failed) where either cannot be made.
struct TunerEngine {
  std::unique_ptr<bucketing::Engine> engine;
  OnlineTuner* tuner = nullptr;  // owned by the engine
};
TunerEngine MakeTunerEngine(comm::Communicator& comm, const GradientLayout& layout,
                            const TunerOptions& o, const bucketing::EngineOptions& eo = {}) {
  auto tuner = OnlineTuner::Create(comm, layout, o, absl::Minutes(1));
  if (!tuner.ok()) {
    ADD_FAILURE() << tuner.status();
    return {};
  }
  OnlineTuner* t = tuner->get();
  auto engine = bucketing::Engine::Create(comm, layout, t->initial_plan(), eo);
  if (!engine.ok()) {
    ADD_FAILURE() << engine.status();
    return {};
  }
  (*engine)->SetPolicy(*std::move(tuner));
  return {*std::move(engine), t};
}

// Iterates until the tuner has decided, at most 200 iterations.
void IterateUntilTuned(TunerEngine& te, const GradientLayout& layout, int rank, int world,
                       std::vector<std::vector<float>>& grads, int* wrong) {
  for (int guard = 0; te.tuner->phase() != TunerPhase::kTuned && guard < 200; ++guard) {
    Iterate(*te.engine, layout, rank, world, grads, wrong);
  }
}

struct RunResult {
  bool cache_hit = false;
  bool derived = false;
  int tuning_iterations = 0;
  int wrong = 0;
  std::vector<MeasuredPlan> measured;
  int chosen = -1;
  uint64_t plan_hash = 0;
};

// Runs `world` ranks until tuned (at most 200 iterations) plus `extra`
// iterations; returns rank 0's view and checks all ranks agree.
RunResult TuneRun(int world, const std::string& cache_dir, const TunerOptions& base, int extra = 2,
                  std::vector<std::string>* warnings = nullptr) {
  const GradientLayout layout = Layout(24);
  std::vector<RunResult> results(world);
  std::mutex mu;
  RunRanks(world, [&](int rank, comm::Communicator& comm) {
    PolicyCacheOptions co;
    co.dir = cache_dir;
    co.warn = [&](const std::string& w) {
      std::lock_guard<std::mutex> lock(mu);
      if (warnings != nullptr) warnings->push_back(w);
    };
    PolicyCache cache(co);
    TunerOptions o = base;
    o.cache = &cache;
    bucketing::EngineOptions eo;
    eo.record_ready_times = true;
    TunerEngine te = MakeTunerEngine(comm, layout, o, eo);
    ASSERT_NE(te.engine, nullptr);
    OnlineTuner* t = te.tuner;
    RunResult& r = results[rank];
    r.cache_hit = t->cache_hit();
    r.derived = t->derived_from_cache();
    std::vector<std::vector<float>> grads(layout.size());
    IterateUntilTuned(te, layout, rank, world, grads, &r.wrong);
    ASSERT_EQ(t->phase(), TunerPhase::kTuned);
    r.tuning_iterations = t->tuning_iterations();
    for (int i = 0; i < extra; ++i) Iterate(*te.engine, layout, rank, world, grads, &r.wrong);
    r.measured = t->measured();
    r.chosen = t->chosen();
    r.plan_hash = te.engine->plan_hash();
  });
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(results[r].plan_hash, results[0].plan_hash) << "rank " << r;
    EXPECT_EQ(results[r].tuning_iterations, results[0].tuning_iterations);
    EXPECT_EQ(results[r].chosen, results[0].chosen);
  }
  for (const RunResult& r : results) EXPECT_EQ(r.wrong, 0);
  return results[0];
}

TEST(OnlineTunerTest, TunesWithinBudgetCachesAndHitsWithZeroIterations) {
  TempDir dir;
  const TunerOptions o = Options(nullptr);
  RunResult first = TuneRun(2, dir.path(), o);
  EXPECT_FALSE(first.cache_hit);
  // DDP's default first, then its caps and the planner's plans (distinct).
  ASSERT_GE(first.measured.size(), 2u);
  ASSERT_LE(first.measured.size(), 1u + o.ddp_caps.size() + o.candidates);
  EXPECT_EQ(first.measured[0].name, "ddp");
  for (size_t i = 0; i < first.measured.size(); ++i) {
    for (size_t j = 0; j < i; ++j) EXPECT_NE(first.measured[i].hash, first.measured[j].hash);
    EXPECT_GT(first.measured[i].measured_us, 0) << first.measured[i].name;
    // Screening's samples, or verification's for the plans verified (its
    // rounds, or fewer where it stopped early: Note [Stopping verification
    // early], at least as many as can rule a plan out).
    if (first.measured[i].verified) {
      EXPECT_LE(first.measured[i].samples, o.verify_pairs) << first.measured[i].name;
      EXPECT_GE(first.measured[i].samples, 1) << first.measured[i].name;
    } else {
      EXPECT_EQ(first.measured[i].samples, o.screening_blocks) << first.measured[i].name;
    }
  }
  const int k = static_cast<int>(first.measured.size());
  EXPECT_GE(first.tuning_iterations, o.profile_iterations + (k - 1) + o.screening_blocks * k);
  EXPECT_LE(first.tuning_iterations, Budget(o, k));
  ASSERT_GE(first.chosen, 0);
  // One entry in the cache, for this key.
  int files = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
    if (f.path().extension() == ".json") ++files;
  }
  EXPECT_EQ(files, 1);

  RunResult second = TuneRun(2, dir.path(), o);
  EXPECT_TRUE(second.cache_hit);
  EXPECT_EQ(second.tuning_iterations, 0);
  EXPECT_EQ(second.plan_hash, first.measured[first.chosen].hash);
}

TEST(OnlineTunerTest, CandidatesTheModelPredictsMuchSlowerAreNotScreened) {
  TempDir dir;
  TunerOptions o = Options(nullptr);
  // A model where each bucket costs 20 ms and bytes next to nothing: a plan's
  // predicted step grows with its bucket count whatever this machine's
  // ready times (a backward of the test's layout takes about 1 ms). A user
  // with DDP's buckets at a 100 MiB cap (the 1 MiB first bucket, then the
  // rest): the 1 MiB cap (more buckets) is predicted far slower, the
  // planner's fused plans no slower.
  o.cost_model->simple = ProtocolLatency{20000, 0, 0, 0};
  o.cost_model->intra_busbw_gbps = o.cost_model->inter_busbw_gbps = 1000;
  o.baseline_cap_bytes = int64_t{100} << 20;
  o.skip_predicted_slower = 0.05;
  RunResult r = TuneRun(2, dir.path(), o);
  ASSERT_GE(r.measured.size(), 3u);
  const double base = r.measured[0].predicted_us;
  ASSERT_GT(base, 0);
  int skipped = 0, screened = 0;
  std::string predicted = absl::StrCat("baseline ", base, " us");
  for (size_t i = 1; i < r.measured.size(); ++i) {
    const MeasuredPlan& m = r.measured[i];
    absl::StrAppend(&predicted, "; ", m.name, " ", m.predicted_us, " us");
    ASSERT_GT(m.predicted_us, 0) << m.name;
    if (m.predicted_us >= 1.05 * base) {
      ++skipped;
      EXPECT_FALSE(m.screened) << m.name;
      EXPECT_EQ(m.samples, 0) << m.name;
      EXPECT_FALSE(m.verified) << m.name;
    } else {
      ++screened;
      EXPECT_TRUE(m.screened) << m.name;
      EXPECT_GE(m.samples, 1) << m.name;
    }
  }
  // The model rules the 1 MiB cap out and keeps the planner's plans.
  EXPECT_GE(skipped, 1) << predicted;
  EXPECT_GE(screened, 1) << predicted;
  ASSERT_GE(r.chosen, 0);
  EXPECT_TRUE(r.measured[r.chosen].screened);
  // Screening visited the baseline and the screened candidates only.
  EXPECT_LE(r.tuning_iterations, Budget(o, screened + 1));
  EXPECT_GE(r.tuning_iterations,
            o.profile_iterations + screened + o.screening_blocks * (screened + 1));
}

TEST(OnlineTunerTest, NewWorldSizeIsSeededFromTheNearestCachedOne) {
  TempDir dir;
  TunerOptions o = Options(nullptr);
  o.ranks_per_node = 1;  // as on a cluster: the node shape stays, the world grows
  RunResult two = TuneRun(2, dir.path(), o, 0);
  RunResult three = TuneRun(3, dir.path(), o, 0);
  EXPECT_FALSE(three.cache_hit);
  EXPECT_TRUE(three.derived);
  ASSERT_GE(three.measured.size(), 2u);
  // The 2-rank winner is among the 3-rank candidates (under its own name,
  // or under a DDP cap's or the default's when it is one of those).
  bool seeded = false;
  for (const MeasuredPlan& m : three.measured) seeded |= m.hash == two.measured[two.chosen].hash;
  EXPECT_TRUE(seeded);
  // Fewer of the planner's plans than a full search: candidates_when_derived.
  auto planner_plans = [](const RunResult& r) {
    int n = 0;
    for (const MeasuredPlan& m : r.measured) n += m.name.rfind("tuned", 0) == 0;
    return n;
  };
  EXPECT_LE(planner_plans(three), o.candidates_when_derived);
  EXPECT_LE(planner_plans(two), o.candidates);
  RunResult again = TuneRun(3, dir.path(), o, 0);
  EXPECT_TRUE(again.cache_hit);
}

TEST(OnlineTunerTest, CorruptedEntryIsReportedIgnoredAndReplaced) {
  TempDir dir;
  const TunerOptions o = Options(nullptr);
  RunResult first = TuneRun(2, dir.path(), o, 0);
  std::string file;
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
    if (f.path().extension() == ".json") file = f.path().string();
  }
  ASSERT_FALSE(file.empty());
  std::ofstream(file, std::ios::trunc) << "{\"format\": \"fusebox-policy\", \"version\": 1, \"ke";
  std::vector<std::string> warnings;
  RunResult second = TuneRun(2, dir.path(), o, 0, &warnings);
  EXPECT_FALSE(second.cache_hit);
  EXPECT_GT(second.tuning_iterations, 0);
  ASSERT_FALSE(warnings.empty());
  EXPECT_THAT(warnings[0], HasSubstr(std::filesystem::path(file).filename().string()));
  RunResult third = TuneRun(2, dir.path(), o, 0);
  EXPECT_TRUE(third.cache_hit);
}

TEST(OnlineTunerTest, AKeptPlanThatTurnsSlowerFallsBackToTheDefault) {
#if defined(__SANITIZE_THREAD__)
  // Under ThreadSanitizer an iteration takes about a second, which a 100 ms
  // penalty cannot be told apart from; the decision logic itself is
  // covered deterministically by TunerDecisionTest (decision_test.cc).
  GTEST_SKIP() << "a timing test: not meaningful under ThreadSanitizer";
#endif
  const GradientLayout layout = Layout(24);
  TunerOptions o = Options(nullptr);
  o.check_every = 2;  // raised to kMinCheckEvery by CheckEvery
  o.check_pairs = 1;
  // The interval also grows with the kept plan's gain (a check may cost at
  // most max_check_cost of the run); at the largest budget it stays at the
  // minimum for any gain, so that the window below holds enough checks even
  // where tuning kept a plan that saves much (as under a sanitizer).
  o.max_check_cost = 0.5;
  std::vector<int> fallbacks(2, -1), wrong(2, 0);
  std::vector<uint64_t> final_hash(2, 0);
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    TunerEngine te = MakeTunerEngine(comm, layout, o);
    ASSERT_NE(te.engine, nullptr);
    OnlineTuner* t = te.tuner;
    std::vector<std::vector<float>> grads(layout.size());
    IterateUntilTuned(te, layout, rank, 2, grads, &wrong[rank]);
    // A bad plan injected after tuning: 100 ms slower per iteration.
    bucketing::Plan slow = bucketing::PerTensorPlan(layout);
    slow.name = "slow-per-tensor";
    t->ForceChosen(slow);
    // A check every kMinCheckEvery iterations (plus its control). Without a
    // noise estimate the regression test waits for 4 pairs. On a loaded
    // machine (a sanitizer build beside another test) the pairs' noise can
    // be of the order of the loss itself; the CUSUM's threshold grows with
    // that noise and its clipped increments then need tens of pairs: 40
    // pairs at most (the loop ends at the fallback, after 4-6 pairs on a
    // quiet machine).
    EXPECT_EQ(t->check_interval(), kMinCheckEvery);
    const int window = 40 * (t->check_interval() + 1) + 3;
    for (int i = 0; i < window && t->fallbacks() == 0; ++i) {
      Iterate(*te.engine, layout, rank, 2, grads, &wrong[rank]);
    }
    Iterate(*te.engine, layout, rank, 2, grads, &wrong[rank]);
    fallbacks[rank] = t->fallbacks();
    EXPECT_GE(t->checks(), 1) << "rank " << rank;
    final_hash[rank] = te.engine->plan_hash();
    EXPECT_THAT(t->decision(), HasSubstr("fell back to DDP's default"));
  });
  const uint64_t ddp = bucketing::PlanHash(bucketing::DdpPlan(layout));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(fallbacks[r], 1) << "rank " << r;
    EXPECT_EQ(final_hash[r], ddp) << "rank " << r;
    EXPECT_EQ(wrong[r], 0);
  }
}

// ForceChosen without checks (what perf/trust_worker.py's judging blocks use
// to time every measured candidate alone): no control step runs, nothing
// falls back, however slow the plan, until the next ForceChosen; and
// measured_plan(i) is the plan measured()[i] was measured with.
TEST(OnlineTunerTest, AForcedPlanWithoutChecksRunsAloneUntilForcedAgain) {
  const GradientLayout layout = Layout(24);
  TunerOptions o = Options(nullptr);
  o.check_every = 2;  // raised to kMinCheckEvery: a check pair every 6 iterations
  o.check_pairs = 1;
  o.max_check_cost = 0.5;
  std::vector<int> checks(2, -1), fallbacks(2, -1), wrong(2, 0);
  std::vector<uint64_t> forced_hash(2, 0), back_hash(2, 0), baseline_hash(2, 1);
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    TunerEngine te = MakeTunerEngine(comm, layout, o);
    ASSERT_NE(te.engine, nullptr);
    OnlineTuner* t = te.tuner;
    std::vector<std::vector<float>> grads(layout.size());
    IterateUntilTuned(te, layout, rank, 2, grads, &wrong[rank]);
    const int n = static_cast<int>(t->measured().size());
    ASSERT_GE(n, 2);
    EXPECT_EQ(t->measured_plan(-1), nullptr);
    EXPECT_EQ(t->measured_plan(n), nullptr);
    for (int i = 0; i < n; ++i) {
      ASSERT_NE(t->measured_plan(i), nullptr);
      EXPECT_EQ(bucketing::PlanHash(*t->measured_plan(i)), t->measured()[i].hash) << i;
    }
    bucketing::Plan slow = bucketing::PerTensorPlan(layout);
    slow.name = "slow-per-tensor";  // 100 ms slower per iteration (Iterate)
    const int checks_before = t->checks();
    t->ForceChosen(slow, /*checks=*/false);
    for (int i = 0; i < 3 * (kMinCheckEvery + 1) + 2; ++i) {
      Iterate(*te.engine, layout, rank, 2, grads, &wrong[rank]);
      EXPECT_FALSE(t->TimesNextBoundary()) << "iteration " << i;
    }
    checks[rank] = t->checks() - checks_before;
    fallbacks[rank] = t->fallbacks();
    forced_hash[rank] = te.engine->plan_hash();
    t->ForceChosen(*t->measured_plan(0), /*checks=*/false);
    for (int i = 0; i < 2; ++i) Iterate(*te.engine, layout, rank, 2, grads, &wrong[rank]);
    back_hash[rank] = te.engine->plan_hash();
    baseline_hash[rank] = t->measured()[0].hash;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(checks[r], 0) << "rank " << r;
    EXPECT_EQ(fallbacks[r], 0) << "rank " << r;
    EXPECT_EQ(forced_hash[r], bucketing::PlanHash(bucketing::PerTensorPlan(layout))) << r;
    EXPECT_EQ(back_hash[r], baseline_hash[r]) << "rank " << r;
    EXPECT_EQ(wrong[r], 0);
  }
}

TEST(OnlineTunerTest, CalibratesTheCostModelWhenNoneIsGiven) {
  TempDir dir;
  TunerOptions o = Options(nullptr);
  o.cost_model.reset();
  o.calibration_max_bytes = 1 << 20;
  o.candidates = 1;
  o.ddp_caps.clear();
  RunResult r = TuneRun(2, dir.path(), o, 0);
  EXPECT_EQ(r.measured.size(), 2u);
  EXPECT_GT(r.measured[1].predicted_us, 0);
}

TEST(OnlineTunerTest, ARunWithNothingToMeasureStillCachesTheDefault) {
  // No planner plans and no caps: the default is the only candidate; the
  // decision is still remembered, so the next run spends nothing.
  TempDir dir;
  TunerOptions o = Options(nullptr);
  o.candidates = 0;
  o.ddp_caps.clear();
  RunResult first = TuneRun(2, dir.path(), o, 0);
  EXPECT_EQ(first.measured.size(), 1u);
  EXPECT_EQ(first.tuning_iterations, o.profile_iterations);
  RunResult second = TuneRun(2, dir.path(), o, 0);
  EXPECT_TRUE(second.cache_hit);
  EXPECT_EQ(second.tuning_iterations, 0);
}

TEST(OnlineTunerTest, RanksWithDifferentModelsFailOnEveryRank) {
  std::vector<absl::Status> status(2);
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    TunerOptions o = Options(nullptr);
    auto tuner = OnlineTuner::Create(comm, Layout(rank == 0 ? 24 : 25), o, absl::Seconds(20));
    status[rank] = tuner.status();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(status[r].ok()) << "rank " << r;
    EXPECT_THAT(status[r].message(), HasSubstr("rank")) << status[r];
  }
}

TEST(OnlineTunerTest, RejectsBadOptions) {
  RunRanks(1, [&](int, comm::Communicator& comm) {
    TunerOptions o = Options(nullptr);
    o.verify_pairs = 4;  // cannot show 95% confidence
    auto few = OnlineTuner::Create(comm, Layout(4), o, absl::Seconds(5));
    ASSERT_FALSE(few.ok());
    EXPECT_THAT(few.status().message(), HasSubstr("must be in [5, 256]"));
    o = Options(nullptr);
    o.verify_pairs = 257;  // past the exact signed-rank table
    EXPECT_FALSE(OnlineTuner::Create(comm, Layout(4), o, absl::Seconds(5)).ok());
    o = Options(nullptr);
    o.early_share = 1;
    EXPECT_FALSE(OnlineTuner::Create(comm, Layout(4), o, absl::Seconds(5)).ok());
    o = Options(nullptr);
    o.verify_look_every = -1;
    EXPECT_FALSE(OnlineTuner::Create(comm, Layout(4), o, absl::Seconds(5)).ok());
    o = Options(nullptr);
    o.rule.min_gain = -0.01;
    EXPECT_FALSE(OnlineTuner::Create(comm, Layout(4), o, absl::Seconds(5)).ok());
    o = Options(nullptr);
    o.screening_blocks = 0;
    EXPECT_FALSE(OnlineTuner::Create(comm, Layout(4), o, absl::Seconds(5)).ok());
    o = Options(nullptr);
    o.network = "has space";
    auto t = OnlineTuner::Create(comm, Layout(4), o, absl::Seconds(5));
    ASSERT_FALSE(t.ok());
    EXPECT_THAT(t.status().message(), HasSubstr("network"));
  });
}

}  // namespace
}  // namespace fusebox::autotune
