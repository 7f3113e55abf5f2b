// fusebox-perf overlap: a model's backward replayed through the bucketing
// engine, once per plan (perf/overlap.h).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "autotune/cost_model.h"
#include "bucketing/file_io.h"
#include "fusebox/config.h"
#include "nlohmann/json.hpp"
#include "perf/explain.h"
#include "perf/overlap.h"
#include "perf/subcommand.h"
#include "tools/tool_flags.h"

ABSL_FLAG(int, engine_worker_nice, 0,
          "overlap: the bucketing engine's worker thread's nice value (0: the caller's)");
ABSL_FLAG(bool, engine_launch_on_completion, true,
          "overlap: a completed allreduce frees its window slot on the thread that completed "
          "it, and launches the next bucket there where no later allreduce is still queued "
          "(false: only the engine's worker does)");
ABSL_FLAG(double, engine_worker_slice_us, 0,
          "overlap: the engine's worker thread's requested scheduler slice in microseconds "
          "(as --ucx_progress_slice_us; 0: the kernel's default)");

ABSL_FLAG(std::string, plans, "per-tensor,ddp,horovod,hccl",
          "overlap: comma-separated plans: per-tensor, ddp, horovod, hccl, mg-wfbp, tuned (the "
          "online tuner: searches, measures, caches), or plan files (.json)");
ABSL_FLAG(std::string, compute_scale, "1",
          "overlap: multiply the profile's compute times by this; 'auto' makes backward as long "
          "as one allreduce of all gradients");
ABSL_FLAG(double, comm_ratio, 1,
          "overlap: with --compute_scale auto, the scale at which one allreduce of all gradients "
          "takes this many times the replayed backward (t(all) / T_backward; 1: equal)");
ABSL_FLAG(int, in_flight, 4, "overlap: buckets in flight at most");
ABSL_FLAG(std::string, schedule, "plan",
          "overlap: launch order: 'plan' (the plan's bucket order) or 'priority' (buckets the next "
          "forward needs first, agreed across ranks)");
ABSL_FLAG(int, views, 1,
          "overlap: 1 = gradients computed in place in the fusion buffers (no copies), 0 = copied "
          "in and out");
ABSL_FLAG(std::string, timeline, "",
          "overlap: write Chrome traces per plan and rank into this directory");
ABSL_FLAG(
    std::string, save_plans, "",
    "overlap: write each plan as a plan file (<dir>/<model>-<plan>.json) to edit and pass back "
    "with --plans");
ABSL_FLAG(std::string, cache_dir, "",
          "overlap: the policy cache for the 'tuned' plan (empty: FUSEBOX_CACHE_DIR, else no "
          "cache)");
ABSL_FLAG(std::string, predict_with, "",
          "overlap: a cost-model file (fusebox-tune fit --out) for the pred column, instead of "
          "the model fitted at the start of the run");
ABSL_FLAG(std::string, network, "local",
          "overlap: the network label in the tuned plan's cache key");
ABSL_FLAG(int, tune_candidates, 2,
          "overlap: the planner's plans the tuner measures besides DDP's default and its caps "
          "(1, 5, 100 MiB)");
ABSL_FLAG(int, tune_blocks, 2,
          "overlap: the tuner's screening blocks after its warm-up block (each runs every "
          "candidate once)");
ABSL_FLAG(int, tune_pairs, 8,
          "overlap: the tuner's verification pairs (default vs pick, interleaved; at least 5 for "
          "95% confidence)");
ABSL_FLAG(bool, explain, false,
          "overlap: print where each plan's iteration - bound goes (late gradients, window, "
          "launch-to-start, transfer beyond t(m) alone, copy back, the plan itself, tail)");
ABSL_FLAG(std::string, overlap_slowdown, "auto",
          "overlap: how many times slower transfers run while backward does, for the pred column "
          "and the tuner's simulator: 'auto' measures it and --overlap_overhead_us on a "
          "calibration replay (and the same two for transfers after backward), or a number >= 1 "
          "(then --after_backward_slowdown and --after_backward_overhead_us apply)");
ABSL_FLAG(double, overlap_overhead_us, 0,
          "overlap: with a given --overlap_slowdown, what each collective that starts while "
          "backward runs pays besides (us, >= 0); calibrated with it under 'auto'");
