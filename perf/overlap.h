// fusebox-perf overlap: replays a model's backward on N real ranks and
// measures how well each bucketing plan hides allreduce behind it.
#ifndef FUSEBOX_PERF_OVERLAP_H_
#define FUSEBOX_PERF_OVERLAP_H_

#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "autotune/cost_model.h"
#include "autotune/profile.h"
#include "bucketing/engine.h"
#include "bucketing/plan.h"
#include "comm/communicator.h"
#include "perf/explain.h"

namespace fusebox::perf {

struct OverlapOptions {
  // Rounds: each visits every plan once in a random order (randomised
  // blocks), `warmup` iterations after the switch, then one measured.
  int iters = 10;
  int warmup = 1;
  // Multiplies the profile's compute times; <= 0 picks the scale at which
  // one allreduce of all gradients takes comm_ratio times backward
  // (t(all) / T_backward = comm_ratio, measured at the start of the run).
  double compute_scale = 1.0;
  double comm_ratio = 1.0;
  // Plan names: per-tensor, ddp, horovod, hccl, mg-wfbp (autotune/planner.h),
  // tuned (the online tuner, autotune/tuner.h); or paths to plan files.
  std::vector<std::string> plans = {"per-tensor", "ddp", "horovod", "hccl"};
  int max_in_flight = 4;
  int worker_nice = 0;                                 // bucketing::EngineOptions::worker_nice
  bool launch_on_completion = true;  // bucketing::EngineOptions::launch_on_completion
  absl::Duration worker_slice = absl::ZeroDuration();  // and worker_slice
  bucketing::Schedule schedule = bucketing::Schedule::kPlanOrder;
  // true: gradients are computed in place in the fusion buffers (DDP's
  // gradient_as_bucket_view=True), nothing is copied; false: each gradient
  // has its own buffer, copied in and out (DDP's default).
  bool views = true;
  std::string timeline_dir;  // per plan and rank Chrome traces when set
  std::string save_plans_dir;  // rank 0 writes each plan as <dir>/<model>-<plan>.json
  // When set, the `pred` column uses this cost model (e.g. fitted to
  // allreduce runs at several world sizes) instead of the one fitted to the
  // sizes measured at the start of this run.
  std::optional<autotune::CostModel> predict_with;
  // Ranks per node (host), for the simulator's intra/inter-node terms and
  // the cache key; 0: every rank on one node.
  int ranks_per_node = 0;
  // The "tuned" plan: the online tuner's settings and its policy cache
  // (empty: no cache). The cache key names the communicator's backend, this
  // network label and ranks_per_node.
  std::string cache_dir;
  std::string network = "local";
  int tune_candidates = 2;   // the planner's plans besides DDP's default and caps
  int tune_blocks = 2;       // screening blocks after the warm-up block (autotune/tuner.h)
  int tune_pairs = 8;        // verification pairs
  // Let the tuner split large gradients. A split gradient is copied in and
  // out of its buckets (it has no single place to live in), which costs
  // memory for its own buffer as well.
  bool tune_split = true;
  // Attribute each plan's iteration - bound to named terms (perf/explain.h)
  // and print them under the table.
  bool explain = false;
  // The simulator's overlap_slowdown and overlap_overhead_us for the pred
  // column and the tuner: a slowdown <= 0 measures both, and the
  // after-backward pair, on a calibration replay (autotune/simulator.h);
  // otherwise all four are as given.
  double overlap_slowdown = 0;
  double overlap_overhead_us = 0;
  double after_backward_slowdown = 1;
  double after_backward_overhead_us = 0;
  // Called on rank 0 with a line of progress (calibration, tuning every 10
  // iterations, each round); empty: none.
  std::function<void(const std::string&)> progress;
};

// The allreduce cost on this communicator, t(m) = a + b*m, with the two
// sizes the lower bound needs measured directly where they fit.
struct CommModel {
  double alpha_us = 0;
  double beta_us_per_byte = 0;
  double t_last_us = 0;   // allreduce of the last-ready gradient
  double t_total_us = 0;  // allreduce of all gradient bytes
  bool total_measured = false;  // false: from the fitted line
  // The sizes the lower bound takes from measurement (the last gradient's
  // and all gradients', where each fits), whose least time is kept.
  std::vector<int64_t> bound_sizes;
  bool last_measured = false;
  // t(last) and t(all) before the plans' rounds timed them again (the
  // compute scale for --comm_ratio comes from these).
  double t_last_first_us = 0;
  double t_total_first_us = 0;
  // Every timed size (world, bytes, median us): what the simulator's cost
  // model is fitted to.
  std::vector<autotune::AllReduceSample> samples;
  // The same sizes timed again in every round of the plans (the median of
  // three), the median of each over the rounds (empty with one rank or no
  // rounds): what `pred` is fitted to unless a model was given.
  std::vector<autotune::AllReduceSample> beside_samples;
  // Every round's time of each size (beside_rounds_us[i][round], sample i).
  std::vector<std::vector<double>> beside_rounds_us;
  // Every timing above walks a buffer this large, as a plan's buckets walk
  // the model's gradients (Note [Timing on data out of cache] in
  // autotune/measure.cc): all gradient bytes, capped where they are.
  int64_t working_set_bytes = 0;
};

struct OverlapResult {
  std::string plan;
  int buckets = 0;
  uint64_t plan_hash = 0;
  // Medians over iterations of the slowest rank's figure, microseconds.
  double iteration_us = 0;
  double iteration_low_us = 0, iteration_high_us = 0;  // 95% CI of that median
  std::vector<double> iterations_us;                    // every measured iteration
  std::vector<double> exposed_rounds_us;  // each measured iteration's end - backward end
  double backward_us = 0;  // measured end of the replayed backward
  double exposed_us = 0;   // iteration end - backward end
  double copy_us = 0;      // copy in + copy back (0 with views)
  double bound_us = 0;     // docs/design.md lower bound under CommModel
  double compute_us = 0;   // forward + backward of the replay
  // autotune::Simulate's iteration time under the cost model fitted to this
  // communicator's sizes timed beside the plans (or the given one; 0 when
  // the fit failed).
  double predicted_us = 0;
  double predicted_exposed_us = 0;  // the same run's exposed communication
  // The same under the sizes timed before the rounds, and under the sizes
  // timed beside the plans (Note [The cost model beside the plans] in
  // perf/overlap.cc), whichever `pred` used or not (e.g. with a given cost
  // model); 0 where there is none.
  double predicted_before_us = 0;
  double predicted_before_exposed_us = 0;
  double predicted_beside_us = 0;
  double predicted_beside_exposed_us = 0;
  // Exposed communication simulated under each round's own sizes (the
  // ones timed at the start of that round), in round order. Empty on one
  // rank, where the sizes timed beside the plans fit no cost model, or
  // where any round's sizes fit none or do not simulate.
  std::vector<double> predicted_rounds_exposed_us;
  // Launch-to-start of the buckets (median, 99th percentile; worst rank; -1
  // when the backend does not mark starts), and the same less queueing
  // behind the previous bucket (IterationStats::start_reaction_us).
  double start_p50_us = -1, start_p99_us = -1;
  double reaction_p50_us = -1, reaction_p99_us = -1;
  // The "tuned" plan only: iterations the tuner spent (0 on a cache hit),
  // whether the cache had it, and which candidate won.
  int tuning_iterations = -1;
  double tuning_cost_us = 0;  // time spent beyond DDP's default while tuning
  bool cache_hit = false;
  std::string chosen;
  std::string decision;
  // Mean over the measured iterations of the slowest rank (by mean
  // iteration): iteration - bound in named terms. Always filled.
  GapTerms gap;
};

struct OverlapReport {
  std::string model;
  int ranks = 0;
  double compute_scale = 1;
  double forward_us = 0, backward_us = 0;  // scaled
  int64_t total_bytes = 0;
  CommModel comm;
  std::string cost_model;  // the fitted model, described (empty when the fit failed)
  double copy_gbps = 0;    // memcpy bandwidth per rank with every rank copying
  double overlap_slowdown = 1;  // given or calibrated (OverlapOptions)
  double overlap_overhead_us = 0;  // given or calibrated (OverlapOptions)
  // Calibrated with them, or given with them (OverlapOptions).
  double after_backward_slowdown = 1;
  double after_backward_overhead_us = 0;
  std::vector<OverlapResult> results;
};

// Collective: every rank calls it with the same profile and options. Rank 0
// prints the table to `out` (nullptr elsewhere).
absl::StatusOr<OverlapReport> RunOverlap(comm::Communicator& comm,
                                         const autotune::Profile& profile,
                                         const OverlapOptions& options, std::FILE* out);

// Prints the gap attribution of every result (what --explain shows).
void PrintGapTable(const OverlapReport& report, std::FILE* out);

// The docs/design.md lower bound on one iteration from measured allreduce
// times: forward + max(T_b, T_last + t(s_last), T_first + t(G)).
double LowerBoundUs(double forward_us, double backward_us, double first_ready_us,
                    double last_ready_us, double t_last_us, double t_total_us);

}  // namespace fusebox::perf

#endif  // FUSEBOX_PERF_OVERLAP_H_
