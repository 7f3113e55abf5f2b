// The online tuner over real UCX communicators (ranks as threads of one
// process) and a real policy-cache directory: it tunes, never changes what
// is computed (every iteration's average is checked bit for bit), agrees
// across ranks, caches, hits the cache with zero tuning iterations, seeds a
// new world size from the nearest cached one, retunes on drift, survives a
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
#include "comm/memory_store.h"
#include "comm/testing/exact_data.h"
#include "comm/ucx/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusebox::autotune {
namespace {

using bucketing::GradientLayout;
using ::testing::HasSubstr;

using RankFn = std::function<void(int rank, comm::Communicator& comm)>;

void RunRanks(int world, const RankFn& fn) {
  comm::MemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto c = comm::CreateUcxCommunicator({}, r, world, store);
      ASSERT_TRUE(c.ok()) << c.status();
      fn(r, **c);
    });
  }
  for (auto& t : threads) t.join();
}

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
  o.candidates = 3;
  o.candidates_when_derived = 1;
  o.warmup_iterations = 1;
  o.measure_iterations = 3;
  o.cost_model = TestModel();
  o.cache = cache;
  o.backend = "ucx";
  o.network = "test";
  o.model_label = "tuner-test";
  o.drift_window = 0;
  return o;
}

// One replayed iteration: gradients marked in layout order with a short
// gap, each filled with this rank's exact data; after Finish, every
// gradient must hold the exact average.
void Iterate(OnlineTuner& tuner, const GradientLayout& layout, int rank, int world,
             std::vector<std::vector<float>>& grads, int* wrong) {
  bucketing::Engine& e = tuner.engine();
  e.StartIteration();
  for (int id = 0; id < layout.size(); ++id) {
    const int64_t n = layout.tensor(id).numel;
    grads[id].resize(n);
    comm::testing::FillInput(grads[id].data(), n, comm::DataType::kFloat32, comm::ReduceOp::kSum,
                             rank, id);
    std::this_thread::sleep_for(std::chrono::microseconds(30));
    ASSERT_TRUE(e.MarkReady(id, grads[id].data(), n).ok());
  }
  absl::Status s = tuner.Finish();
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
    auto tuner = OnlineTuner::Create(comm, layout, {}, o);
    ASSERT_TRUE(tuner.ok()) << tuner.status();
    RunResult& r = results[rank];
    r.cache_hit = (*tuner)->cache_hit();
    r.derived = (*tuner)->derived_from_cache();
    std::vector<std::vector<float>> grads(layout.size());
    int guard = 0;
    while ((*tuner)->phase() != TunerPhase::kTuned && guard++ < 200) {
      Iterate(**tuner, layout, rank, world, grads, &r.wrong);
    }
    ASSERT_EQ((*tuner)->phase(), TunerPhase::kTuned);
    r.tuning_iterations = (*tuner)->tuning_iterations();
    for (int i = 0; i < extra; ++i) Iterate(**tuner, layout, rank, world, grads, &r.wrong);
    r.measured = (*tuner)->measured();
    r.chosen = (*tuner)->chosen();
    r.plan_hash = (*tuner)->engine().plan_hash();
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
  // DDP default + 3 candidates, each 1 warm-up + 3 measured iterations.
  ASSERT_EQ(first.measured.size(), 4u);
  EXPECT_EQ(first.measured[0].name, "ddp");
  EXPECT_EQ(first.tuning_iterations, 4 * 4);
  ASSERT_GE(first.chosen, 0);
  // The guard: the chosen plan is the fastest measured, DDP included.
  for (const MeasuredPlan& m : first.measured) {
    EXPECT_GT(m.measured_us, 0) << m.name;
    EXPECT_LE(first.measured[first.chosen].measured_us, m.measured_us) << m.name;
  }
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

TEST(OnlineTunerTest, NewWorldSizeIsSeededFromTheNearestCachedOne) {
  TempDir dir;
  TunerOptions o = Options(nullptr);
  o.ranks_per_node = 1;  // as on a cluster: the node shape stays, the world grows
  RunResult two = TuneRun(2, dir.path(), o, 0);
  RunResult three = TuneRun(3, dir.path(), o, 0);
  EXPECT_FALSE(three.cache_hit);
  EXPECT_TRUE(three.derived);
  ASSERT_GE(three.measured.size(), 2u);
  if (two.chosen == 0) {
    // The 2-rank winner was DDP's default itself: the seed is the default,
    // measured first anyway.
    EXPECT_EQ(three.measured[0].hash, two.measured[0].hash);
  } else {
    EXPECT_EQ(three.measured[1].name, "cached-w2");
    EXPECT_EQ(three.measured[1].hash, two.measured[two.chosen].hash);
  }
  // Seed + candidates_when_derived (1), fewer than a full search.
  EXPECT_LE(three.measured.size(), 3u);
  EXPECT_LT(three.tuning_iterations, two.tuning_iterations);
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

TEST(OnlineTunerTest, DriftRetunesAndReplacesTheEntry) {
  TempDir dir;
  const GradientLayout layout = Layout(24);
  {
    // A stale entry claiming 1 us per iteration.
    PolicyCacheOptions co;
    co.dir = dir.path();
    PolicyCache cache(co);
    CacheEntry e;
    e.key = CacheKey{ModelSignature(layout), 2, 2, "ucx", "test"};
    e.layout_hash = layout.Hash();
    e.plan = bucketing::PerTensorPlan(layout);
    e.measured_iteration_us = 1;
    ASSERT_TRUE(cache.Store(e).ok());
  }
  TunerOptions o = Options(nullptr);
  o.drift_window = 3;
  o.drift_windows = 2;
  std::vector<int> retunes(2);
  std::vector<int> wrong(2);
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    PolicyCacheOptions co;
    co.dir = dir.path();
    PolicyCache cache(co);
    TunerOptions ro = o;
    ro.cache = &cache;
    auto tuner = OnlineTuner::Create(comm, layout, {}, ro);
    ASSERT_TRUE(tuner.ok()) << tuner.status();
    EXPECT_TRUE((*tuner)->cache_hit());
    std::vector<std::vector<float>> grads(layout.size());
    // Two windows of 3 over the recorded figure: tuning restarts.
    for (int i = 0; i < 6; ++i) Iterate(**tuner, layout, rank, 2, grads, &wrong[rank]);
    EXPECT_EQ((*tuner)->phase(), TunerPhase::kMeasuring);
    int guard = 0;
    while ((*tuner)->phase() != TunerPhase::kTuned && guard++ < 200) {
      Iterate(**tuner, layout, rank, 2, grads, &wrong[rank]);
    }
    retunes[rank] = (*tuner)->retunes();
    // The incumbent was measured again as a seed.
    bool saw_previous = false;
    for (const MeasuredPlan& m : (*tuner)->measured()) saw_previous |= m.name == "previous";
    EXPECT_TRUE(saw_previous);
  });
  EXPECT_EQ(retunes, (std::vector<int>{1, 1}));
  EXPECT_EQ(wrong, (std::vector<int>{0, 0}));
  PolicyCacheOptions co;
  co.dir = dir.path();
  PolicyCache cache(co);
  auto hit = cache.Lookup(CacheKey{ModelSignature(layout), 2, 2, "ucx", "test"}, layout);
  ASSERT_TRUE(hit.has_value());
  EXPECT_GT(hit->measured_iteration_us, 1);
  EXPECT_GT(hit->tuning_iterations, 0);
}