ABSL_FLAG(double, after_backward_slowdown, 1,
          "overlap: with a given --overlap_slowdown, how many times slower than alone a transfer "
          "runs after backward has ended (>= 1); calibrated with it under 'auto'");
ABSL_FLAG(double, after_backward_overhead_us, 0,
          "overlap: with a given --overlap_slowdown, what each collective that starts after "
          "backward pays besides (us, >= 0); calibrated with it under 'auto'");
ABSL_FLAG(int, tune_split, 1,
          "overlap: 1 = the tuner may split large gradients (each split one is copied and needs "
          "its own buffer too), 0 = never");

namespace fusebox::perf {
namespace {

// Allreduce samples as [{"bytes": b, "time_us": t}, ...].
nlohmann::json SamplesJson(const std::vector<autotune::AllReduceSample>& samples) {
  nlohmann::json a = nlohmann::json::array();
  for (const autotune::AllReduceSample& x : samples) {
    a.push_back({{"bytes", x.bytes}, {"time_us", x.time_us}});
  }
  return a;
}

absl::StatusOr<OverlapOptions> OverlapOptionsFromFlags(const comm::Logger& log) {
  OverlapOptions o;
  if (tools::ProgressFromFlags(log)) {
    o.progress = [](const std::string& line) {
      std::fprintf(stderr, "[fusebox-perf] overlap: %s\n", line.c_str());
      std::fflush(stderr);
    };
  }
  // -1: overlap's own defaults (OverlapOptions).
  if (absl::GetFlag(FLAGS_n) != -1) o.iters = absl::GetFlag(FLAGS_n);
  if (absl::GetFlag(FLAGS_w) != -1) o.warmup = absl::GetFlag(FLAGS_w);
  if (o.iters < 1 || o.warmup < 0) return absl::InvalidArgumentError("-n must be >= 1 and -w >= 0");
  const std::string scale = absl::GetFlag(FLAGS_compute_scale);
  if (scale == "auto") {
    o.compute_scale = 0;
    o.comm_ratio = absl::GetFlag(FLAGS_comm_ratio);
    if (!(o.comm_ratio > 0) || o.comm_ratio > 1e6) {
      return absl::InvalidArgumentError("--comm_ratio must be in (0, 1e6]");
    }
  } else if (!absl::SimpleAtod(scale, &o.compute_scale) || !(o.compute_scale > 0) ||
             o.compute_scale > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("--compute_scale: \"", scale, "\" is not 'auto' or a number in (0, 1e6]"));
  }
  o.plans = absl::StrSplit(absl::GetFlag(FLAGS_plans), ',', absl::SkipEmpty());
  if (o.plans.empty()) return absl::InvalidArgumentError("--plans: no plan given");
  o.max_in_flight = absl::GetFlag(FLAGS_in_flight);
  absl::StatusOr<int> worker_nice =
      NiceFromFlag("engine_worker_nice", absl::GetFlag(FLAGS_engine_worker_nice));
  if (!worker_nice.ok()) return worker_nice.status();
  o.worker_nice = *worker_nice;
  o.launch_on_completion = absl::GetFlag(FLAGS_engine_launch_on_completion);
  absl::StatusOr<absl::Duration> worker_slice =
      SliceFromFlag("engine_worker_slice_us", absl::GetFlag(FLAGS_engine_worker_slice_us));
  if (!worker_slice.ok()) return worker_slice.status();
  o.worker_slice = *worker_slice;
  if (o.max_in_flight < 1 || o.max_in_flight > 1024) {
    return absl::InvalidArgumentError("--in_flight must be in [1, 1024]");
  }
  o.views = absl::GetFlag(FLAGS_views) != 0;
  const std::string schedule = absl::GetFlag(FLAGS_schedule);
  if (schedule == "plan") {
    o.schedule = bucketing::Schedule::kPlanOrder;
  } else if (schedule == "priority") {
    o.schedule = bucketing::Schedule::kForwardPriority;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule: \"", schedule, "\" is not 'plan' or 'priority'"));
  }
  o.timeline_dir = absl::GetFlag(FLAGS_timeline);
  o.explain = absl::GetFlag(FLAGS_explain);
  if (const std::string f = absl::GetFlag(FLAGS_overlap_slowdown); f != "auto") {
    if (!absl::SimpleAtod(f, &o.overlap_slowdown) || !(o.overlap_slowdown >= 1) ||
        o.overlap_slowdown > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat("--overlap_slowdown: \"", f, "\" is not 'auto' or a number in [1, 1000]"));
    }
  }
  o.overlap_overhead_us = absl::GetFlag(FLAGS_overlap_overhead_us);
  if (!std::isfinite(o.overlap_overhead_us) || o.overlap_overhead_us < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--overlap_overhead_us: ", o.overlap_overhead_us,
                                                   " is not a finite number >= 0"));
  }
  if (o.overlap_overhead_us > 0 && o.overlap_slowdown <= 0) {
    return absl::InvalidArgumentError(
        "--overlap_overhead_us is given only with a number for --overlap_slowdown (under "
        "'auto' both are calibrated)");
  }
  o.after_backward_slowdown = absl::GetFlag(FLAGS_after_backward_slowdown);
  if (!(o.after_backward_slowdown >= 1) || o.after_backward_slowdown > 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--after_backward_slowdown: ", o.after_backward_slowdown, " is not a number in [1, 1000]"));
  }
  o.after_backward_overhead_us = absl::GetFlag(FLAGS_after_backward_overhead_us);
  if (!std::isfinite(o.after_backward_overhead_us) || o.after_backward_overhead_us < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--after_backward_overhead_us: ", o.after_backward_overhead_us,
                     " is not a finite number >= 0"));
  }
  if ((o.after_backward_slowdown != 1 || o.after_backward_overhead_us > 0) &&
      o.overlap_slowdown <= 0) {
    return absl::InvalidArgumentError(
        "--after_backward_slowdown and --after_backward_overhead_us are given only with a number "
        "for --overlap_slowdown (under 'auto' all four are calibrated)");
  }
  o.save_plans_dir = absl::GetFlag(FLAGS_save_plans);
  o.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  if (o.cache_dir.empty()) {
    if (const char* env = std::getenv("FUSEBOX_CACHE_DIR"); env != nullptr) o.cache_dir = env;
  }
  o.network = absl::GetFlag(FLAGS_network);
  if (const std::string f = absl::GetFlag(FLAGS_predict_with); !f.empty()) {
    auto text = bucketing::ReadFileBounded(f, 1 << 20);
    if (!text.ok()) return text.status();
    auto m = autotune::ParseCostModel(*text);
    if (!m.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--predict_with ", f, ": ", m.status().message()));
    }
    o.predict_with = *std::move(m);
  }
  // Ranks per host, as launchers set it (fusebox-run, torchrun).
  if (const char* env = std::getenv("LOCAL_WORLD_SIZE"); env != nullptr) {
    if (!absl::SimpleAtoi(env, &o.ranks_per_node) || o.ranks_per_node < 1 ||
        o.ranks_per_node > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("LOCAL_WORLD_SIZE=\"", env, "\" is not a rank count"));
    }
  }
  o.tune_candidates = absl::GetFlag(FLAGS_tune_candidates);
  o.tune_blocks = absl::GetFlag(FLAGS_tune_blocks);
  o.tune_pairs = absl::GetFlag(FLAGS_tune_pairs);
  o.tune_split = absl::GetFlag(FLAGS_tune_split) != 0;
  if (o.tune_candidates < 0 || o.tune_candidates > 64 || o.tune_blocks < 1 || o.tune_blocks > 100 ||
      o.tune_pairs < 5 || o.tune_pairs > 1000) {
    return absl::InvalidArgumentError(
        "--tune_candidates must be in [0, 64], --tune_blocks in [1, 100] and --tune_pairs in "
        "[5, 1000]");
  }
  return o;
}

}  // namespace

