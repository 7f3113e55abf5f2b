// fusebox-perf: standalone collective benchmarks in the conventions of
// nccl-tests. The edge of the perf tool: flags and environment are read here
// and only here.
//
//   fusebox-run -n 2 -- fusebox-perf allreduce -b 8 -e 64M -f 2
//   mpirun -n 4 fusebox-perf allreduce --backend mpi -d all -o all
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "autotune/cost_model.h"
#include "autotune/models.h"
#include "autotune/profile.h"
#include "bucketing/file_io.h"
#include "comm/backends.h"
#include "comm/log.h"
#include "fusebox/config.h"
#include "perf/allreduce.h"
#include "perf/harness.h"
#include "perf/overlap.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, b, "8", "-b: smallest size in bytes (K/M/G suffixes)");
ABSL_FLAG(std::string, e, "64M", "-e: largest size in bytes (K/M/G suffixes)");
ABSL_FLAG(double, f, 2.0, "-f: multiply the size by this factor each step");
ABSL_FLAG(std::string, i, "0", "-i: add this many bytes each step instead (overrides -f)");
ABSL_FLAG(int, n, -1,
          "-n: timed iterations per size (allreduce; default 20), or rounds of every plan (overlap; "
          "default 10)");
ABSL_FLAG(int, w, -1,
          "-w: warm-up iterations per size (allreduce; default 5), or per visit of a plan after "
          "switching to it (overlap; default 1)");
ABSL_FLAG(int, c, 1, "-c: check results (1) or not (0); #wrong must be 0");
ABSL_FLAG(std::string, d, "float",
          "-d: data type: float, double, half, bfloat16, int32, int64, uint8, or all");
ABSL_FLAG(std::string, o, "sum", "-o: reduction: sum, avg, min, max, prod, or all");
ABSL_FLAG(int, z, 0,
          "-z: 1 = blocking: each collective finishes before the next is issued (the "
          "communicator's blocking call, as MPI_Allreduce is MPI's)");
ABSL_FLAG(bool, wait_each, false,
          "with -z 0: each non-blocking call is waited as soon as it is issued, before the next "
          "(launch-to-done per call, the figure to set beside -z 1's blocking call; default: "
          "all issued, then waited)");
ABSL_FLAG(std::string, backend, "ucx", "communication backend: ucx, mpi or nccl");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this file (rank 0)");
ABSL_FLAG(int, tensors, 1,
          "multi-tensor mode: K tensors per call, issued one by one vs fused into one buffer");
ABSL_FLAG(int64_t, offset, 0,
          "allreduce: the buffers start this many bytes past a page boundary (a multiple of 8 "
          "below 4096; 0: page-aligned). A framework's tensors are 64-byte aligned; malloc's "
          "large blocks, numpy's arrays among them, start 16 bytes past a page");
ABSL_FLAG(int, launch, 20,
          "launch-to-start samples per size: non-blocking calls issued to an idle "
          "communicator, timed from issue until the backend starts executing them, and until "
          "they complete (the JSON's launch_done_us; 0: off)");
ABSL_FLAG(double, ucx_waiter_window_us, 200,
          "ucx backend: a non-blocking call issued right after its issuer waited at once for the "
          "previous one is left to its waiter's Wait for this long before the progress thread "
          "takes it (comm/async_core.h, Note [Waiters first]; 0: every call wakes the progress "
          "thread)");
ABSL_FLAG(double, ucx_spin_us, 0,
          "ucx backend: microseconds the progress thread keeps looking for work before it "
          "blocks until woken (0: at once, which lets a bucket launched during backward start "
          "sooner; 50 with --ucx_progress_nice 0 suits back-to-back small non-blocking calls)");
ABSL_FLAG(int, ucx_progress_nice, -10,
          "ucx backend: the progress thread's nice value where ranks do not outnumber cores (0: "
          "the caller's; a negative value needs CAP_SYS_NICE, else it is left and --log_level "
          "info says so)");
ABSL_FLAG(double, ucx_progress_slice_us, 0,
          "ucx backend: the progress thread's requested scheduler slice in microseconds where "
          "ranks do not outnumber cores (Linux 6.12+, clamped to 100-100000; a shorter slice "
          "runs a thread sooner when it wakes without a larger share; 0: the kernel's default)");
