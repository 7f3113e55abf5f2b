#!/usr/bin/env python3
"""Side-by-side allreduce benchmark: fusebox UCX vs OpenMPI (its default and at its best) vs
PyTorch Gloo, idle and under load.

Runs, in one invocation, for every world size in --ranks (float32 sum, -b .. -e bytes):

  ucx     <build>/tools/fusebox-run -n N -- <build>/perf/fusebox-perf allreduce --backend ucx ...
          (non-blocking, nccl-tests' way: -n calls issued back to back, then waited)
  ucxz    the same with -z 1: each call is the communicator's blocking allreduce
          (AllReduceBlocking), finished before the next is issued, as MPI_Allreduce is; run
          whenever ucx is. The busbw targets compare it with OpenMPI's blocking MPI_Allreduce;
          the non-blocking sweep is reported beside it (ucx/mpibest) for reference.
  mpi     mpirun -n N --oversubscribe <build>/perf/baselines/fusebox-mpi-allreduce ...
          (plain MPI_Allreduce, OpenMPI's own default: ob1 + vader, coll/tuned's fixed decision)
          When N exceeds the CPUs, both are bound round-robin, two or more ranks per CPU
          (fusebox-run --bind core; mpirun --bind-to core:overload-allowed): unbound, both
          are bimodal from run to run.
  mpi-aK  mpirun -n N --oversubscribe --mca coll_tuned_use_dynamic_rules 1
                 --mca coll_tuned_allreduce_algorithm K <build>/perf/baselines/fusebox-mpi-allreduce
          for each K in --mpi-algorithms (default 1,2,3,4,5,6: basic_linear, nonoverlapping,
          recursive_doubling, ring, segmented_ring, rabenseifner; '' runs none); run whenever
          mpi is (with --mpi-cmd, the --mca flags go after its --oversubscribe, or else after
          its first word)
  ucxw    ucx with --ucx-wait-each's flags (default --wait_each: fusebox-perf's non-blocking
          calls each waited at once, launch-to-done per call); --ucx-wait-each='' skips it
  mpi-ucx..., mpi-<comp>, mpinb..., mpiwe...  OpenMPI's other variants, run whenever mpi is:
          the same over the UCX PML (--mpi-pmls), each coll component with an allreduce forced
          first (--mpi-components), and MPI_Iallreduce under libnbc and each of its algorithms
          (--mpi-nb-algorithms), issued -n at a time then waited (mpinb) or each waited at once
          (mpiwe). perf/mpi_tools.py, Note [Fair MPI peers], has the list and the flags; a
          variant that needs a PML or component runs only where a probe shows it selected.
  gloo    /usr/bin/python3 perf/baselines/gloo_allreduce.py --nranks N ...   (torch.distributed)
  fbmpi   mpirun -n N --oversubscribe <build>/perf/fusebox-perf allreduce --backend mpi ...
          (only with --with-fusebox-mpi; bound as mpi is)

and once per repeat <build>/perf/baselines/fusebox-memcpy-bw (single-thread memcpy, 64 MB).
Every tool gets the same "-b B -e E -f F -n N -w W -d float -o sum --json PATH" and writes
fusebox-perf's JSON schema. Each tool is run --repeats times (interleaved, in rotating order,
because the machine is noisy) and the median time per size is kept; algbw/busbw are recomputed
from that median (nccl-tests: algbw = bytes / time, GB = 1e9; busbw = algbw * 2(p-1)/p).

The target sizes (8 B and 64 MiB) are always measured when they lie in [-b, -e], even when the
geometric sweep skips them (-f 4 from 8 B reaches 32 MiB, not 64 MiB): an extra run with
"-b S -e S" covers each missing one (every tool, the mpi-aK included).

A dedicated 8 B run per tool with -n --latency-iters (default 1000) -w --latency-warmup feeds the
latency targets (20 iterations of a ~1 us call are mostly noise); it is the "8 (lat)" row. It is
run for ucx (with -z 1: every call waited before the next, as MPI_Allreduce blocks), mpi, every
mpi-aK and fbmpi; not for Gloo, whose 8 B time is in its sweep.

"mpibest" is not run: per world size and size it is the fastest of mpi and the other MPI_Allreduce
variants (highest busbw; for the 8 B latency run the lowest time), with correct results, so
fusebox is compared with OpenMPI at its best and not only at its default; it exists at the sizes
all of them run (not at the idle 4 MiB extra run of the loaded pass). summary.json names
the winner per size ("best_of", e.g. "mpi-a4 (ring)" or "mpi (default)") and keeps every
algorithm's own numbers. "mpinbbest" and "mpiwebest" are the same for the MPI_Iallreduce
variants of each shape; "Fair comparisons" per world size set ucxz against mpibest, ucx against
mpinbbest and ucxw against mpiwebest: ratios with intervals from the interleaved repeats, a
tie where the interval (Bonferroni-corrected for the sizes of the table) contains 1.0.

Loaded pass (--load, the default; --no-load skips it), at 2 ranks only: in each repeat, after
the idle runs at 2 ranks, ucx and mpi (default decision) are run again for the dedicated 8 B
latency run (same flags as the idle one) and a 4 MiB run (-b 4M -e 4M), each while the script
keeps one busy-looping Python process per CPU (os.cpu_count()) running; they are started just
before that run and killed and reaped right after it, also on failure or Ctrl-C. The idle 4 MiB
figure comes from the sweep when it has 4 MiB, else from an extra idle 4 MiB run of ucx and mpi.

Prints, per world size, one table with ucx (and fusebox-perf's launch-to-start of non-blocking
calls, "ucx launch p50/p99 us", when its JSON has it), mpibest (and which algorithm it is), mpi,
gloo (fbmpi), and the busbw ratios ucx/mpibest, ucx/mpi, ucx/gloo; then a compact table of the
OpenMPI algorithm sweep (busbw of mpi and every mpi-aK per size, the best marked); then
"Idle vs loaded (2 ranks)": 8 B latency and 4 MiB busbw of ucx and mpi, idle and loaded, with
their ratios; then the "Targets" section (PASS, FAIL, or N/A when not measured):
  2 ranks:  busbw ucx/mpibest >= 1.0x at every size measured (reports the worst size)
  2 ranks:  8 B latency (the dedicated run) ucx/mpibest <= 1.0x
  2 ranks:  64 MiB busbw ucx/mpibest >= 2.0x, and ucx / memcpy >= 50%
  4 ranks:  busbw ucx/mpibest >= 0.8x at every size measured (reports the worst size)
  loaded, 2 ranks:  8 B latency ucx/mpi <= 1.5x; 4 MiB busbw ucx/mpi >= 0.67x (ucx >= mpi/1.5)
("every size": the sweep's sizes and the extra target-size runs, not the 8 B latency run.)
Writes <out>/report.md, <out>/summary.json (per-tool results, the loaded ones marked "loaded",
mpibest with "best_of", idle_vs_loaded, targets), every tool's JSON and every run's log.

Command templates (--ucx-cmd, --mpi-cmd, --gloo-cmd, --fbmpi-cmd, --memcpy-cmd) replace the
default command prefix of a tool; they are split like a shell line and may use {n} (world
size), {build}, {repo}, {mpirun}, {python}. The common arguments are appended. E.g. to try the
runner before fusebox-perf exists:
  --ucx-cmd '{mpirun} -n {n} --oversubscribe {build}/perf/baselines/fusebox-mpi-allreduce'

Emulated hosts (--emulate RATE; needs root): each world size N of --ranks becomes N emulated
hosts with one rank each, on perf/cluster/emucluster.py's network namespaces with every host's
link shaped to RATE (e.g. 1gbit):
  ucx     emucluster.py run --hosts N --rate RATE -- <build>/perf/fusebox-perf allreduce ...
          (UCX over TCP on the shaped links: UCX_TLS=tcp)
  mpi     emucluster.py mpirun --hosts N --rate RATE -- --oversubscribe
                 <build>/perf/baselines/fusebox-mpi-allreduce ...
          (OpenMPI over its tcp btl on the same links, one orted per host; where the hosts
          outnumber the CPUs, with --mca mpi_yield_when_idle 1, as OpenMPI sets itself on a
          node it knows is oversubscribed: polling ranks that share a core otherwise wait out
          scheduler ticks, 4 ms per 8 B allreduce at 4 hosts on 2 CPUs)
  mpi-aK  as mpi, with the algorithm forced.
Gloo, the memcpy reference and the loaded pass are not run; the targets are "N hosts: busbw
ucx/mpibest >= 1.0x at every size" for each N. The namespaces' names are fixed (prefix fbbnch):
run one emulated benchmark at a time.

Exit status: 0 when every run succeeded with no wrong element (targets FAIL too only with
--strict), 1 when a run failed or reported wrong results, 2 on a usage error or a missing binary.
Only the Python standard library is used.
"""


