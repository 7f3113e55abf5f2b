// Simulator: replays a profile's backward under a plan and a cost model
// and predicts what bucketing::Engine does with it: when each bucket is
// complete, launched and reduced, and when the iteration ends.
//
// The model follows the engine (bucketing/engine.h) step by step:
// * Gradients are marked ready at the profile's ready times on one thread.
//   Without views (and, with views, for split gradients), MarkReady copies
//   the gradient into its bucket(s) first (copy_gbps), which can delay the
//   next MarkReady.
// * A bucket is complete when its last slice is in. Launch k obeys the
//   schedule (plan order; or forward priority: among complete buckets, the
//   one the next forward needs first) and the window: at most
//   max_in_flight buckets launched and not yet seen complete by the worker
//   (which sees them in launch order, between its copies back).
// * Collectives run one at a time, in launch order (one communicator: the
//   UCX progress thread or one NCCL stream), each taking
//   CostModel::AllReduceUs(bytes) + launch_overhead_us, stretched by
//   overlap_slowdown for the part that runs while backward does and by
//   after_backward_slowdown for the part after; one that starts while
//   backward runs first pays overlap_overhead_us, one that starts after
//   it after_backward_overhead_us.
// * A worker copies results back in launch order (nothing without views).
// * The iteration ends at the later of backward's end and the last
//   copy-back; forward precedes backward and overlaps nothing.
// * Device gradients over a host communicator (staging_gbps > 0; Note
//   [Device gradients over a host communicator] in bucketing/engine.h):
//   MarkReadyOnDevice only enqueues, so marking never delays backward.
//   Each gradient is copied device-to-host on one copy stream, in ready
//   order, from its ready time, and its slices count as in when the whole
//   gradient is; a bucket is complete when its last slice is in. After its collective, the whole
//   bucket is copied host-to-device on a second stream, in launch order; the window's slot is free
//   as soon as that copy is enqueued (the collective's end). No views: every byte is staged both
//   ways.
//
// Pure: no clock, no I/O.
#ifndef FUSEBOX_AUTOTUNE_SIMULATOR_H_
#define FUSEBOX_AUTOTUNE_SIMULATOR_H_

#include <functional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "autotune/cost_model.h"
#include "autotune/profile.h"
#include "bucketing/engine.h"
#include "bucketing/plan.h"

namespace fusebox::autotune {

struct SimOptions {
  int world_size = 2;
  int ranks_per_node = 0;  // 0: the cost model's
  int max_in_flight = 4;
  bucketing::Schedule schedule = bucketing::Schedule::kPlanOrder;
  // Gradients computed in place in the fusion buffers (no copies) or copied
  // in and back at copy_gbps (GB/s; 0 = free). With views, split gradients
  // are still copied (a split tensor has no single place in a bucket).
  bool views = true;
  double copy_gbps = 0;
  // Per collective on the channel, besides the cost model (the engine's own
  // launch and completion cost).
  double launch_overhead_us = 0;
  // How much slower a collective moves data while backward runs than alone
  // (>= 1; "overlap" here means during backward): backward's threads take
  // the cores (and wake up, and evict caches) that the communication needs.
  // A collective proceeds at 1/overlap_slowdown of its isolated speed until
  // backward ends, and at 1/after_backward_slowdown after (below). Measured
  // by a calibration replay (perf/overlap.h); 1: the isolated cost model as
  // is.
  double overlap_slowdown = 1;
  // What a collective that starts while backward runs pays before it moves
  // data at that speed (us, >= 0): the cost per collective under overlap
  // that a collective alone does not pay (threads woken and descheduled by
  // backward's, caches evicted between rounds). Calibrated with the
  // slowdown (FitOverlapCost); 0: none.
  double overlap_overhead_us = 0;
  // The same two for a collective that starts once backward has ended: it
  // pays after_backward_overhead_us, then moves data at
  // 1/after_backward_slowdown of its isolated speed (as does the part of a
  // collective started under overlap that runs after backward). On 2 local
  // ranks a bucket launched at backward's end ran longer than t(m) alone
  // (Note [Calibrating the overlap]). Calibrated on the buckets of the same
  // replay that started after backward; 1 and 0: t(m) alone.
  double after_backward_slowdown = 1;
  double after_backward_overhead_us = 0;
  // Device gradients staged through pinned host buffers at this bandwidth
  // (GB/s, each direction; autotune::MeasureStagingGbps); 0: the gradients
  // are in host memory (views and copy_gbps apply).
  double staging_gbps = 0;
};

struct SimLaunch {
  int bucket = 0;
  int64_t bytes = 0;
  double complete_us = 0;  // last slice copied in (from backward start)
  double launch_us = 0;    // issued
  double start_us = 0;     // channel free: the collective starts moving data
  double done_us = 0;      // reduced
  double copied_back_us = 0;
};

struct SimResult {
  double forward_us = 0;
  double backward_end_us = 0;   // from backward start: the last MarkReady returned
  double comm_end_us = 0;       // from backward start: the last copy-back
  double iteration_us = 0;      // forward + max(backward end, comm end)
  double exposed_us = 0;        // iteration - forward - backward end
  double comm_busy_us = 0;      // sum of collective times
  std::vector<SimLaunch> launches;  // in launch order
};

// Validates the profile, the options and the plan against the profile's
// layout; errors name what is wrong.
absl::StatusOr<SimResult> Simulate(const Profile& profile, const bucketing::Plan& plan,
                                   const CostModel& cost, const SimOptions& options);

// What Simulate checks and converts on every call (the options, the cost
// model, the profile's layout), done once, for a search that simulates many
// plans of one profile under one model (the planner). The profile and the
// cost model are the caller's and must outlive it.
class PreparedSimulation {
 public:
  static absl::StatusOr<PreparedSimulation> Create(const Profile& profile, const CostModel& cost,
                                                   const SimOptions& options);
  // Simulate(profile, plan, cost, options); the plan is still checked
  // against the layout (a plan from elsewhere may not fit it).
  absl::StatusOr<SimResult> Run(const bucketing::Plan& plan) const;
  const bucketing::GradientLayout& layout() const { return layout_; }

