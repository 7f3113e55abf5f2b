// OnlineTuner: a plan policy (bucketing/policy.h) that tunes the bucket plan
// in the first iterations of a real run, keeps checking it afterwards, and
// remembers it in the policy cache.
//
//   auto made = CreateEngineWithPolicy(comm, layout, engine_options, choice);  // collective
//   for each iteration:
//     made->engine->StartIteration();   // where the step starts: the tuner acts here
//     made->engine->MarkReady(...)...;
//     made->engine->Finish();
//
// Note [Closed-loop tuning]
// 1. Cache: rank 0 looks the key up (model signature, world size, ranks
//    per node, backend, network) and broadcasts what it found. An exact hit
//    is applied at once: zero tuning iterations; the checks of step 5 still
//    run, on this run's own workload.
// 2. Profiling: the run starts on DDP's default (25 MiB buckets, 1 MiB
//    first). `profile_iterations` whole iterations are timed and their
//    per-gradient ready times recorded: the profile of this model on this
//    machine. Rank 0 builds it (slowest rank's ready times), takes the cost
//    model (given, or fitted to allreduces measured on this communicator
//    between iterations), and ranks candidates with the planner. The
//    candidates are: DDP's default; DDP at the hand-set caps users try
//    (`ddp_caps`, 1, 5 and 100 MiB by default); the planner's best
//    `candidates` plans; and, for a world size not yet cached, the plan of
//    the nearest cached size. Duplicates (same hash) are measured once.
//    Rank 0 broadcasts the list with hashes; every rank checks each hash.
// 3. Screening: an unmeasured warm-up block (every candidate but the
//    default once), then `screening_blocks` randomised blocks over the
//    candidates, one whole iteration per visit (Note [Decisions under
//    noise] in decision.h). The lowest median is the pick, even when it
//    is not below the default's: screening only ranks.
// 4. Verification (skipped only when even the pick's fastest screening
//    iteration was slower than the default's slowest): `verify_pairs`
//    alternating pairs of the default and the pick; the pick replaces the default only when it is faster with the
//    rule's confidence and by more than its minimum effect. Otherwise the
//    default stays, and the log says why. Rank 0 stores the entry.
// 5. Checking: every `check_every` iterations one iteration of the default
//    runs, paired with the next iteration of the chosen plan; when a window
//    of `check_pairs` pairs proves the chosen plan slower than the default
//    (same rule), the tuner falls back to the default and rewrites the
//    entry.
// Every decision uses values all ranks share (broadcast or max-reduced), so
// ranks always agree on the plan and on when it changes. The extra
// collectives run between iterations: one small max-allreduce per block.
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
#include "autotune/decision.h"
#include "autotune/planner.h"
#include "autotune/policy_cache.h"
#include "bucketing/engine.h"
#include "bucketing/policy.h"
#include "comm/communicator.h"

