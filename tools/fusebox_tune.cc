// fusebox-tune: offline tuning of a gradient profile under a cost model, a
// sweep over models, presets and world sizes, and fitting a cost model to
// `fusebox-perf allreduce --json` measurements. The edge of autotune/:
// flags are read here and only here. (Online tuning, in the first
// iterations of a real run, is autotune::OnlineTuner; `fusebox-perf overlap
// --plans ...,tuned` runs it on a replayed model.)
//
//   fusebox-tune --profile resnet50 --preset 25gbe --world 64
//   fusebox-tune sweep --presets nvlink-h100,ib-400g,25gbe --worlds 8,64,512,4096
//   fusebox-tune fit --from ar2.json,ar4.json --ranks_per_node 4 --out local.json
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "autotune/cost_model.h"
#include "autotune/models.h"
#include "autotune/planner.h"
#include "autotune/policy_cache.h"
#include "autotune/profile.h"
#include "autotune/scaling.h"
#include "autotune/simulator.h"
#include "bucketing/file_io.h"
#include "bucketing/plan_io.h"
#include "comm/log.h"
#include "fusebox/config.h"
#include "tools/cli.h"
#include "tools/tool_flags.h"

ABSL_FLAG(std::string, preset, "",
          "cost-model preset: nvlink-h100, ib-400g, 100gbe, 25gbe, 10gbe (default 25gbe when "
          "neither --cost_model nor --fit is given)");
ABSL_FLAG(std::string, cost_model, "", "cost-model file (fusebox-tune fit --out writes one)");
ABSL_FLAG(std::string, fit, "",
          "comma-separated `fusebox-perf allreduce --json` files to fit the cost model to");
ABSL_FLAG(int, world, 64, "world size (ranks)");
ABSL_FLAG(int, ranks_per_node, 0, "ranks per node (0: the cost model's)");
ABSL_FLAG(int, max_in_flight, 4, "buckets launched and not yet complete (engine window)");
ABSL_FLAG(bool, views, true,
          "gradients live in the fusion buffers (no copies); false: copied in and back at "
          "--copy_gbps");
ABSL_FLAG(double, copy_gbps, 1000,
          "copy bandwidth (GB/s) for gradients copied into buckets: all with --views=false, split "
          "ones always (default: a conservative device-memory copy)");
ABSL_FLAG(double, staging_gbps, 0,
          "gradients on a GPU reduced over a host communicator (UCX, MPI, Gloo): each bucket is "
          "staged device-to-host and back through pinned memory at this bandwidth (GB/s per "
          "direction, as measured on the GPUs at hand); 0: the gradients are in host memory");
ABSL_FLAG(int, max_pieces, 8, "a large gradient may be split into up to this many pieces (1: never)");
ABSL_FLAG(int64_t, split_min_bytes, int64_t{4} << 20, "gradients smaller than twice this are never split");
ABSL_FLAG(int64_t, max_bucket_bytes, 0, "largest bucket (0: no limit)");
ABSL_FLAG(double, model_error, 0.25,
          "the cost model's relative error on exposed communication, as calibrated on your "
          "cluster (the median |exp err| of `fusebox-perf overlap --explain`; 0.15-0.28 on the "
          "project's held-out replays, docs/design.md): among plans predicted within it of the "
          "best, the one with the fewest buckets is chosen; 0 takes the best predicted");
ABSL_FLAG(std::string, out, "", "offline: write the tuned plan file here; fit: the cost-model file");
ABSL_FLAG(bool, describe, false, "offline: print the tuned plan bucket by bucket");
ABSL_FLAG(std::string, cache_dir, "",
          "offline: also store the tuned plan in this policy cache (predicted figures only)");
ABSL_FLAG(bool, cache, false,
          "offline: store the tuned plan in the default policy cache ($FUSEBOX_CACHE_DIR, else "
          "$XDG_CACHE_HOME/fusebox, else ~/.cache/fusebox), where the DDP hook looks");
ABSL_FLAG(std::string, backend, "nccl",
          "offline cache: the backend family the key names (ucx, mpi, nccl, gloo; the DDP hook's "
          "default path names its process group's backend)");