TEST(OnlineTunerTest, CalibratesTheCostModelWhenNoneIsGiven) {
  TempDir dir;
  TunerOptions o = Options(nullptr);
  o.cost_model.reset();
  o.calibration_max_bytes = 1 << 20;
  o.candidates = 1;
  RunResult r = TuneRun(2, dir.path(), o, 0);
  EXPECT_EQ(r.measured.size(), 2u);
  EXPECT_GT(r.measured[1].predicted_us, 0);
}

TEST(OnlineTunerTest, RanksWithDifferentModelsFailOnEveryRank) {
  std::vector<absl::Status> status(2);
  RunRanks(2, [&](int rank, comm::Communicator& comm) {
    TunerOptions o = Options(nullptr);
    bucketing::EngineOptions eo;
    eo.timeout = absl::Seconds(20);
    auto tuner = OnlineTuner::Create(comm, Layout(rank == 0 ? 24 : 25), eo, o);
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
    o.measure_iterations = 0;
    EXPECT_FALSE(OnlineTuner::Create(comm, Layout(4), {}, o).ok());
    o = Options(nullptr);
    o.network = "has space";
    auto t = OnlineTuner::Create(comm, Layout(4), {}, o);
    ASSERT_FALSE(t.ok());
    EXPECT_THAT(t.status().message(), HasSubstr("network"));
  });
}

}  // namespace
}  // namespace fusebox::autotune