namespace fusebox::autotune {

struct TunerOptions {
  // Search settings; sim.world_size is taken from the communicator.
  PlannerOptions planner;
  // The planner's plans measured besides DDP's default and caps (fewer when
  // a nearer cached world size seeds the search).
  int candidates = 2;
  int candidates_when_derived = 1;
  // DDP's bucket_cap_mb values users set by hand (bytes), each measured as
  // a candidate; DDP's default (25 MiB) is always the baseline.
  std::vector<int64_t> ddp_caps = {int64_t{1} << 20, int64_t{5} << 20, int64_t{100} << 20};
  int profile_iterations = 3;  // before the search
  // Profiling runs DDP's buckets at this cap (1 MiB first) instead of the
  // default: where ready times are known per bucket only (the DDP hook),
  // small buckets give the search a finer profile. 0: the default.
  int64_t profile_cap_bytes = 0;
  // Screening starts with one unmeasured visit of every candidate but the
  // plan profiling ran (already warm): each candidate's first run on
  // fresh buffers (allocation, page faults, backend registration) is then
  // excluded alike, so every measured visit is a switch between warm plans.
  bool warmup_block = true;
  int screening_blocks = 2;
  int verify_pairs = 8;
  SwitchRule rule;
  // After the decision: one default iteration every `check_every` (0: never
  // check), judged per window of `check_pairs` pairs.
  int check_every = 25;
  int check_pairs = 8;
  uint64_t seed = 1;  // the blocks' random order (identical on every rank)
  // The cost model; when absent it is fitted to allreduces measured on the
  // communicator (sizes up to calibration_max_bytes; 0: the gradients'
  // total, at most 32 MiB).
  std::optional<CostModel> cost_model;
  int64_t calibration_max_bytes = 0;
  // The cache (not owned; may be null) and the key's fields besides the
  // model signature and world size.
  PolicyCache* cache = nullptr;
  std::string backend = "unknown";
  std::string network = "local";
  int ranks_per_node = 0;  // 0: all ranks on one node
  std::string model_label;  // stored in the entry for humans
  // Progress lines (rank 0 only); may be empty.
  std::function<void(const std::string&)> log;
  // Wall clock for the entry's created_unix_s; may be empty (0 is stored).
  std::function<int64_t()> wall_clock_s;
};

enum class TunerPhase { kProfiling, kScreening, kVerifying, kTuned };
const char* TunerPhaseName(TunerPhase phase);

struct MeasuredPlan {
  std::string name;
  uint64_t hash = 0;
  int buckets = 0;
  double predicted_us = 0;  // simulator, backward start to end (0 when unknown)
  double measured_us = 0;   // median of its screening iterations, slowest rank
  double ci_low_us = 0, ci_high_us = 0;  // 95% interval of that median
  int samples = 0;
};

class OnlineTuner final : public bucketing::PlanPolicy {
 public:
  // Collective. Validates the options, checks that every rank has the same
  // layout, looks the cache up (rank 0) and picks the first plan: the cached
  // one, or DDP's default. `owned_cache`, when given, is used (and kept
  // alive) instead of options.cache.
  static absl::StatusOr<std::unique_ptr<OnlineTuner>> Create(
      comm::Communicator& comm, bucketing::GradientLayout layout, TunerOptions options,
      absl::Duration timeout, std::unique_ptr<PolicyCache> owned_cache = nullptr);

  const bucketing::Plan& initial_plan() const { return initial_; }

  absl::StatusOr<std::optional<bucketing::Plan>> OnIterationEnd(
      const bucketing::IterationStats& last, const bucketing::Plan& current) override;

  TunerPhase phase() const { return phase_; }
  bool cache_hit() const { return cache_hit_; }
  bool derived_from_cache() const { return derived_; }
  // Iterations spent before the decision (0 on a cache hit) and the time
  // they took beyond DDP's default median (the cost of tuning, us).
  int tuning_iterations() const { return tuning_iterations_; }
  double tuning_cost_us() const { return tuning_cost_us_; }
  // Falls back to the default after checks proved the chosen plan slower.
  int fallbacks() const { return fallbacks_; }
  int checks() const { return checks_; }
  // The plans measured (the default first), and the index of the chosen
  // one (-1 until decided, or after a cache hit).
  const std::vector<MeasuredPlan>& measured() const { return measured_; }
  int chosen() const { return chosen_; }
  const Verdict& verdict() const { return verdict_; }
  const std::string& decision() const { return decision_; }
  const CacheKey& key() const { return key_; }
  // The cost model the last search used (empty name before one).
  const CostModel& cost_model() const { return cost_; }
  // Test hook: adopt `plan` as if it had been chosen (checks then judge it).
  void ForceChosen(bucketing::Plan plan);

 private:
  OnlineTuner(comm::Communicator& comm, bucketing::GradientLayout layout, TunerOptions options,
              absl::Duration timeout);
  absl::Status Search(double backward_us, const std::vector<double>& ready_us);
  void StartBlock();
  absl::StatusOr<std::optional<bucketing::Plan>> EndScreening();
  absl::Status Decide();
  absl::Status StoreEntry();
  absl::StatusOr<std::optional<bucketing::Plan>> Check(double sample);
  std::optional<bucketing::Plan> Visit(int candidate);
  void Log(const std::string& line) const;