int OverlapMain(const comm::Logger& log, int argc, char** argv) {
  auto options = OverlapOptionsFromFlags(log);
  if (!options.ok()) {
    log.Error(options.status().message());
    return 2;
  }
  auto profile = tools::LoadProfileSpec(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) {
    log.Error(absl::StrCat("--profile: ", profile.status().message()));
    return 2;
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  return WithCommunicator(
      log, argc, argv, [&](comm::Communicator& c, comm::Launch&, const comm::Logger& log) {
        const int rank = c.rank();
        int rc = 0;
        std::FILE* out = rank == 0 ? stdout : nullptr;
        auto report = RunOverlap(c, *profile, *options, out);
        if (!report.ok()) {
          rc = Fail(log, report.status());
        } else if (rank == 0 && !absl::GetFlag(FLAGS_json).empty()) {
          nlohmann::json results = nlohmann::json::array();
          for (const OverlapResult& r : report->results) {
            results.push_back({{"plan", r.plan},
                               {"buckets", r.buckets},
                               {"plan_hash", absl::StrFormat("%016x", r.plan_hash)},
                               {"iteration_us", r.iteration_us},
                               {"iteration_ci95_us", {r.iteration_low_us, r.iteration_high_us}},
                               {"iterations_us", r.iterations_us},
                               {"exposed_rounds_us", r.exposed_rounds_us},
                               {"backward_us", r.backward_us},
                               {"exposed_us", r.exposed_us},
                               {"copy_us", r.copy_us},
                               {"start_p50_us", r.start_p50_us},
                               {"start_p99_us", r.start_p99_us},
                               {"reaction_p50_us", r.reaction_p50_us},
                               {"reaction_p99_us", r.reaction_p99_us},
                               {"bound_us", r.bound_us},
                               {"compute_us", r.compute_us},
                               {"predicted_us", r.predicted_us},
                               {"predicted_exposed_us", r.predicted_exposed_us},
                               {"predicted_before_us", r.predicted_before_us},
                               {"predicted_before_exposed_us", r.predicted_before_exposed_us},
                               {"predicted_beside_us", r.predicted_beside_us},
                               {"predicted_beside_exposed_us", r.predicted_beside_exposed_us},
                               {"predicted_rounds_exposed_us", r.predicted_rounds_exposed_us}});
            nlohmann::json gap = {{"gap_us", r.gap.gap_us()},
                                  {"chain_buckets", r.gap.chain_buckets}};
            for (const auto& [name, value] : GapTermList(r.gap)) gap[name + "_us"] = value;
            results.back()["gap"] = gap;
            if (r.tuning_iterations >= 0) {
              results.back()["tuning_iterations"] = r.tuning_iterations;
              results.back()["cache_hit"] = r.cache_hit;
              results.back()["chosen"] = r.chosen;
              results.back()["decision"] = r.decision;
              results.back()["tuning_cost_us"] = r.tuning_cost_us;
            }
          }
          nlohmann::json j = {{"tool", "fusebox-perf"},
                              {"version", FUSEBOX_VERSION},
                              {"benchmark", "overlap"},
                              {"model", report->model},
                              {"backend", backend},
                              {"nranks", report->ranks},
                              {"compute_scale", report->compute_scale},
                              {"forward_us", report->forward_us},
                              {"backward_us", report->backward_us},
                              {"total_bytes", report->total_bytes},
                              {"comm",
                               {{"alpha_us", report->comm.alpha_us},
                                {"beta_us_per_byte", report->comm.beta_us_per_byte},
                                {"t_last_us", report->comm.t_last_us},
                                {"t_total_us", report->comm.t_total_us},
                                {"t_last_first_us", report->comm.t_last_first_us},
                                {"t_total_first_us", report->comm.t_total_first_us},
                                {"total_measured", report->comm.total_measured},
                                {"working_set_bytes", report->comm.working_set_bytes},
                                {"samples", SamplesJson(report->comm.samples)},
                                {"beside_samples", SamplesJson(report->comm.beside_samples)},
                                {"beside_rounds_us", report->comm.beside_rounds_us}}},
                              {"cost_model", report->cost_model},
                              {"copy_gbps", report->copy_gbps},
                              {"overlap_slowdown", report->overlap_slowdown},
                              {"overlap_overhead_us", report->overlap_overhead_us},
                              {"after_backward_slowdown", report->after_backward_slowdown},
                              {"after_backward_overhead_us", report->after_backward_overhead_us},
                              {"results", results}};
          if (WriteJson(log, absl::GetFlag(FLAGS_json), j) != 0) rc = 1;
        }
        return rc;
      });
}

}  // namespace fusebox::perf