ABSL_FLAG(std::string, network, "",
          "offline --cache_dir: the network the key names (default: the preset, or the cost "
          "model's name)");
ABSL_FLAG(std::string, from, "", "fit: comma-separated `fusebox-perf allreduce --json` files");
ABSL_FLAG(bool, shared_machine, false,
          "fit, --fit: the measured ranks share one machine's cores (perf/cluster's emulated "
          "hosts): fit a bandwidth for the machine besides the links' (needs two or more world "
          "sizes; autotune/README.md)");
ABSL_FLAG(int64_t, min_bytes, 0,
          "fit: fit (and summarise --validate over) only the sizes of at least this many bytes; "
          "the smaller ones are printed with the model's error apart (perf/cluster's shaped "
          "links pass a burst unshaped: perf/cluster/README.md)");
ABSL_FLAG(std::string, validate, "",
          "fit: comma-separated `fusebox-perf allreduce --json` files the fit does not use; "
          "prints the fitted model's error on each of their sizes (held-out world sizes)");
ABSL_FLAG(std::string, profiles, "all", "sweep: comma-separated models or profile files, or all");
ABSL_FLAG(std::string, presets, "nvlink-h100,ib-400g,25gbe", "sweep: comma-separated presets");
ABSL_FLAG(std::string, worlds, "8,64,512,4096", "sweep: comma-separated world sizes");
ABSL_FLAG(std::string, scale_worlds, "1,8,64,512,4096", "scale: comma-separated world sizes");
ABSL_FLAG(double, batch_per_rank, 1, "scale: samples per rank and iteration (for throughput)");
ABSL_FLAG(std::string, csv, "", "scale: write every point as CSV to this file");
ABSL_FLAG(std::string, json, "", "scale: write every point as JSON to this file");

namespace fusebox::tools {
namespace {

using autotune::CostModel;
using autotune::PlannerOptions;
using autotune::PlanPrediction;
using autotune::Profile;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr size_t kMaxInputBytes = size_t{64} << 20;

constexpr char kUsage[] =
    "searches the bucket plan that hides allreduce best behind backward.\n"
    "\n"
    "  fusebox-tune [offline] --profile MODEL|FILE (--preset P | --cost_model F | --fit J,...)\n"
    "               --world N [--ranks_per_node R] [--model_error E] [--out plan.json]\n"
    "               [--describe]\n"
    "               [--cache_dir DIR --backend B --network NAME]\n"
    "      Tunes one profile: prints the predicted iteration time of the tuned plan and of\n"
    "      every baseline (per-tensor, DDP default, Horovod default, HCCL default, MG-WFBP)\n"
    "      and the lower bound, and why the tuned plan was chosen (the fewest buckets within\n"
    "      the model's error of the best predicted); optionally writes the plan file and a\n"
    "      policy-cache entry.\n"
    "  fusebox-tune sweep [--profiles all|M,...] [--presets P,...] [--worlds N,...]\n"
    "      The same for every (profile, preset, world size): tuned/bound and each\n"
    "      baseline's time relative to the tuned plan's.\n"
    "  fusebox-tune scale [--profiles all|M,...] [--presets P,... | --cost_model F | --fit J,...]\n"
    "               [--scale_worlds 1,8,64,512,4096] [--ranks_per_node R] [--batch_per_rank B]\n"
    "               [--csv FILE] [--json FILE]\n"
    "      Weak-scaling prediction per world size: iteration time, scaling efficiency\n"
    "      (compute / iteration), throughput and exposed communication of the tuned plan\n"
    "      and every baseline; plots: perf/cluster/plot_scaling.py.\n"
    "  fusebox-tune fit --from J,... [--ranks_per_node R] [--shared_machine]\n"
    "               [--min_bytes B] [--validate J,...] [--out model.json]\n"
    "      Fits the cost model to `fusebox-perf allreduce --json` files (one or more\n"
    "      world sizes) and prints it with its error on every size; --validate prints\n"
    "      its error on files it was not fitted to; --out writes it for --cost_model.\n"
    "\n"
    "Exit status: 0 on success, 1 on invalid input or I/O errors, 2 on usage errors.\n"
    "Times are predictions of autotune::Simulate (autotune/simulator.h).";

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "fusebox-tune: %s\n", std::string(status.message()).c_str());
  return kExitError;
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "fusebox-tune: %s\n\n%s\n", message.c_str(), kUsage);
  return kExitUsage;
}