  comm::Communicator& comm_;
  const bucketing::GradientLayout layout_;
  TunerOptions options_;
  const absl::Duration timeout_;
  std::unique_ptr<PolicyCache> owned_cache_;
  CacheKey key_;
  bucketing::Plan initial_;
  bucketing::Plan default_;  // DDP's default

  TunerPhase phase_ = TunerPhase::kProfiling;
  bool cache_hit_ = false;
  bool derived_ = false;
  std::optional<bucketing::Plan> nearest_plan_;  // seed from a nearer cached size
  int tuning_iterations_ = 0;
  double tuning_cost_us_ = 0;
  std::vector<double> tuning_samples_;  // local whole times while tuning
  // Profiling: local samples of the default.
  std::vector<double> backward_;
  std::vector<std::vector<double>> ready_;
  // Candidates (index 0 is the default) and their local samples.
  std::vector<bucketing::Plan> plans_;
  std::vector<MeasuredPlan> measured_;
  std::vector<std::vector<double>> samples_;
  int running_ = 0;              // candidate the engine runs now
  std::vector<int> block_;       // visits left in this block
  int blocks_done_ = 0;
  int blocks_started_ = 0;
  bool warming_ = false;         // in the unmeasured warm-up block
  int pick_ = 0;                 // screening's pick
  std::vector<double> verify_default_, verify_pick_;  // local, paired
  int chosen_ = -1;
  std::optional<bucketing::Plan> chosen_plan_;
  Verdict verdict_;
  std::string decision_;
  CostModel cost_;
  // Checking after the decision.
  int since_check_ = 0;
  bool control_ = false;         // the default runs this iteration as a control
  std::optional<double> control_sample_;
  std::vector<double> check_default_, check_chosen_;
  int checks_ = 0;
  int fallbacks_ = 0;
  bool forced_ = false;  // ForceChosen: install the plan at the next iteration
};

// A fixed plan by name: "ddp" (DDP's default), "per-tensor", or a plan
// file (bucketing/plan_io.h) made for `layout`.
absl::StatusOr<bucketing::Plan> FixedPlan(const std::string& spec,
                                          const bucketing::GradientLayout& layout);

// What decides the plan: a fixed one, or the online tuner with its cache.
struct PlanChoice {
  std::string fixed_plan;  // non-empty: FixedPlan(fixed_plan) and no tuning
  std::string cache_dir;   // the tuner's cache directory; empty: no cache
  TunerOptions tuner;
  // Cache warnings (unreadable entries, unwritable directory); may be empty.
  std::function<void(const std::string&)> warn;
};

// The plan to start with and the policy that may replace it (null for a
// fixed plan): what a loop that executes plans itself (the DDP hook's native
// path, where DDP reduces) needs.
struct PlanAndPolicy {
  bucketing::Plan initial;
  std::unique_ptr<OnlineTuner> tuner;
};

// The cache and the policy of `choice` for `layout`. Collective.
absl::StatusOr<PlanAndPolicy> CreatePlanPolicy(comm::Communicator& comm,
                                               const bucketing::GradientLayout& layout,
                                               absl::Duration timeout, PlanChoice choice);

struct EngineWithPolicy {
  std::unique_ptr<bucketing::Engine> engine;
  OnlineTuner* tuner = nullptr;  // owned by the engine; null for a fixed plan
};

// The one factory the DDP hook, GradientReducer and fusebox-perf overlap
// use: the cache, the policy, and the engine that owns both. Collective.
absl::StatusOr<EngineWithPolicy> CreateEngineWithPolicy(comm::Communicator& comm,
                                                        bucketing::GradientLayout layout,
                                                        bucketing::EngineOptions engine_options,
                                                        PlanChoice choice);

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_TUNER_H_
