// fusebox-perf: standalone collective benchmarks in the conventions of
// nccl-tests. The edge of the perf tool: flags and environment are read here
// and in the subcommands' files (perf/subcommand.h), and only there.
//
//   fusebox-run -n 2 -- fusebox-perf allreduce -b 8 -e 64M -f 2
//   mpirun -n 4 fusebox-perf allreduce --backend mpi -d all -o all
#include <cstdio>
#include <string>
#include <vector>

#include "comm/log.h"
#include "perf/subcommand.h"
#include "tools/cli.h"
#include "tools/tool_flags.h"

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

int Main(int argc, char** argv) {
  std::vector<char*> positional =
      tools::ParseToolCommandLine(argc, argv, "fusebox-perf", kUsage, "perf/,tools/tool_flags");
  const std::string command = positional.size() == 2 ? positional[1] : "";
  if (command != "allreduce" && command != "overlap") {
    std::fprintf(stderr, "%s\n\nusage: fusebox-perf allreduce|overlap [flags]  (--help for the flags)\n",
                 positional.size() < 2 ? "fusebox-perf: missing the benchmark to run"
                                       : "fusebox-perf: the benchmarks are 'allreduce' and 'overlap'");
    return 2;
  }
  absl::StatusOr<comm::LogLevel> level = tools::LogLevelFromFlags();
  if (!level.ok()) {
    std::fprintf(stderr, "fusebox-perf: %s\n", std::string(level.status().message()).c_str());
    return 2;
  }
  const comm::Logger main_log("fusebox-perf", *level);
  if (command == "overlap") return OverlapMain(main_log, argc, argv);
  return AllReduceMain(main_log, argc, argv);
}

}  // namespace
}  // namespace fusebox::perf

int main(int argc, char** argv) { return fusebox::perf::Main(argc, argv); }