// Prints "[fusebox-tune] <line>" on stderr where progress is wanted
// (--progress), else nothing.
std::function<void(const std::string&)> ProgressPrinter(const comm::Logger& log) {
  if (ProgressFromFlags(log)) {
    return [](const std::string& line) {
      std::fprintf(stderr, "[fusebox-tune] %s\n", line.c_str());
      std::fflush(stderr);
    };
  }
  return [](const std::string&) {};
}

std::vector<std::string> SplitList(const std::string& s) {
  return absl::StrSplit(s, ',', absl::SkipEmpty());
}

absl::StatusOr<std::vector<autotune::AllReduceSample>> LoadSamples(const std::string& files) {
  std::vector<autotune::AllReduceSample> all;
  for (const std::string& f : SplitList(files)) {
    auto text = bucketing::ReadFileBounded(f, kMaxInputBytes);
    if (!text.ok()) return text.status();
    auto s = autotune::ParsePerfAllReduceJson(*text);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(f, ": ", s.status().message()));
    all.insert(all.end(), s->begin(), s->end());
  }
  return all;
}

autotune::FitOptions FitOptionsFromFlags() {
  autotune::FitOptions o;
  o.shared_machine = absl::GetFlag(FLAGS_shared_machine);
  return o;
}

// The cost model from --preset, --cost_model or --fit (exactly one; none:
// 25gbe).
absl::StatusOr<CostModel> CostModelFromFlags() {
  const std::string preset = absl::GetFlag(FLAGS_preset);
  const std::string file = absl::GetFlag(FLAGS_cost_model);
  const std::string fit = absl::GetFlag(FLAGS_fit);
  if (!preset.empty() + !file.empty() + !fit.empty() > 1) {
    return absl::InvalidArgumentError("give one of --preset, --cost_model and --fit");
  }
  if (!file.empty()) {
    auto text = bucketing::ReadFileBounded(file, kMaxInputBytes);
    if (!text.ok()) return text.status();
    auto m = autotune::ParseCostModel(*text);
    if (!m.ok()) return absl::InvalidArgumentError(absl::StrCat(file, ": ", m.status().message()));
    return m;
  }
  if (!fit.empty()) {
    auto samples = LoadSamples(fit);
    if (!samples.ok()) return samples.status();
    const int rpn = absl::GetFlag(FLAGS_ranks_per_node);
    return autotune::FitCostModel(*samples, rpn > 0 ? rpn : 1, absl::StrCat("fitted to ", fit),
                                  FitOptionsFromFlags());
  }
  return autotune::PresetCostModel(preset.empty() ? "25gbe" : preset);
}