ABSL_FLAG(int, engine_worker_nice, 0,
          "overlap: the bucketing engine's worker thread's nice value (0: the caller's)");
ABSL_FLAG(bool, engine_launch_on_completion, true,
          "overlap: a completed allreduce frees its window slot on the thread that completed "
          "it, and launches the next bucket there where no later allreduce is still queued "
          "(false: only the engine's worker does)");
ABSL_FLAG(double, engine_worker_slice_us, 0,
          "overlap: the engine's worker thread's requested scheduler slice in microseconds "
          "(as --ucx_progress_slice_us; 0: the kernel's default)");
ABSL_FLAG(std::string, ucx_tls, "",
          "UCX transports for the ucx backend (as UCX_TLS; default: $UCX_TLS, else "
          "sysv,cma,self,tcp with the shared-memory allreduce)");
ABSL_FLAG(std::string, ucx_chunk, "256K", "ucx backend: ring pipeline chunk size");
ABSL_FLAG(std::string, ucx_shm_chunk, "128K",
          "ucx backend: bytes each rank owns per round of the shared-memory allreduce "
          "(a multiple of 64)");
ABSL_FLAG(std::string, ucx_issuer_begins, "auto",
          "ucx backend, one host: whether the thread that issues a non-blocking allreduce to "
          "an idle communicator publishes its descriptor and stages its first shared-memory "
          "round itself before the progress thread wakes: on, off, or auto (where this "
          "machine's ranks and their progress threads outnumber its cores)");
ABSL_FLAG(std::string, ucx_shm_stores, "auto",
          "ucx backend: how each rank writes the shared-memory allreduce's staging: cached "
          "(ordinary stores: fastest where the ranks' cores share a cache), streamed "
          "(non-temporal: where they do not), or auto (times both on the run's own "
          "allreduces of 256 KiB and more and runs the faster)");
ABSL_FLAG(std::string, ucx_cma_min, "2M",
          "ucx backend, one host: AllReduce of --ucx_cma_min to --ucx_cma_max bytes reads the "
          "peers' buffers in place by cross-memory attach (one kernel copy instead of "
          "staging) where the kernel lets every rank read every other; 0: never");
ABSL_FLAG(std::string, ucx_cma_max, "8M",
          "ucx backend, one host: the largest AllReduce that reads its peers in place "
          "(--ucx_cma_min)");
ABSL_FLAG(std::string, ucx_recursive_doubling, "64K",
          "ucx backend: AllReduce over messages (no shared memory: across hosts) up to this "
          "size (or --ucx_small, if larger) runs recursive doubling inside the round that "
          "compares the ranks' descriptors (where the world is a power of two of at least 4 "
          "ranks, only up to --ucx_rabenseifner_from); above it Rabenseifner (up to "
          "--ucx_rabenseifner) or the ring");
ABSL_FLAG(std::string, ucx_rabenseifner, "512K",
          "ucx backend: where the world is a power of two of at least 4 ranks, AllReduce over "
          "messages above --ucx_rabenseifner_from up to this size runs Rabenseifner's "
          "algorithm (reduce-scatter by recursive halving carrying the descriptors, then "
          "allgather by recursive doubling); above it the ring. 0: off (at most 64M)");
ABSL_FLAG(std::string, ucx_rabenseifner_from, "32K",
          "ucx backend: where both run (a power-of-two world of at least 4 ranks, over "
          "messages), AllReduce above this size runs Rabenseifner instead of recursive "
          "doubling");
ABSL_FLAG(std::string, ucx_opening, "auto",
          "ucx backend, over messages: how collectives open. rd: the descriptors compared by "
          "recursive doubling; linear: every descriptor to rank 0 and the verdict back "
          "(2(p-1) messages); auto: linear where some machine runs more ranks than it has "
          "cores and there are at least 5 ranks, rd otherwise");
ABSL_FLAG(std::string, ucx_linear, "4K",
          "ucx backend: where the linear round opens, AllReduce up to this size rides in it "
          "(at most 1M)");
