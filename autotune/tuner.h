// OnlineTuner: tunes the bucket plan in the first iterations of a real run
// and remembers it in the policy cache.
//
//   auto tuner = OnlineTuner::Create(comm, layout, engine_options, tuner_options);  // collective
//   for each iteration:
//     Engine& e = tuner->engine();   // may change plan between iterations
//     e.StartIteration(); e.MarkReady(...)...;
//     tuner->Finish();               // instead of e.Finish()
//
// Note [Closed-loop tuning]
// 1. Cache: rank 0 looks the key up (model signature, world size, ranks
//    per node, backend, network) and broadcasts what it found. An exact hit
//    is applied at once: zero tuning iterations.
// 2. Otherwise the run starts on the DDP default (25 MiB buckets). Its
//    iterations (warm-up, then `measure_iterations`) are timed and their
//    per-gradient ready times recorded: the profile of this model on this
//    machine.
// 3. Rank 0 builds the profile (slowest rank's ready times), takes the cost
//    model (given, or fitted to allreduces measured on this communicator
//    between iterations), and ranks candidates with the planner
//    (RankCandidates): the DP optimum, the optima with the per-collective
//    latency x1/4 and x4 (the model's least certain term: more and fewer
//    buckets), the best predicted baseline, and, for a world size not yet
//    cached, the plan of the nearest cached size first. It broadcasts them with their hashes;
//    every rank checks each hash, and Engine::SetPlan checks agreement
//    across ranks before the first collective of each plan.
// 4. Each candidate runs for warm-up + measure iterations. An iteration's
//    time is the slowest rank's (StartIteration to Finish, which is where
//    plans differ); a plan's figure is the median.
// 5. The fastest measured plan wins. DDP's default was measured in the
//    same run, so the chosen plan is never slower than it as measured (the
//    guard). Rank 0 stores the entry; the engine keeps the plan.
// 6. Drift: every `drift_window` iterations the window's median (slowest
//    rank) is compared with the entry's figure; after `drift_windows`
//    consecutive windows worse by more than `drift_threshold`, tuning
//    starts again from step 2 and the entry is replaced.
// Every decision uses values all ranks share (broadcast or max-reduced), so
// ranks always agree on the plan and on when it changes. The extra
// collectives run between iterations: one small max-allreduce per measured
// plan, and one per drift window afterwards.
#ifndef FUSEBOX_AUTOTUNE_TUNER_H_
#define FUSEBOX_AUTOTUNE_TUNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "autotune/cost_model.h"
#include "autotune/planner.h"
#include "autotune/policy_cache.h"
#include "bucketing/engine.h"
#include "comm/communicator.h"

namespace fusebox::autotune {

struct TunerOptions {
  // Search settings; sim.world_size is taken from the communicator.
  PlannerOptions planner;
  // Plans measured besides the DDP default (fewer when a nearer cached
  // world size seeds the search).
  int candidates = 4;
  int candidates_when_derived = 2;
  int warmup_iterations = 1;   // per plan, after switching to it
  int measure_iterations = 5;  // median of these
  // The cost model; when absent it is fitted to allreduces measured on the
  // communicator (sizes up to calibration_max_bytes; 0: the gradients'
  // total, at most 256 MiB).
  std::optional<CostModel> cost_model;
  int64_t calibration_max_bytes = 0;
  // The cache (not owned; may be null) and the key's fields besides the
  // model signature and world size.
  PolicyCache* cache = nullptr;
  std::string backend = "unknown";
  std::string network = "local";
  int ranks_per_node = 0;  // 0: all ranks on one node
  std::string model_label;  // stored in the entry for humans
  // Drift (step 6); drift_window 0 disables it.
  double drift_threshold = 0.15;
  int drift_window = 50;
  int drift_windows = 2;
  // Progress lines (rank 0 only); may be empty.
  std::function<void(const std::string&)> log;
  // Wall clock for the entry's created_unix_s; may be empty (0 is stored).
  std::function<int64_t()> wall_clock_s;
};

enum class TunerPhase { kMeasuring, kTuned };

struct MeasuredPlan {
  std::string name;
  uint64_t hash = 0;
  double predicted_us = 0;  // simulator, backward start to end (0 for the default)
  double measured_us = 0;   // median over measured iterations, slowest rank
};

class OnlineTuner {
 public:
  // Collective. Validates the options, looks the cache up (rank 0) and
  // creates the engine with the cached plan or the DDP default.
  static absl::StatusOr<std::unique_ptr<OnlineTuner>> Create(comm::Communicator& comm,
                                                             bucketing::GradientLayout layout,
                                                             bucketing::EngineOptions engine_options,
                                                             TunerOptions options);

  bucketing::Engine& engine() { return *engine_; }
  // Engine::Finish, then one step of Note [Closed-loop tuning]. Collective.
  absl::Status Finish();

  TunerPhase phase() const { return phase_; }
  bool cache_hit() const { return cache_hit_; }
  bool derived_from_cache() const { return derived_; }
  // Iterations spent measuring plans since the last (re)start of tuning.
  int tuning_iterations() const { return tuning_iterations_; }
  int retunes() const { return retunes_; }
  // The plans measured in the last tuning (the default first), and the
  // index of the chosen one (-1 until tuned, or after a cache hit).
  const std::vector<MeasuredPlan>& measured() const { return measured_; }
  int chosen() const { return chosen_; }
  // The figure drift is judged against (from the cache or the last tuning).
  double reference_us() const { return reference_us_; }
  const CacheKey& key() const { return key_; }
  // The cost model the last search used (empty name before one).
  const CostModel& cost_model() const { return cost_; }

 private:
  OnlineTuner(comm::Communicator& comm, bucketing::GradientLayout layout, TunerOptions options);
  absl::Status StartTuning();
  absl::Status EndOfPlan();
  absl::Status Search(double default_backward_us, const std::vector<double>& ready_us);
  absl::Status SwitchTo(bucketing::Plan plan);
  absl::Status Conclude();
  absl::Status CheckDrift(double iteration_us);
  void Log(const std::string& line) const;

  comm::Communicator& comm_;
  const bucketing::GradientLayout layout_;
  TunerOptions options_;
  bucketing::EngineOptions engine_options_;
  CacheKey key_;
  std::unique_ptr<bucketing::Engine> engine_;

  TunerPhase phase_ = TunerPhase::kMeasuring;
  bool cache_hit_ = false;
  bool derived_ = false;
  std::optional<bucketing::Plan> nearest_plan_;  // seed from a nearer cached size
  int tuning_iterations_ = 0;
  int retunes_ = 0;
  // The plan being measured: its index in plans_, iterations run on it,
  // and the local iteration and ready times of its measured iterations.
  std::vector<bucketing::Plan> plans_;
  std::vector<MeasuredPlan> measured_;
  int current_ = 0;
  int steps_ = 0;
  std::vector<double> times_;
  std::vector<double> backward_;
  std::vector<std::vector<double>> ready_;
  int chosen_ = -1;
  std::optional<bucketing::Plan> chosen_plan_;  // the incumbent, seeded into a retune
  CostModel cost_;
  // Drift monitoring.
  double reference_us_ = 0;
  std::vector<double> window_;
  int windows_over_ = 0;
};

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_TUNER_H_
