// fusebox-perf allreduce: an allreduce sweep over sizes, types and
// reductions, in the conventions of nccl-tests (perf/allreduce.h).
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/backends.h"
#include "fusebox/config.h"
#include "perf/allreduce.h"
#include "perf/harness.h"
#include "perf/sizes.h"
#include "perf/subcommand.h"
#include "tools/tool_flags.h"

ABSL_FLAG(std::string, b, "8", "-b: smallest size in bytes (K/M/G suffixes)");
ABSL_FLAG(std::string, e, "64M", "-e: largest size in bytes (K/M/G suffixes)");
ABSL_FLAG(double, f, 2.0, "-f: multiply the size by this factor each step");
ABSL_FLAG(std::string, i, "0", "-i: add this many bytes each step instead (overrides -f)");
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

namespace fusebox::perf {
namespace {

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
    return absl::InvalidArgumentError(
        absl::StrCat("-b (", o.min_bytes, ") is larger than -e (", o.max_bytes, ")"));
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
  if (o.tensors < 1 || o.tensors > 4096)
    return absl::InvalidArgumentError("--tensors must be in [1, 4096]");
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
  o.progress = tools::ProgressFromFlags(log);
  o.progress_lines = !isatty(STDERR_FILENO);
  return o;
}

// The backend's algorithm lines as "# algorithms: ..." comments; with
// `chosen_only`, only what it chose while running ("Chosen: ...").
void PrintAlgorithms(std::FILE* out, const comm::Communicator& c, bool chosen_only) {
  for (absl::string_view line : absl::StrSplit(c.Algorithms(), '\n', absl::SkipEmpty())) {
    if (chosen_only && !absl::StartsWith(line, "Chosen: ")) continue;
    std::fprintf(out, "# algorithms: %.*s\n", static_cast<int>(line.size()), line.data());
  }
}

}  // namespace

int AllReduceMain(const comm::Logger& main_log, int argc, char** argv) {
  auto options = OptionsFromFlags(main_log);
  if (!options.ok()) {
    main_log.Error(options.status().message());
    return 2;
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  return WithCommunicator(
      main_log, argc, argv,
      [&](comm::Communicator& c, comm::Launch& launch, const comm::Logger& log) {
        const int rank = c.rank();
        int rc = 0;
        auto buffers = comm::MakeBufferOps(c.memory());
        if (!buffers.ok()) return Fail(log, buffers.status());
        comm::PrefixStore store("perf", *launch.rdv.store);
        Context ctx(c, store, **buffers);
        std::FILE* out = rank == 0 ? stdout : nullptr;
        if (out != nullptr) {
          std::fprintf(out,
                       "# fusebox-perf %s allreduce: backend %s, %d ranks, iters %d, warmup %d, "
                       "check %s, %s\n",
                       FUSEBOX_VERSION, backend.c_str(), c.size(), options->iters, options->warmup,
                       options->check ? "on" : "off",
                       options->blocking    ? "blocking"
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
            std::fprintf(
                out,
                "# multi-tensor mode: each size is split into %d tensors, reduced by separate "
                "calls vs packed into one fused buffer (blocking: each call is waited)\n",
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
                         static_cast<long long>(summary->wrong),
                         summary->wrong == 0 ? "OK" : "FAILED");
            std::fprintf(out, "# Avg bus bandwidth    : %g\n", summary->avg_busbw);
            std::fprintf(out, "#\n");
          }
          if (rank == 0 && !options->json_path.empty()) {
            nlohmann::json j = {{"tool", "fusebox-perf"},
                                {"version", FUSEBOX_VERSION},
                                {"collective", "allreduce"},
                                {"backend", backend},
                                {"nranks", c.size()},
                                {"iters", options->iters},
                                {"warmup", options->warmup},
                                {"blocking", options->blocking},
                                {"wait_each", options->wait_each},
                                {"tensors", options->tensors},
                                {"offset", options->offset},
                                {"results", summary->rows},
                                {"avg_busbw", summary->avg_busbw},
                                {"wrong", summary->wrong}};
            if (WriteJson(log, options->json_path, j) != 0) rc = 1;
          }
          if (summary->wrong != 0) {
            rc = Fail(log, absl::DataLossError(absl::StrCat(summary->wrong, " wrong elements")));
          }
        }
        return rc;
      });
}

}  // namespace fusebox::perf