absl::StatusOr<PlannerOptions> PlannerOptionsFromFlags(int world) {
  PlannerOptions o;
  o.sim.world_size = world;
  o.sim.ranks_per_node = absl::GetFlag(FLAGS_ranks_per_node);
  o.sim.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  o.sim.views = absl::GetFlag(FLAGS_views);
  o.sim.copy_gbps = absl::GetFlag(FLAGS_copy_gbps);
  o.sim.staging_gbps = absl::GetFlag(FLAGS_staging_gbps);
  if (!std::isfinite(o.sim.staging_gbps) || o.sim.staging_gbps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--staging_gbps is ", o.sim.staging_gbps, "; it must be 0 (host gradients) or positive"));
  }
  o.max_pieces = absl::GetFlag(FLAGS_max_pieces);
  o.split_min_bytes = absl::GetFlag(FLAGS_split_min_bytes);
  o.max_bucket_bytes = absl::GetFlag(FLAGS_max_bucket_bytes);
  o.model_error = absl::GetFlag(FLAGS_model_error);
  if (!(o.model_error >= 0 && o.model_error <= 10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model_error is ", o.model_error, "; it must be a fraction in [0, 10]"));
  }
  if (absl::Status s = autotune::ValidateSimOptions(o.sim); !s.ok()) return s;
  if (o.split_min_bytes < 0 || o.max_bucket_bytes < 0) {
    return absl::InvalidArgumentError("--split_min_bytes and --max_bucket_bytes must be >= 0");
  }
  return o;
}

double Ms(double us) { return us / 1e3; }

int Offline(const comm::Logger& log) {
  if (const int world = absl::GetFlag(FLAGS_world); world < 1 || world > (1 << 24)) {
    return UsageError(absl::StrCat("--world must be in [1, 16777216], got ", world));
  }
  auto profile = LoadProfileSpec(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) return Fail(profile.status());
  auto cost = CostModelFromFlags();
  if (!cost.ok()) return Fail(cost.status());
  auto options = PlannerOptionsFromFlags(absl::GetFlag(FLAGS_world));
  if (!options.ok()) return Fail(options.status());
  if (options->sim.staging_gbps > 0 &&
      (absl::GetFlag(FLAGS_cache) || !absl::GetFlag(FLAGS_cache_dir).empty())) {
    return UsageError(
        "--staging_gbps with --cache or --cache_dir: the policy cache's key does not say where "
        "the gradients live, so a run on host gradients would be served a staged plan; write it "
        "with --out instead");
  }
  auto result = autotune::OfflineTune(*profile, *cost, *options);
  if (!result.ok()) return Fail(result.status());
  const int world = options->sim.world_size;
  const int rpn = options->sim.ranks_per_node > 0 ? options->sim.ranks_per_node : cost->ranks_per_node;
  std::printf("# fusebox-tune: model %s, %zu gradients, %.1f MiB; %d ranks (%d per node, %d nodes)\n",
              profile->model.c_str(), profile->tensors.size(), profile->total_bytes() / 1048576.0,
              world, std::min(rpn, world), (world + rpn - 1) / rpn);
  std::printf("# cost model %s\n#   (%s)\n", cost->Describe().c_str(), cost->source.c_str());
  const std::string gradients =
      options->sim.staging_gbps > 0
          ? absl::StrFormat("device gradients staged through host memory at %g GB/s",
                            options->sim.staging_gbps)
          : (options->sim.views ? "gradients in place (views)" : "gradients copied in and back");
  std::printf("# forward %.2f ms, backward %.2f ms; t(all gradients) = %.2f ms; %s, window %d\n",
              Ms(profile->forward_us), Ms(profile->backward_us),
              Ms(cost->AllReduceUs(profile->total_bytes(), world, rpn)), gradients.c_str(),
              options->sim.max_in_flight);
  std::printf("#\n# %-18s %7s %10s %11s %10s %9s\n", "plan", "buckets", "iter(ms)", "exposed(ms)",
              "iter/bound", "vs tuned");
  auto row = [&](const PlanPrediction& p) {
    std::printf("  %-18s %7zu %10.3f %11.3f %10.4f %9.3f\n", p.name.c_str(), p.plan.buckets.size(),
                Ms(p.sim.iteration_us), Ms(p.sim.exposed_us),
                p.sim.iteration_us / result->lower_bound_us,
                p.sim.iteration_us / result->tuned.sim.iteration_us);
  };
  row(result->tuned);
  for (const PlanPrediction& b : result->baselines) row(b);
  std::printf("  %-18s %7s %10.3f\n", "lower bound", "", Ms(result->lower_bound_us));
  std::printf("# chosen: %s\n", result->tuned.why.c_str());
  if (absl::GetFlag(FLAGS_describe)) {
    auto layout = autotune::LayoutFromProfile(*profile);
    if (!layout.ok()) return Fail(layout.status());
    std::printf("#\n# tuned plan:\n%s", bucketing::DescribePlan(*layout, result->tuned.plan).c_str());
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    auto layout = autotune::LayoutFromProfile(*profile);
    if (!layout.ok()) return Fail(layout.status());
    if (absl::Status s = bucketing::WritePlanFile(out, result->tuned.plan, &*layout); !s.ok()) {
      return Fail(s);
    }
    std::printf("# wrote %s\n", out.c_str());
  }
  std::string cache_dir = absl::GetFlag(FLAGS_cache_dir);
  if (cache_dir.empty() && absl::GetFlag(FLAGS_cache)) {
    cache_dir = autotune::DefaultCacheDir(std::getenv("FUSEBOX_CACHE_DIR"),
                                          std::getenv("XDG_CACHE_HOME"), std::getenv("HOME"));
    if (cache_dir.empty()) {
      return Fail(absl::InvalidArgumentError(
          "--cache: no default cache directory (set FUSEBOX_CACHE_DIR or HOME, or give "
          "--cache_dir)"));
    }
  }
  if (!cache_dir.empty()) {
    auto layout = autotune::LayoutFromProfile(*profile);
    if (!layout.ok()) return Fail(layout.status());
    autotune::PolicyCacheOptions co;
    co.dir = cache_dir;
    co.warn = log.At(comm::LogLevel::kWarning);
    autotune::PolicyCache cache(co);
    autotune::CacheEntry e;
    std::string network = absl::GetFlag(FLAGS_network);
    if (network.empty()) network = cost->name;
    e.key = autotune::CacheKey{autotune::ModelSignature(*layout), world, std::min(rpn, world),
                               autotune::BackendFamily(absl::GetFlag(FLAGS_backend)), network};
    e.model = profile->model;
    e.layout_hash = layout->Hash();
    e.plan = result->tuned.plan;
    e.predicted_iteration_us = result->tuned.sim.iteration_us - result->tuned.sim.forward_us;
    e.cost_model = cost->Describe();
    e.fusebox_version = FUSEBOX_VERSION;
    e.created_unix_s = static_cast<int64_t>(std::time(nullptr));
    if (absl::Status s = cache.Store(e); !s.ok()) return Fail(s);
    std::printf("# cached as %s/%s\n", cache_dir.c_str(), e.key.FileName().c_str());
  }
  return 0;
}

// --profiles, with "all" for every bundled model.
std::vector<std::string> ProfilesFromFlag() {
  std::vector<std::string> profiles = SplitList(absl::GetFlag(FLAGS_profiles));
  if (profiles.size() == 1 && profiles[0] == "all") profiles = autotune::ModelNames();
  return profiles;
}

// A comma-separated list of world sizes from flag `name`; the usage error
// names the bad entry.
absl::StatusOr<std::vector<int>> WorldsFromFlag(const std::string& name, const std::string& value) {
  std::vector<int> worlds;
  for (const std::string& w : SplitList(value)) {
    int v = 0;
    if (!absl::SimpleAtoi(w, &v) || v < 1) {
      return absl::InvalidArgumentError("--" + name + ": \"" + w + "\" is not a world size");
    }
    worlds.push_back(v);
  }
  return worlds;
}

int Sweep(const comm::Logger& log) {
  const std::vector<std::string> profiles = ProfilesFromFlag();
  auto parsed = WorldsFromFlag("worlds", absl::GetFlag(FLAGS_worlds));
  if (!parsed.ok()) return UsageError(std::string(parsed.status().message()));
  const std::vector<int> worlds = *std::move(parsed);
  const std::vector<std::string> presets = SplitList(absl::GetFlag(FLAGS_presets));
  if (profiles.empty() || worlds.empty() || presets.empty()) {
    return UsageError("sweep needs --profiles, --presets and --worlds");
  }
  std::printf("# fusebox-tune sweep: simulated iteration time of the tuned plan vs the lower bound "
              "(docs/design.md) and each baseline's time / tuned time (> 1: tuned is faster)\n");
  std::printf("# fine = the optimum over plans cut 8x finer (up to 64 pieces per gradient, 256 KiB "
              "atoms): what any plan can reach; t/fine = 1 means none beats tuned\n");
  std::printf("# %-11s %-12s %6s %10s %10s %8s %7s %10s %8s %8s %8s %8s %8s\n", "model", "preset",
              "world", "bound(ms)", "tuned(ms)", "t/bound", "t/fine", "exposed", "per-tens",
              "ddp", "horovod", "hccl", "mg-wfbp");
  int rows = 0, within3 = 0, faster = 0, behind = 0, unreachable = 0;
  const std::function<void(const std::string&)> progress = ProgressPrinter(log);
  size_t done = 0;
  double worst = 0, worst_fine = 0;
  for (const std::string& spec : profiles) {
    auto profile = LoadProfileSpec(spec);
    if (!profile.ok()) return Fail(profile.status());
    for (const std::string& preset : presets) {
      auto cost = autotune::PresetCostModel(preset);
      if (!cost.ok()) return Fail(cost.status());
      progress(absl::StrCat("sweep ", ++done, "/", profiles.size() * presets.size(), ": ",
                            profile->model, " on ", preset, ", worlds ", absl::StrJoin(worlds, ",")));
      for (int world : worlds) {
        auto options = PlannerOptionsFromFlags(world);
        if (!options.ok()) return Fail(options.status());
        auto r = autotune::OfflineTune(*profile, *cost, *options);
        if (!r.ok()) return Fail(r.status());
        const double tuned = r->tuned.sim.iteration_us;
        PlannerOptions fine = *options;
        fine.max_pieces = 64;
        fine.split_min_bytes = 256 << 10;
        auto fine_plan = autotune::OptimalPartitionPlan(*profile, *cost, fine);
        if (!fine_plan.ok()) return Fail(fine_plan.status());
        auto fine_sim = autotune::Simulate(*profile, *fine_plan, *cost, options->sim);
        if (!fine_sim.ok()) return Fail(fine_sim.status());
        const double best_any = std::min(tuned, fine_sim->iteration_us);
        std::printf("  %-11s %-12s %6d %10.2f %10.2f %8.4f %7.4f %10.2f", profile->model.c_str(),
                    preset.c_str(), world, Ms(r->lower_bound_us), Ms(tuned),
                    tuned / r->lower_bound_us, tuned / best_any, Ms(r->tuned.sim.exposed_us));
        for (const PlanPrediction& b : r->baselines) {
          std::printf(" %8.3f", b.sim.iteration_us / tuned);
          if (b.sim.iteration_us < tuned * (1 - 1e-9)) ++faster;
          // Note [Choosing under the model's error]: never by more than it.
          if (b.sim.iteration_us + options->model_error * r->tuned.sim.exposed_us <
              tuned * (1 - 1e-9)) {
            ++behind;
          }
        }
        std::printf("\n");
        ++rows;
        worst = std::max(worst, tuned / r->lower_bound_us);
        if (tuned <= 1.03 * r->lower_bound_us) ++within3;
        if (best_any > 1.03 * r->lower_bound_us) ++unreachable;
        worst_fine = std::max(worst_fine, tuned / best_any);
      }
    }
  }
  std::printf("# %d configurations: tuned within 3%% of the lower bound in %d, worst tuned/bound "
              "%.4f; in %d no plan (fine) gets within 3%%; worst tuned/fine %.4f; baselines "
              "predicted faster than tuned (by less than the model's error, --model_error %g): "
              "%d; beyond it: %d\n",
              rows, within3, worst, unreachable, worst_fine, absl::GetFlag(FLAGS_model_error),
              faster, behind);
  return behind == 0 ? 0 : kExitError;
}

int Scale(const comm::Logger& log) {
  const std::vector<std::string> profiles = ProfilesFromFlag();
  auto parsed = WorldsFromFlag("scale_worlds", absl::GetFlag(FLAGS_scale_worlds));
  if (!parsed.ok()) return UsageError(std::string(parsed.status().message()));
  const std::vector<int> worlds = *std::move(parsed);
  if (profiles.empty() || worlds.empty()) return UsageError("scale needs --profiles and --scale_worlds");
  // The networks: --cost_model or --fit (one), else each of --presets.
  std::vector<CostModel> costs;
  if (!absl::GetFlag(FLAGS_cost_model).empty() || !absl::GetFlag(FLAGS_fit).empty()) {
    auto cost = CostModelFromFlags();
    if (!cost.ok()) return Fail(cost.status());
    costs.push_back(*std::move(cost));
  } else {
    for (const std::string& preset : SplitList(absl::GetFlag(FLAGS_presets))) {
      auto cost = autotune::PresetCostModel(preset);
      if (!cost.ok()) return Fail(cost.status());
      costs.push_back(*std::move(cost));
    }
  }
  if (costs.empty()) return UsageError("scale needs --presets, --cost_model or --fit");
  autotune::ScalingOptions so;
  auto po = PlannerOptionsFromFlags(2);
  if (!po.ok()) return Fail(po.status());
  so.planner = *po;
  so.batch_per_rank = absl::GetFlag(FLAGS_batch_per_rank);
  std::vector<autotune::ScalingPoint> all;
  std::printf("# fusebox-tune scale: predicted weak scaling (every rank computes its own batch); "
              "efficiency = compute / iteration; exposed = communication not hidden (ms)\n");
  std::printf("# %-11s %-12s %6s %5s %9s |", "", "", "", "", "");
  const std::vector<std::string> plans = [] {
    std::vector<std::string> p = {"tuned"};
    for (const std::string& b : autotune::BaselineNames()) p.push_back(b);
    return p;
  }();
  for (const std::string& p : plans) std::printf(" %17s", p.c_str());
  std::printf(" |\n# %-11s %-12s %6s %5s %9s |", "model", "network", "world", "nodes", "compute");
  for (size_t j = 0; j < plans.size(); ++j) std::printf(" %7s %9s", "eff", "exposed");
  std::printf(" | ddp/tuned\n");
  const std::function<void(const std::string&)> progress = ProgressPrinter(log);
  size_t done = 0;
  for (const std::string& spec : profiles) {
    auto profile = LoadProfileSpec(spec);
    if (!profile.ok()) return Fail(profile.status());
    for (const CostModel& cost : costs) {
      progress(absl::StrCat("scale ", ++done, "/", profiles.size() * costs.size(), ": ",
                            profile->model, " on ", cost.name));
      auto points = autotune::PredictScaling(*profile, cost, worlds, so);
      if (!points.ok()) return Fail(points.status());
      for (size_t i = 0; i < points->size(); i += plans.size()) {
        const autotune::ScalingPoint& t = (*points)[i];
        std::printf("  %-11s %-12s %6d %5d %9.2f |", t.model.c_str(), t.network.c_str(), t.world,
                    t.nodes, Ms(t.compute_us));
        double ddp = 0;
        for (size_t j = 0; j < plans.size(); ++j) {
          const autotune::ScalingPoint& p = (*points)[i + j];
          std::printf(" %7.3f %9.2f", p.efficiency, Ms(p.exposed_us));
          if (p.plan == "ddp") ddp = p.iteration_us;
        }
        std::printf(" | %8.3f\n", ddp / t.iteration_us);
      }
      all.insert(all.end(), points->begin(), points->end());
    }
  }
  const std::string csv = absl::GetFlag(FLAGS_csv);
  if (!csv.empty()) {
    if (absl::Status s = bucketing::WriteFileAtomically(csv, autotune::ScalingCsv(all)); !s.ok()) {
      return Fail(s);
    }
    std::printf("# wrote %s\n", csv.c_str());
  }
  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) {
    if (absl::Status s = bucketing::WriteFileAtomically(json, autotune::ScalingJson(all)); !s.ok()) {
      return Fail(s);
    }
    std::printf("# wrote %s\n", json.c_str());
  }
  return 0;
}