ABSL_FLAG(std::string, ucx_measured_choice, "512K",
          "ucx backend: over messages, in a world of at least 3 ranks, AllReduce above 4K up to "
          "this size times its candidate algorithms (Rabenseifner, above 32K the ring, recursive "
          "doubling, and up to 64K, where ranks outnumber a machine's cores, the linear round) "
          "on its first calls, per size class, and every rank runs the one fastest on rank 0 "
          "from then on, switching to the next where rank 0 times it 1.5x dearer in use (a "
          "class's trial takes up to 135 calls and a first switch 81 more: give -w about 300); "
          "the choices are printed after the sweep (at most 1M; 0: the static table)");
ABSL_FLAG(std::string, ucx_small, "4K",
          "ucx backend: on one host, messages up to this size ride in the header round "
          "(one-shot; raised to 32K where up to 8 ranks outnumber the host's cores; 0: never)");
ABSL_FLAG(double, timeout_s, 0,
          "seconds one collective may wait for its peers before it fails naming them "
          "(0: $FUSEBOX_TIMEOUT_S, else 300)");
ABSL_FLAG(std::string, log_level, "",
          "messages shown on stderr: error, warning, info or debug (default: "
          "$FUSEBOX_LOG_LEVEL, else warning); info also shows progress, debug each rank's "
          "set-up");
ABSL_FLAG(int, progress, -1,
          "progress on stderr (rank 0): 1 on, 0 off, -1 when stderr is a terminal or "
          "FUSEBOX_PROGRESS=1 (set by fusebox-run on a terminal); overlap: rounds and tuning");

// overlap
ABSL_FLAG(std::string, profile, "resnet50",
          "overlap: a bundled model (resnet50, bert_large, gpt2_small, gpt2_medium, gpt2_large, "
          "gpt2_xl, vit_b16) or a profile file (.json)");
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
ABSL_FLAG(std::string, timeline, "", "overlap: write Chrome traces per plan and rank into this directory");
ABSL_FLAG(std::string, save_plans, "",
          "overlap: write each plan as a plan file (<dir>/<model>-<plan>.json) to edit and pass back "
          "with --plans");
ABSL_FLAG(std::string, cache_dir, "",
          "overlap: the policy cache for the 'tuned' plan (empty: FUSEBOX_CACHE_DIR, else no "
          "cache)");
ABSL_FLAG(std::string, predict_with, "",
          "overlap: a cost-model file (fusebox-tune fit --out) for the pred column, instead of "
          "the model fitted at the start of the run");
ABSL_FLAG(std::string, network, "local", "overlap: the network label in the tuned plan's cache key");
ABSL_FLAG(int, tune_candidates, 2,
          "overlap: the planner's plans the tuner measures besides DDP's default and its caps "
          "(1, 5, 100 MiB)");
ABSL_FLAG(int, tune_blocks, 2,
          "overlap: the tuner's screening blocks after its warm-up block (each runs every candidate once)");
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

constexpr char kUsage[] =
    "runs an allreduce sweep or replays a model's backward through the bucketing engine.\n"
    "\n"
    "fusebox-perf allreduce [flags]\n"
    "fusebox-perf overlap [--profile resnet50] [--plans per-tensor,ddp,horovod,hccl,mg-wfbp,tuned,plan.json]\n"
    "                     [--cache_dir DIR] [--network NAME]\n"
    "                     [--compute_scale auto|X] [--comm_ratio R] [-n iters] [-w warmup]\n"
    "                     [--explain]\n"
    "\n"
    "Measures allreduce bandwidth over a size sweep, in the conventions of\n"
    "nccl-tests (GB = 1e9 bytes, busbw = algbw * 2(n-1)/n, times averaged\n"
    "across ranks). Start it under fusebox-run (or torchrun) for the ucx and\n"
    "nccl backends, under mpirun for any backend, or alone for one rank:\n"
    "\n"
    "  fusebox-run -n 2 -- fusebox-perf allreduce -b 8 -e 64M -f 2\n"
    "  mpirun -n 4 fusebox-perf allreduce --backend mpi -d all -o all\n"
    "  fusebox-run -n 2 -- fusebox-perf allreduce --tensors 16 -b 64K -e 64M\n"
    "\n"
    "Exits non-zero when any element is wrong (#wrong > 0) or a rank fails.\n"
    "\n"
    "overlap replays a model's backward (sleeping to each gradient's ready time, as\n"
    "the CPU idles while a GPU computes) and reduces the gradients through the\n"
    "bucketing engine, once per plan; it reports iteration time, exposed\n"
    "communication and the ratio to the lower bound of docs/design.md:\n"
    "\n"
    "  fusebox-run -n 2 -- fusebox-perf overlap --profile bert_large --compute_scale auto -n 5\n"
    "\n"
    "--explain adds where each plan's time beyond the bound goes (docs/design.md,\n"
    "\"Where the gap goes\").";