 private:
  PreparedSimulation(const Profile& profile, const CostModel& cost, const SimOptions& options,
                     bucketing::GradientLayout layout)
      : profile_(&profile), cost_(&cost), options_(options), layout_(std::move(layout)) {}
  const Profile* profile_;
  const CostModel* cost_;
  SimOptions options_;
  bucketing::GradientLayout layout_;
};

// With staging (options.staging_gbps > 0): when each of the profile's
// gradients is on the host, its device-to-host copy running on one stream in
// ready order from its ready time. No plan changes it.
std::vector<double> StagedInUs(const Profile& profile, const SimOptions& options);

// docs/design.md's lower bound on one iteration under `cost`:
// forward + max(T_b, T_last + t(s_last), T_first + t(G)), with t of a set of
// bytes the least any split of them can cost (CostCurve::PartitionLowerBound)
// plus the launch overhead. With staging (c(m): m bytes at staging_gbps),
// also T_last + c(s_last) and T_first + c(G), each plus the launch
// overhead: one copy stream takes every byte in, none before it is ready,
// and the bucket holding the last byte in still has to be reduced.
// No plan Simulate accepts is faster.
double LowerBoundUs(const Profile& profile, const CostModel& cost, const SimOptions& options);

// Checks the options alone (world size >= 1, window >= 1, finite
// non-negative costs).
absl::Status ValidateSimOptions(const SimOptions& options);

// One collective that started and finished while backward ran (for the
// after-backward terms: one that started after backward's end): its
// transfer time (start to done) and t(m) alone for its bytes.
struct OverlapSample {
  double alone_us = 0;
  double moving_us = 0;
};
struct OverlapCost {
  double slowdown = 1;     // SimOptions::overlap_slowdown (or after_backward_slowdown)
  double overhead_us = 0;  // SimOptions::overlap_overhead_us (or after_backward_overhead_us)
};
// One replayed iteration's collectives as calibration samples: those that
// started and finished by `backward_end_us` into `during`, the others that
// started at or after it into `after` (a collective that spans backward's end is in
// neither, and one whose backend does not report its start is left out).
// `alone_us(bytes)`: t(m) alone. Times as bucketing::BucketTiming's.
struct OverlapSamples {
  std::vector<OverlapSample> during;
  std::vector<OverlapSample> after;
};
void AddOverlapSamples(const std::vector<bucketing::BucketTiming>& buckets, double backward_end_us,
                       const std::function<double(int64_t)>& alone_us, OverlapSamples* out);

// Whether FitOverlapCost uses `sample` (a positive finite t(m) alone and a
// finite non-negative transfer time); it skips the others.
bool IsFittable(const OverlapSample& sample);

// Note [Calibrating the overlap]: fits moving = slowdown * alone + overhead
// to `samples` by least squares, with slowdown in [1, 1000]
// and overhead >= 0. With no sample, or samples of a single size, only the
// slowdown is fitted (overhead 0).
OverlapCost FitOverlapCost(const std::vector<OverlapSample>& samples);

}  // namespace fusebox::autotune

#endif  // FUSEBOX_AUTOTUNE_SIMULATOR_H_