int Fit() {
  const std::string from = absl::GetFlag(FLAGS_from);
  if (from.empty()) return UsageError("fit needs --from");
  const int64_t min_bytes = absl::GetFlag(FLAGS_min_bytes);
  if (min_bytes < 0) return UsageError("--min_bytes must not be negative");
  auto loaded = LoadSamples(from);
  if (!loaded.ok()) return Fail(loaded.status());
  const std::string validate = absl::GetFlag(FLAGS_validate);
  absl::StatusOr<std::vector<autotune::AllReduceSample>> loaded_held_out =
      std::vector<autotune::AllReduceSample>{};
  if (!validate.empty()) loaded_held_out = LoadSamples(validate);
  if (!loaded_held_out.ok()) return Fail(loaded_held_out.status());
  // Sizes below --min_bytes are neither fitted nor summarised.
  std::vector<autotune::AllReduceSample> samples, held_out, small;
  for (const auto& [in, out] : {std::pair{&*loaded, &samples}, {&*loaded_held_out, &held_out}}) {
    for (const autotune::AllReduceSample& s : *in) {
      (s.bytes >= min_bytes ? out : &small)->push_back(s);
    }
  }
  if (!validate.empty() && held_out.empty()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--validate: no timed allreduce of at least --min_bytes (", min_bytes, ") in ", validate)));
  }
  const int rpn = absl::GetFlag(FLAGS_ranks_per_node);
  auto m = autotune::FitCostModel(samples, rpn > 0 ? rpn : 1, absl::StrCat("fitted to ", from),
                                  FitOptionsFromFlags());
  if (!m.ok() && samples.size() < loaded->size()) {
    return Fail(absl::Status(
        m.status().code(),
        absl::StrCat(m.status().message(), " (", samples.size(), " of ", loaded->size(),
                     " measurements are of at least --min_bytes ", min_bytes, ")")));
  }
  if (!m.ok()) return Fail(m.status());
  std::printf("# %s\n", m->Describe().c_str());
  const struct {
    const std::vector<autotune::AllReduceSample>* set;
    const char* name;
    const char* note;
  } blocks[] = {{&samples, "error, fitted", ""},
                {&held_out, "error, held out", "   (held out: not fitted)"},
                {&small, "", "   (below --min_bytes: not fitted)"}};
  for (const auto& block : blocks) {
    if (block.set->empty()) continue;
    std::printf("#  %-6s %12s %12s %12s %8s%s\n", "world", "bytes", "measured(us)", "model(us)",
                "error", block.note);
    std::vector<double> errors;
    for (const autotune::AllReduceSample& s : *block.set) {
      const double t = m->AllReduceUs(s.bytes, s.world);
      errors.push_back(std::abs(t - s.time_us) / s.time_us);
      std::printf("   %-6d %12lld %12.2f %12.2f %+7.1f%%\n", s.world,
                  static_cast<long long>(s.bytes), s.time_us, t, 100 * (t - s.time_us) / s.time_us);
    }
    if (*block.name == '\0') continue;
    std::sort(errors.begin(), errors.end());
    const size_t n = errors.size();
    const double median = n % 2 == 1 ? errors[n / 2] : (errors[n / 2 - 1] + errors[n / 2]) / 2;
    std::printf("# %s: %zu sizes, |error| median %.1f%%, max %.1f%%\n", block.name, n, 100 * median,
                100 * errors.back());
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    if (absl::Status s = bucketing::WriteFileAtomically(out, autotune::SerializeCostModel(*m));
        !s.ok()) {
      return Fail(s);
    }
    std::printf("# wrote %s\n", out.c_str());
  }
  return 0;
}

