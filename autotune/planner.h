// Planner: the search for the bucket plan that hides allreduce best behind
// backward, under a cost model. Pure: (profile, cost model, options) ->
// Plan; no I/O, no clock (docs/design.md).
//
// Note [Optimal partition]
// Cut every gradient of at least split_min_bytes into up to max_pieces
// equal pieces ("atoms"; smaller gradients are one atom each), in ready
// order. A plan that launches in ready order is a partition of the atoms
// into contiguous buckets. With one communication channel (collectives run
// one at a time, simulator.h) and gradients in place, bucket k finishes at
//     F_k = max(R_k, F_{k-1}) + t(B_k)
// (R_k: its last atom's ready time, B_k: its bytes, t: the cost model), and
// the iteration ends at forward + max(T_b, F_last). F is non-decreasing in
// F_{k-1}, so the earliest finish of the first j atoms obeys
//     f(j) = min_{i<j} max(r_{j-1}, f(i)) + t(S_j - S_i),  f(0) = 0,
// and the minimum over all partitions is f(n): dynamic programming, exact,
// O(n^2) at worst and far less in practice (the scan over i stops once
// r_{j-1} + t(S_j - S_i) exceeds the best found: both terms only grow).
// Ties go to fewer buckets. Tests compare it with brute force over every
// partition of small instances.
//
// Launch order: under this objective the ready order is optimal (an
// exchange argument: moving a later-ready bucket ahead can only delay the
// channel), so the plan's order is the ready order; tests check it against
// every permutation of small plans. The engine's forward-priority schedule
// changes the order only when several buckets wait, which the simulator
// models.
//
// The tuner (OfflineTune) predicts the DP plans, coarser DP optima and
// every baseline under the full simulator (copies, window) and chooses
// among them under the model's error (Note [Choosing under the model's
// error]).
//
// Note [Choosing under the model's error]
// The model is wrong by a known amount: on held-out replays its prediction
// of exposed communication misses by a median of 15-28% (docs/design.md,
// "Validation"), and every bucket costs a launch, a completion and a
// wake-up that it does not see. So a plan predicted a little faster than
// another is not known to be faster. PlannerOptions::model_error is that
// calibrated relative error (|predicted - measured| / measured exposed
// communication, the median over replays that `fusebox-perf overlap
// --explain` prints as "exp err"). A plan is within the model's error of
// the best predicted plan when its predicted extra time is at most
// model_error times its own predicted exposed communication (the model may
// over-charge it by that much), or at most the margin the caller gives.
// Among the plans within it, the choice is the one with the fewest buckets
// (the costs the model misses grow with the bucket count), the faster
// predicted on a tie. With model_error 0 and no margin this is the best
// predicted plan, fewer buckets winning exact ties. The choice says why in
// PlanPrediction::why, which fusebox-tune prints.
#ifndef FUSEBOX_AUTOTUNE_PLANNER_H_
#define FUSEBOX_AUTOTUNE_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "autotune/cost_model.h"
#include "autotune/profile.h"
#include "autotune/simulator.h"
#include "bucketing/plan.h"

namespace fusebox::autotune {

struct PlannerOptions {
  SimOptions sim;
  // Splitting (Note [Optimal partition]): max_pieces <= 1 disables it.
  int max_pieces = 8;
  int64_t split_min_bytes = int64_t{4} << 20;
  // Largest bucket (fusion-buffer memory); 0: no limit. A single atom
  // larger than the limit still forms a bucket of its own.
  int64_t max_bucket_bytes = 0;
  // The model's relative error on exposed communication (Note [Choosing
  // under the model's error]); 0 trusts every prediction. In [0, 10].
  double model_error = 0;
};

// The exact optimum of Note [Optimal partition], named "tuned".
absl::StatusOr<bucketing::Plan> OptimalPartitionPlan(const Profile& profile, const CostModel& cost,
                                                     const PlannerOptions& options);

// MG-WFBP's merge rule (Shi et al., INFOCOM'19) under `cost`: in ready
// order, a gradient joins the current bucket when it is ready before the
// bucket's allreduce could start plus one startup latency t(0+) (so merging
// saves a latency without delaying anything); otherwise the bucket is
// closed. Named "mg-wfbp".
absl::StatusOr<bucketing::Plan> MgWfbpPlan(const Profile& profile, const CostModel& cost,
                                           const SimOptions& options);

// The baselines by name: "per-tensor", "ddp", "horovod", "hccl" (need only
// the profile) and "mg-wfbp" (needs the cost model and options).
std::vector<std::string> BaselineNames();
absl::StatusOr<bucketing::Plan> BaselinePlan(const std::string& name, const Profile& profile,
                                             const CostModel& cost, const SimOptions& options);

struct PlanPrediction {
  std::string name;
  bucketing::Plan plan;
  SimResult sim;
  // For a chosen plan: why it was chosen (Note [Choosing under the model's
  // error]); empty otherwise.
  std::string why;
};

// Note [Choosing under the model's error]: the index in `plans` (not empty)
// of the plan with the fewest buckets among those predicted within
// max(margin * best iteration, model_error * own exposed) of the best
// predicted iteration, and in `*why` (when not null) one sentence saying so.
size_t ChooseWithinModelError(const std::vector<PlanPrediction>& plans, double model_error,
                              double margin, std::string* why);

struct OfflineTuneResult {
  PlanPrediction tuned;                 // the chosen plan (name "tuned")
  std::vector<PlanPrediction> baselines;  // BaselineNames() order
  double lower_bound_us = 0;
};

// The best plan under the simulator among the DP plans (with and without
// splitting) and every baseline; errors from invalid input.
absl::StatusOr<OfflineTuneResult> OfflineTune(const Profile& profile, const CostModel& cost,
                                              const PlannerOptions& options);

// Up to `count` distinct plans (by PlanHash) for a closed loop to measure,
// chosen to span what the model is least sure of, the per-collective
// latency: `extra` plans first (seeds, e.g. from a cached entry), then
// "tuned": of the DP optima at latency x1, x2, ... x64, the one chosen
// within the model's error (Note [Choosing under the model's error]) with
// a margin of at least 0.5% of the optimum (buckets that buy less are not
// worth what the model misses per bucket); then the optima at latency x1/8
// and x8 (more and fewer buckets), the best predicted baseline, the exact
// optimum ("tuned@exact") and the optima at x1/2, x2, x1/32, x32, then the
// other baselines by prediction. Each DP entry is the better predicted of
// splitting and not splitting; every plan is predicted under `cost` itself.
absl::StatusOr<std::vector<PlanPrediction>> RankCandidates(
    const Profile& profile, const CostModel& cost, const PlannerOptions& options, int count,
    const std::vector<bucketing::Plan>& extra = {});

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_PLANNER_H_