absl::StatusOr<PerfOptions> OptionsFromFlags(const comm::Logger& log) {
  PerfOptions o;
  auto b = ParseBytes(absl::GetFlag(FLAGS_b));
  if (!b.ok()) return b.status();
  auto e = ParseBytes(absl::GetFlag(FLAGS_e));
  if (!e.ok()) return e.status();
  auto step = ParseBytes(absl::GetFlag(FLAGS_i));
  if (!step.ok()) return step.status();
  o.min_bytes = *b;
  o.max_bytes = *e;
  o.step_bytes = *step;
  if (o.min_bytes > o.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("-b (", o.min_bytes, ") is larger than -e (", o.max_bytes, ")"));
  }
  o.factor = absl::GetFlag(FLAGS_f);
  if (o.step_bytes == 0 && o.factor <= 1.0 && o.min_bytes != o.max_bytes) {
    return absl::InvalidArgumentError("-f must be greater than 1 (or give -i)");
  }
  o.iters = absl::GetFlag(FLAGS_n) == -1 ? 20 : absl::GetFlag(FLAGS_n);
  o.warmup = absl::GetFlag(FLAGS_w) == -1 ? 5 : absl::GetFlag(FLAGS_w);
  if (o.iters < 1 || o.warmup < 0) return absl::InvalidArgumentError("-n must be >= 1 and -w >= 0");
  o.check = absl::GetFlag(FLAGS_c) != 0;
  o.blocking = absl::GetFlag(FLAGS_z) != 0;
  o.wait_each = absl::GetFlag(FLAGS_wait_each);
  if (o.blocking && o.wait_each) {
    return absl::InvalidArgumentError("--wait_each times non-blocking calls: it needs -z 0");
  }
  o.tensors = absl::GetFlag(FLAGS_tensors);
  if (o.tensors < 1 || o.tensors > 4096) return absl::InvalidArgumentError("--tensors must be in [1, 4096]");
  o.offset = absl::GetFlag(FLAGS_offset);
  if (o.offset < 0 || o.offset >= 4096 || o.offset % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--offset: ", o.offset, " is not a multiple of 8 in [0, 4096)"));
  }
  if (o.offset != 0 && o.tensors > 1) {
    return absl::InvalidArgumentError("--offset applies to one tensor per call, not --tensors");
  }
  o.launch_samples = absl::GetFlag(FLAGS_launch);
  if (o.launch_samples < 0 || o.launch_samples > 100000) {
    return absl::InvalidArgumentError("--launch must be in [0, 100000]");
  }
  o.json_path = absl::GetFlag(FLAGS_json);
  o.types.clear();
  o.ops.clear();
  const std::string d = absl::GetFlag(FLAGS_d), op = absl::GetFlag(FLAGS_o);
  for (int t = 0; t < comm::kNumDataTypes; ++t) {
    if (d == "all") o.types.push_back(static_cast<comm::DataType>(t));
  }
  if (o.types.empty()) {
    for (absl::string_view name : absl::StrSplit(d, ',')) {
      auto t = comm::ParseDataType(name);
      if (!t.ok()) return t.status();
      o.types.push_back(*t);
    }
  }
  for (int k = 0; k < comm::kNumReduceOps; ++k) {
    if (op == "all") o.ops.push_back(static_cast<comm::ReduceOp>(k));
  }
  if (o.ops.empty()) {
    for (absl::string_view name : absl::StrSplit(op, ',')) {
      auto r = comm::ParseReduceOp(name);
      if (!r.ok()) return r.status();
      o.ops.push_back(*r);
    }
  }
  o.progress =
      tools::ShowProgress(absl::GetFlag(FLAGS_progress), log.Enabled(comm::LogLevel::kInfo));
  o.progress_lines = !isatty(STDERR_FILENO);
  return o;
}

