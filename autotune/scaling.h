// Scaling predictions: for a profile and a cost model, what each plan
// (the tuned plan and every baseline) costs at world sizes from 1 to
// thousands of ranks. Weak scaling, as data-parallel training runs: every
// rank computes the same per-rank batch, so the ideal iteration time is the
// computation alone and scaling efficiency is compute / iteration.
// Intra-node and inter-node terms come from the cost model with
// `ranks_per_node` (SimOptions): a world that fits in one node only pays
// intra-node costs.
#ifndef FUSEBOX_AUTOTUNE_SCALING_H_
#define FUSEBOX_AUTOTUNE_SCALING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "autotune/cost_model.h"
#include "autotune/planner.h"
#include "autotune/profile.h"

namespace fusebox::autotune {

struct ScalingPoint {
  std::string model;
  std::string network;  // the cost model's name
  std::string plan;     // "tuned" or a BaselineNames() entry
  int world = 1;
  int nodes = 1;
  int buckets = 0;
  double compute_us = 0;    // forward + backward, no communication
  double iteration_us = 0;  // predicted by Simulate
  double exposed_us = 0;    // communication not hidden behind backward
  double lower_bound_us = 0;
  double efficiency = 1;    // compute / iteration, in (0, 1]
  // Samples per second over the whole job with `batch_per_rank` samples per
  // rank and iteration.
  double throughput = 0;
};

struct ScalingOptions {
  PlannerOptions planner;  // planner.sim.world_size is ignored (set per point)
  double batch_per_rank = 1;
};

// One point per (world, plan): "tuned" first, then the baselines, for each
// of `worlds` in the order given (each in 1..1 << 20). World size 1 has no
// communication: every plan's iteration time is the compute time.
absl::StatusOr<std::vector<ScalingPoint>> PredictScaling(const Profile& profile,
                                                         const CostModel& cost,
                                                         absl::Span<const int> worlds,
                                                         const ScalingOptions& options);

// CSV (header + one row per point) and JSON (an array of objects) of `points`.
std::string ScalingCsv(absl::Span<const ScalingPoint> points);
std::string ScalingJson(absl::Span<const ScalingPoint> points);

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_SCALING_H_