import argparse
import datetime
import json
import os
import shlex
import sys

from allreduce_plan import execute, make_plan, prepare  # perf/allreduce_plan.py
from allreduce_report import (  # perf/allreduce_report.py: formatting, tables, targets
    LAT_KEY, LOAD_NRANKS, LOAD_SIZE, LOAD_SIZE_NAME, MIB, evaluate_targets,
    idle_vs_loaded_section, md_table, rank_tables, report_head)
from allreduce_stats import aggregate  # perf/allreduce_stats.py: medians, problems, bests
from allreduce_tools import REPO, build_tools, run_text  # perf/allreduce_tools.py
import mpi_tools  # perf/mpi_tools.py: OpenMPI's variants, best-of families, ratio intervals
import results as result_summary  # perf/results.py: the results convention
from toolkit import parse_size  # perf/toolkit.py: the shared helpers

# OpenMPI's coll/tuned allreduce algorithms (coll_tuned_allreduce_algorithm; 0 = its fixed
# decision, which the plain "mpi" tool measures).
MPI_ALGORITHMS = mpi_tools.TUNED_ALGORITHMS


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="fusebox UCX vs MPI_Allreduce vs PyTorch Gloo, side by side.",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(REPO, "build"),
                   help="CMake build directory (default: <repo>/build)")
    p.add_argument("--ranks", default="2,4", help="world sizes, comma-separated (default 2,4)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=64 * MIB)
    p.add_argument("-f", "--stepfactor", type=float, default=4.0,
                   help="size factor (default 4; 8 B and 64 MiB are measured regardless)")
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=None,
                   help="warm-up calls per size (default 5; with --emulate 300, so that the "
                        "UCX backend's measured choice of algorithm, a trial of up to 135 calls "
                        "per size class, and a first switch where rank 0 finds the choice dear "
                        "in use, come before the timed calls; later switches can still come "
                        "among them)")
    p.add_argument("--latency-iters", type=int, default=1000,
                   help="iterations of the dedicated 8 B latency run that the latency targets "
                        "use (default 1000; 0: use the sweep's 8 B numbers)")
    p.add_argument("--latency-warmup", type=int, default=100,
                   help="warm-up iterations of the 8 B latency run (default 100)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of each tool; the median time per size is kept (default 3)")
    p.add_argument("--out", default=None,
                   help="directory for JSON, logs and report.md "
                        "(default <build>/bench-out/<timestamp>)")
    p.add_argument("--mode", choices=["oop", "ip"], default="oop",
                   help="numbers to compare: out-of-place (default) or in-place; a tool lacking "
                        "the mode (Gloo has in-place only) falls back to the other, as marked")
    p.add_argument("--tools", default=None,
                   help="subset of ucx,mpi,gloo to run (default all three; ucx,mpi with "
                        "--emulate; mpi brings the mpi-aK of --mpi-algorithms along)")
    p.add_argument("--emulate", default=None, metavar="RATE",
                   help="emulated hosts (needs root): each world size of --ranks is that many "
                        "hosts, one rank each, with links shaped to RATE (e.g. 1gbit); see below")
    p.add_argument("--with-fusebox-mpi", action="store_true",
                   help="also run fusebox-perf --backend mpi under mpirun (column 'fbmpi')")
    p.add_argument("--mpi-algorithms", default=",".join(str(k) for k in sorted(MPI_ALGORITHMS)),
                   metavar="K,K,...",
                   help="OpenMPI allreduce algorithms run as tools mpi-aK next to 'mpi' "
                        "(coll_tuned_allreduce_algorithm; 1 basic_linear, 2 nonoverlapping, "
                        "3 recursive_doubling, 4 ring, 5 segmented_ring, 6 rabenseifner; "
                        "default all; '' none); 'mpibest' is the best of these and 'mpi'")
    p.add_argument("--load", dest="load", action="store_true", default=True,
                   help="loaded pass (default on): at %d ranks, ucx and mpi again for the 8 B "
                        "latency and %s busbw while one busy loop per CPU runs"
                        % (LOAD_NRANKS, LOAD_SIZE_NAME))
    p.add_argument("--no-load", dest="load", action="store_false", help="skip the loaded pass")
    p.add_argument("--memcpy-size", type=parse_size, default=64 * MIB)
    p.add_argument("--python", default="/usr/bin/python3",
                   help="Python that imports torch (default /usr/bin/python3)")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run (default 900)")
    p.add_argument("--allow-missing", action="store_true",
                   help="skip a tool whose binary is missing instead of stopping")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target FAILs")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--reuse", action="store_true",
                   help="keep the results of runs whose JSON is already in --out (run the "
                        "others): to rebuild the report of an earlier run with the same flags")
    mpi_tools.add_arguments(p)
    for key in ("ucx", "mpi", "gloo", "fbmpi", "memcpy"):
        p.add_argument("--%s-cmd" % key, default=None, metavar="TEMPLATE",
                       help=argparse.SUPPRESS if key != "ucx" else
                       "replace the ucx command prefix (also --mpi-cmd, --gloo-cmd, "
                       "--fbmpi-cmd, --memcpy-cmd); see below")
    args = p.parse_args(argv)
    try:
        args.ranks = [int(x) for x in args.ranks.split(",") if x.strip()]
    except ValueError:
        p.error("--ranks wants integers, e.g. 2,4")
    if not args.ranks or min(args.ranks) < 1:
        p.error("--ranks wants positive integers")
    if args.stepfactor <= 1:
        p.error("-f must be > 1")
    if args.minbytes > args.maxbytes:
        p.error("-b is larger than -e")
    if args.warmup_iters is None:
        args.warmup_iters = 300 if args.emulate else 5
    if args.repeats < 1 or args.iters < 1 or args.warmup_iters < 0:
        p.error("bad --repeats / -n / -w")
    if args.tools is None:
        args.tools = "ucx,mpi" if args.emulate else "ucx,mpi,gloo"
    args.tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    for t in args.tools:
        if t not in ("ucx", "mpi", "gloo"):
            p.error("--tools: unknown tool %r" % t)
    if args.emulate:
        if not args.emulate.replace(".", "").isalnum():
            p.error("--emulate wants a tc rate such as 1gbit or 500mbit, not %r" % args.emulate)
        if "gloo" in args.tools:
            p.error("--emulate runs ucx and mpi only (gloo has no emulated-host launcher here)")
        if args.with_fusebox_mpi:
            p.error("--emulate and --with-fusebox-mpi do not go together")
        if not args.dry_run and os.geteuid() != 0:
            p.error("--emulate needs root (network namespaces and tc)")
        args.load = False
    try:
        args.mpi_algorithms = sorted({int(x) for x in args.mpi_algorithms.split(",")
                                      if x.strip()})
    except ValueError:
        p.error("--mpi-algorithms wants integers, e.g. 3,4")
    for k in args.mpi_algorithms:
        if k not in MPI_ALGORITHMS:
            p.error("--mpi-algorithms: %d is not one of %s (0, OpenMPI's default decision, is "
                    "the 'mpi' tool)" % (k, ",".join(str(a) for a in sorted(MPI_ALGORITHMS))))
    mpi_tools.finish_arguments(p, args, lambda cmd: run_text(cmd))
    args.tools += [k for k in args.mpi_variants if k != "mpi"]
    if "ucx" in args.tools:
        args.tools.insert(args.tools.index("ucx"), "ucxz")
        if args.ucx_wait_each:
            args.tools.insert(args.tools.index("ucx") + 1, "ucxw")
    if args.with_fusebox_mpi:
        args.tools.append("fbmpi")
    args.build = os.path.abspath(args.build)
    if args.out is None:
        args.out = os.path.join(args.build, "bench-out",
                                datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    args.out = os.path.abspath(args.out)
    return args


def main(argv=None):
    args = parse_args(argv)
    s = prepare(args, build_tools(args))
    if s is None:
        return 2
    if not execute(s, make_plan(s)):
        return 0
    aggregate(s)
    lines = report_head(s)
    rank_tables(s, lines)
    s.idle_vs_loaded = idle_vs_loaded_section(s, lines)
    s.targets, s.reference = evaluate_targets(s)
    return finish(s, lines, argv)


def finish(s, lines, argv):
    """Writes report.md, summary.json and the run summary; returns the exit status."""
    args, stats, load_stats, problems, runs = s.args, s.stats, s.load_stats, s.problems, s.runs
    targets, reference, memcpy_gbps, memcpy_vals = s.targets, s.reference, s.memcpy_gbps, \
        s.memcpy_vals
    load_tools, nloopers, load_start, load_end, wall = s.load_tools, s.nloopers, \
        s.load_start, s.load_end, s.wall
    lines.append("")
    lines.append("## Targets")
    lines.append("")
    trows = []
    for t in targets:
        val = "-" if t["value"] is None else (
            "%.0f%%" % (100 * t["value"]) if "memcpy" in t["target"] else "%.2fx" % t["value"])
        trows.append([t["status"], t["target"], val, t["detail"]])
    lines.append(md_table(["result", "target", "measured", "detail"], trows,
                          ["l", "l", "r", "l"]))
    if reference:
        lines.append("")
        lines.append("For reference (not a target):")
        lines.append("")
        lines.extend("- " + r for r in reference)
    lines.append("")
    lines.append("## Problems")
    lines.append("")
    lines.extend(["- " + p for p in problems] or ["none"])
    report = "\n".join(lines) + "\n"

    print()
    print(report)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report)
    results = [dict(tool=k, nranks=n, bytes=abs(b), latency_run=(b == LAT_KEY), loaded=False,
                    **st) for (k, n, b), st in sorted(stats.items())]
    results += [dict(tool=k, nranks=n, bytes=abs(b), latency_run=(b == LAT_KEY), loaded=True,
                     **st) for (k, n, b), st in sorted(load_stats.items())]
    summary = {
        "args": {k: v for k, v in vars(args).items() if k != "mpi_variants"},
        "memcpy_gbps": memcpy_gbps, "memcpy_samples": memcpy_vals,
        "mpi_variants": {k: mpi_tools.label(args.mpi_variants, k) for k in s.coll_tools
                         if k in args.mpi_variants},
        "mpi_probes": s.probes,
        "mpi_not_run": [{"tool": k, "nranks": n, "why": why} for (k, n), why in s.skip.items()],
        "mpibest": [{"family": f, "nranks": n, "bytes": abs(b), "latency_run": b == LAT_KEY,
                     "best_of": stats[(f, n, b)]["best_of"]} for f, n, b in s.best_keys],
        "fair": s.fair,
        "load": {"enabled": bool(load_tools), "nranks": LOAD_NRANKS, "tools": load_tools,
                 "busy_loops": nloopers if load_tools else 0, "busbw_bytes": LOAD_SIZE},
        "idle_vs_loaded": s.idle_vs_loaded,
        "results": results,
        "targets": targets, "reference": reference, "problems": problems,
        "loadavg_start": load_start, "loadavg_end": load_end,
        "runs": [{k: v for k, v in r.items() if k != "doc"} for r in runs],
        "wall_s": wall,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    result_summary.write_run_summary(
        args.out, report, "bench_allreduce", shlex.join(["python3", "perf/bench_allreduce.py"] + (argv or sys.argv[1:])),
        "allreduce side by side: fusebox UCX, OpenMPI, Gloo, memcpy")
    print("report: %s" % os.path.join(args.out, "report.md"))
    print("summary for a results page: %s" % os.path.join(args.out, "result.json"))

    if problems:
        return 1
    if args.strict and any(t["status"] != "PASS" for t in targets):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