// The value of the choice flag --`flag` named `value`; otherwise an error
// listing the names ("--flag must be a, b or c, got 'value'").
template <typename E>
absl::StatusOr<E> ParseChoice(const char* flag, const std::string& value,
                              std::initializer_list<std::pair<const char*, E>> choices) {
  std::string names;
  size_t i = 0;
  for (const auto& [name, e] : choices) {
    if (value == name) return e;
    absl::StrAppend(&names, i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ", name);
    ++i;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " must be ", names, ", got '", value, "'"));
}

// A thread's nice value from --`flag`: in [-20, 19].
absl::StatusOr<int> NiceFromFlag(const char* flag, int nice) {
  if (nice < -20 || nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be a nice value in [-20, 19], got ", nice));
  }
  return nice;
}

// A thread's requested scheduler slice from --`flag`, in microseconds: in
// [0, 100000] (0: the kernel's default).
absl::StatusOr<absl::Duration> SliceFromFlag(const char* flag, double us) {
  if (!(us >= 0 && us <= 1e5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be in [0, 100000] microseconds, got ", us));
  }
  return absl::Microseconds(us);
}

absl::StatusOr<comm::BackendOptions> BackendOptionsFromFlags() {
  comm::BackendOptions b;
  // The byte-valued settings, each from its flag.
  using Ucx = comm::UcxOptions;
  const std::pair<const absl::Flag<std::string>*, size_t Ucx::*> bytes_flags[] = {
      {&FLAGS_ucx_chunk, &Ucx::chunk_bytes},
      {&FLAGS_ucx_small, &Ucx::small_message_bytes},
      {&FLAGS_ucx_recursive_doubling, &Ucx::recursive_doubling_bytes},
      {&FLAGS_ucx_rabenseifner, &Ucx::rabenseifner_bytes},
      {&FLAGS_ucx_rabenseifner_from, &Ucx::rabenseifner_from_bytes},
      {&FLAGS_ucx_linear, &Ucx::linear_bytes},
      {&FLAGS_ucx_measured_choice, &Ucx::measured_choice_bytes},
      {&FLAGS_ucx_shm_chunk, &Ucx::shm_chunk_bytes},
      {&FLAGS_ucx_cma_min, &Ucx::cma_min_bytes},
      {&FLAGS_ucx_cma_max, &Ucx::cma_max_bytes},
  };
  for (const auto& [flag, field] : bytes_flags) {
    absl::StatusOr<size_t> value = ParseBytes(absl::GetFlag(*flag));
    if (!value.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", absl::GetFlagReflectionHandle(*flag).Name(), ": ", value.status().message()));
    }
    b.ucx.*field = *value;
  }
  using Opening = comm::UcxOptions::Opening;
  auto opening = ParseChoice<Opening>("ucx_opening", absl::GetFlag(FLAGS_ucx_opening),
                                      {{"auto", Opening::kAuto},
                                       {"rd", Opening::kRecursiveDoubling},
                                       {"linear", Opening::kLinear}});
  if (!opening.ok()) return opening.status();
  b.ucx.opening = *opening;
  using ShmStores = comm::UcxOptions::ShmStores;
  auto stores = ParseChoice<ShmStores>("ucx_shm_stores", absl::GetFlag(FLAGS_ucx_shm_stores),
                                       {{"auto", ShmStores::kAuto},
                                        {"cached", ShmStores::kCached},
                                        {"streamed", ShmStores::kStreamed}});
  if (!stores.ok()) return stores.status();
  b.ucx.shm_stores = *stores;
  using IssuerBegins = comm::UcxOptions::IssuerBegins;
  auto begins = ParseChoice<IssuerBegins>(
      "ucx_issuer_begins", absl::GetFlag(FLAGS_ucx_issuer_begins),
      {{"auto", IssuerBegins::kAuto}, {"on", IssuerBegins::kOn}, {"off", IssuerBegins::kOff}});
  if (!begins.ok()) return begins.status();
  b.ucx.issuer_begins = *begins;
  const double window_us = absl::GetFlag(FLAGS_ucx_waiter_window_us);
  if (!(window_us >= 0 && window_us <= 1e6)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ucx_waiter_window_us must be in [0, 1e6] microseconds, got ", window_us));
  }
  b.ucx.waiter_window = absl::Microseconds(window_us);
  const double spin_us = absl::GetFlag(FLAGS_ucx_spin_us);
  if (!(spin_us >= 0 && spin_us <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ucx_spin_us must be in [0, 1e6] microseconds, got ", spin_us));
  }
  b.ucx.progress_spin = absl::Microseconds(spin_us);
  absl::StatusOr<int> nice =
      NiceFromFlag("ucx_progress_nice", absl::GetFlag(FLAGS_ucx_progress_nice));
  if (!nice.ok()) return nice.status();
  b.ucx.progress_nice = *nice;
  absl::StatusOr<absl::Duration> slice =
      SliceFromFlag("ucx_progress_slice_us", absl::GetFlag(FLAGS_ucx_progress_slice_us));
  if (!slice.ok()) return slice.status();
  b.ucx.progress_slice = *slice;
  if (absl::Status s = comm::CollectiveTimeoutFromEnv(::getenv, &b); !s.ok()) return s;
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(timeout_s >= 0 && timeout_s <= 1e7)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout_s must be in [0, 1e7] seconds, got ", timeout_s));
  }
  if (timeout_s > 0) comm::SetCollectiveTimeout(absl::Seconds(timeout_s), &b);
  // A user's UCX_TLS is honoured (it turns the shared-memory path off unless
  // it names the default set); --ucx_tls wins over it.
  std::string tls = absl::GetFlag(FLAGS_ucx_tls);
  if (tls.empty() && std::getenv("UCX_TLS") != nullptr) tls = std::getenv("UCX_TLS");
  if (!tls.empty()) b.ucx.transports = tls;
  return b;
}

// Allreduce samples as [{"bytes": b, "time_us": t}, ...].
nlohmann::json SamplesJson(const std::vector<autotune::AllReduceSample>& samples) {
  nlohmann::json a = nlohmann::json::array();
  for (const autotune::AllReduceSample& x : samples) {
    a.push_back({{"bytes", x.bytes}, {"time_us", x.time_us}});
  }
  return a;
}

// Logs the error (naming the rank once the rendezvous has) and returns 1.
int Fail(const comm::Logger& log, const absl::Status& s) {
  log.Error(s.message());
  return 1;
}

// Connects to the launcher (fusebox-run, torchrun, mpirun or none), creates
// the --backend communicator, runs `body` with it and shuts the launch down.
// Returns body's exit status, 2 for bad backend flags, 1 when setting up
// fails.
int WithCommunicator(
    comm::Logger log, int argc, char** argv,
    const std::function<int(comm::Communicator&, comm::Launch&, const comm::Logger&)>& body) {
  auto backend_options = BackendOptionsFromFlags();
  if (!backend_options.ok()) {
    log.Error(backend_options.status().message());
    return 2;
  }
  auto launch = comm::ConnectFromEnvironment(::getenv, &argc, &argv);
  if (!launch.ok()) return Fail(log, launch.status());
  log.set_rank(launch->rdv.rank);
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (log.Enabled(comm::LogLevel::kDebug)) {
    const comm::UcxOptions& u = backend_options->ucx;
    log.Debug(absl::StrCat(
        "rank ", launch->rdv.rank, " of ", launch->rdv.size, " (",
        launch->mpi_initialized ? "MPI rendezvous" : "TCP rendezvous or single rank", "), backend ",
        backend, ", collective timeout ", absl::FormatDuration(u.timeout),
        backend == "ucx"
            ? absl::StrCat(", UCX transports ", u.transports, ", shared memory ",
                           u.use_shared_memory ? "on" : "off", ", chunk ", u.chunk_bytes,
                           " B, small messages <= ", u.small_message_bytes,
                           " B, recursive doubling <= ", u.recursive_doubling_bytes,
                           " B, Rabenseifner <= ", u.rabenseifner_bytes, " B from ",
                           u.rabenseifner_from_bytes, " B, opening ",
                           absl::GetFlag(FLAGS_ucx_opening), ", linear <= ", u.linear_bytes,
                           " B, measured choice <= ", u.measured_choice_bytes, " B, spin ",
                           absl::FormatDuration(u.progress_spin), ", progress thread nice ",
                           u.progress_nice, ", slice ", absl::FormatDuration(u.progress_slice),
                           ", issuer begins ", absl::GetFlag(FLAGS_ucx_issuer_begins))
            : ""));
  }
  int rc = 0;
  {
    auto communicator = comm::CreateCommunicator(backend, *backend_options, launch->rdv);
    if (!communicator.ok()) {
      rc = Fail(log, communicator.status());
    } else {
      for (const std::string& note : (*communicator)->SetupNotes()) log.Info(note);
      rc = body(**communicator, *launch, log);
    }
  }
  comm::ShutdownLaunch(*launch, /*after_failure=*/rc != 0);
  return rc;
}

absl::StatusOr<autotune::Profile> ProfileFromFlag(const std::string& spec) {
  if (absl::EndsWith(spec, ".json")) return autotune::LoadProfile(spec);
  return autotune::GenerateModelProfile(spec);
}

absl::StatusOr<OverlapOptions> OverlapOptionsFromFlags(const comm::Logger& log) {
  OverlapOptions o;
  if (tools::ShowProgress(absl::GetFlag(FLAGS_progress), log.Enabled(comm::LogLevel::kInfo))) {
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
    return absl::InvalidArgumentError(absl::StrCat(
        "--compute_scale: \"", scale, "\" is not 'auto' or a number in (0, 1e6]"));
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
      return absl::InvalidArgumentError(absl::StrCat(
          "--overlap_slowdown: \"", f, "\" is not 'auto' or a number in [1, 1000]"));
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
      return absl::InvalidArgumentError(absl::StrCat("--predict_with ", f, ": ", m.status().message()));
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
  if (o.tune_candidates < 0 || o.tune_candidates > 64 || o.tune_blocks < 1 ||
      o.tune_blocks > 100 || o.tune_pairs < 5 || o.tune_pairs > 1000) {
    return absl::InvalidArgumentError(
        "--tune_candidates must be in [0, 64], --tune_blocks in [1, 100] and --tune_pairs in "
        "[5, 1000]");
  }
  return o;
}

int OverlapMain(const comm::Logger& log, int argc, char** argv) {
  auto options = OverlapOptionsFromFlags(log);
  if (!options.ok()) {
    log.Error(options.status().message());
    return 2;
  }
  auto profile = ProfileFromFlag(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) {
    log.Error(absl::StrCat("--profile: ", profile.status().message()));
    return 2;
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  return WithCommunicator(log, argc, argv, [&](comm::Communicator& c, comm::Launch&,
                                               const comm::Logger& log) {
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
        nlohmann::json gap = {{"gap_us", r.gap.gap_us()}, {"chain_buckets", r.gap.chain_buckets}};
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
      std::ofstream f(absl::GetFlag(FLAGS_json));
      f << j.dump(1) << "\n";
      if (!f) rc = Fail(log, absl::UnavailableError("cannot write " + absl::GetFlag(FLAGS_json)));
    }
    return rc;
  });
}

// The backend's algorithm lines as "# algorithms: ..." comments; with
// `chosen_only`, only what it chose while running ("Chosen: ...").
void PrintAlgorithms(std::FILE* out, const comm::Communicator& c, bool chosen_only) {
  for (absl::string_view line : absl::StrSplit(c.Algorithms(), '\n', absl::SkipEmpty())) {
    if (chosen_only && !absl::StartsWith(line, "Chosen: ")) continue;
    std::fprintf(out, "# algorithms: %.*s\n", static_cast<int>(line.size()), line.data());
  }
}

int Main(int argc, char** argv) {
  std::vector<char*> positional =
      tools::ParseToolCommandLine(argc, argv, "fusebox-perf", kUsage, "perf/");
  const std::string command = positional.size() == 2 ? positional[1] : "";
  if (command != "allreduce" && command != "overlap") {
    std::fprintf(stderr, "%s\n\nusage: fusebox-perf allreduce|overlap [flags]  (--help for the flags)\n",
                 positional.size() < 2 ? "fusebox-perf: missing the benchmark to run"
                                       : "fusebox-perf: the benchmarks are 'allreduce' and 'overlap'");
    return 2;
  }
  absl::StatusOr<comm::LogLevel> level =
      comm::ResolveLogLevel(absl::GetFlag(FLAGS_log_level), std::getenv("FUSEBOX_LOG_LEVEL"));
  if (!level.ok()) {
    std::fprintf(stderr, "fusebox-perf: %s\n", std::string(level.status().message()).c_str());
    return 2;
  }
  const comm::Logger main_log("fusebox-perf", *level);
  if (command == "overlap") return OverlapMain(main_log, argc, argv);
  auto options = OptionsFromFlags(main_log);
  if (!options.ok()) {
    main_log.Error(options.status().message());
    return 2;
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  return WithCommunicator(main_log, argc, argv, [&](comm::Communicator& c, comm::Launch& launch,
                                                    const comm::Logger& log) {
    const int rank = c.rank();
    int rc = 0;
    auto buffers = comm::MakeBufferOps(c.memory());
    if (!buffers.ok()) return Fail(log, buffers.status());
    comm::PrefixStore store("perf", *launch.rdv.store);
    Context ctx(c, store, **buffers);
    std::FILE* out = rank == 0 ? stdout : nullptr;
    if (out != nullptr) {
      std::fprintf(out, "# fusebox-perf %s allreduce: backend %s, %d ranks, iters %d, warmup %d, check %s, %s\n",
                   FUSEBOX_VERSION, backend.c_str(), c.size(), options->iters, options->warmup,
                   options->check ? "on" : "off", options->blocking    ? "blocking"
                   : options->wait_each ? "non-blocking (each waited at once)"
                                        : "non-blocking (issue all, then wait)");
      // The algorithm table, where the backend has one: which algorithm
      // each size runs here, as the user will want to know (and the
      // emulated-cluster tests check).
      PrintAlgorithms(out, c, /*chosen_only=*/false);
      if (options->offset != 0) {
        std::fprintf(out, "# buffers start %lld bytes past a page boundary\n",
                     static_cast<long long>(options->offset));
      }
      if (options->tensors > 1) {
        std::fprintf(out, "# multi-tensor mode: each size is split into %d tensors, reduced by separate calls vs packed into one fused buffer (blocking: each call is waited)\n",
                     options->tensors);
      }
      PrintAllReduceHeader(out, *options);
    }
    auto summary = RunAllReduce(ctx, *options, out);
    if (!summary.ok()) {
      rc = Fail(log, summary.status());
    } else {
      if (out != nullptr) {
        // What the backend chose while it ran (the UCX backend's measured
        // classes), where anything was.
        PrintAlgorithms(out, c, /*chosen_only=*/true);
        std::fprintf(out, "# Out of bounds values : %lld %s\n",
                     static_cast<long long>(summary->wrong), summary->wrong == 0 ? "OK" : "FAILED");
        std::fprintf(out, "# Avg bus bandwidth    : %g\n", summary->avg_busbw);
        std::fprintf(out, "#\n");
      }
      if (rank == 0 && !options->json_path.empty()) {
        nlohmann::json j = {{"tool", "fusebox-perf"},      {"version", FUSEBOX_VERSION},
                            {"collective", "allreduce"},   {"backend", backend},
                            {"nranks", c.size()},          {"iters", options->iters},
                            {"warmup", options->warmup},   {"blocking", options->blocking},
                            {"wait_each", options->wait_each},
                            {"tensors", options->tensors}, {"offset", options->offset},
                            {"results", summary->rows},    {"avg_busbw", summary->avg_busbw},
                            {"wrong", summary->wrong}};
        std::ofstream f(options->json_path);
        f << j.dump(1) << "\n";
        if (!f) rc = Fail(log, absl::UnavailableError("cannot write " + options->json_path));
      }
      if (summary->wrong != 0) {
        rc = Fail(log, absl::DataLossError(absl::StrCat(summary->wrong, " wrong elements")));
      }
    }
    return rc;
  });
}

}  // namespace
}  // namespace fusebox::perf

int main(int argc, char** argv) { return fusebox::perf::Main(argc, argv); }