int Main(int argc, char** argv) {
  std::vector<char*> args = ParseToolCommandLine(argc, argv, "fusebox-tune", kUsage,
                                                  "tools/fusebox_tune,tools/tool_flags");
  if (args.size() > 2) return UsageError("one command at most: offline, sweep, scale or fit");
  const std::string command = args.size() == 2 ? args[1] : "offline";
  absl::StatusOr<comm::LogLevel> level = LogLevelFromFlags();
  if (!level.ok()) return UsageError(std::string(level.status().message()));
  const comm::Logger log("fusebox-tune", *level);
  if (command != "fit") {
    if (!absl::GetFlag(FLAGS_validate).empty() || absl::GetFlag(FLAGS_min_bytes) != 0) {
      return UsageError("--validate and --min_bytes are for `fusebox-tune fit`");
    }
    if (absl::GetFlag(FLAGS_shared_machine) && absl::GetFlag(FLAGS_fit).empty()) {
      return UsageError("--shared_machine applies to a fit (`fusebox-tune fit`, or --fit)");
    }
  }
  if (command == "offline") return Offline(log);
  if (command == "sweep") return Sweep(log);
  if (command == "scale") return Scale(log);
  if (command == "fit") return Fit();
  return UsageError("unknown command \"" + command + "\" (offline, sweep, scale, fit)");
}

}  // namespace
}  // namespace fusebox::tools

int main(int argc, char** argv) { return fusebox::tools::Main(argc, argv); }
