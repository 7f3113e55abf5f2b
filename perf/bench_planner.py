#!/usr/bin/env python3
"""Interleaved timing of two fusebox-tune builds: is the planner any slower after a change?

Each round runs every binary once on the same command, in an order rotated from round to round,
so that what the machine does over time falls on both alike:

  python3 perf/bench_planner.py --binary before=/tmp/before/tools/fusebox-tune \\
      --binary after=build/tools/fusebox-tune --rounds 12 -- sweep

The default command, `sweep`, runs the offline planner (autotune::OfflineTune) on every shipped
profile under every preset cost model at 8, 64, 512 and 4096 ranks. It prints each binary's
median wall time over the rounds [order-statistic 95% CI], and for every binary after the
first its ratio to the first: the median over rounds of its time / the first's in the same
round [95% CI] (< 1: faster). Every run's standard output must be the same as the first
binary's (the planner's answers unchanged), or the run fails. With --out, the report goes to
<out>/report.txt and its compact summary to <out>/result.json (perf/results.py).
"""
import argparse
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from toolkit import median, median_ci  # noqa: E402  perf/toolkit.py: the shared helpers
import results as result_summary  # noqa: E402  perf/results.py: the results convention

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", action="append", default=[], metavar="NAME=PATH",
                    help="a fusebox-tune to time (two or more; the first is the reference)")
    ap.add_argument("--rounds", type=int, default=12, help="rounds (default: %(default)s)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run")
    ap.add_argument("--out", default=None, help="directory for report.txt and result.json")
    ap.add_argument("command", nargs="*", default=["sweep"],
                    help="fusebox-tune's arguments (after --; default: sweep)")
    args = ap.parse_args(argv)
    binaries = []
    for spec in args.binary:
        name, sep, path = spec.partition("=")
        if not sep or not name or not os.access(path, os.X_OK):
            ap.error("--binary %r: expected NAME=PATH of an executable" % spec)
        binaries.append((name, path))
    if len(binaries) < 2 or len({n for n, _ in binaries}) != len(binaries):
        ap.error("need two or more --binary with distinct names")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    args.binaries = binaries
    return args


def run_once(path, command, timeout):
    """(wall seconds, stdout) of one run; raises on failure."""
    start = time.perf_counter()
    p = subprocess.run([path] + command, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if p.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (shlex.join([path] + command), p.returncode,
                                                 p.stderr.strip()[-2000:]))
    return wall, p.stdout


def ci_text(values, fmt):
    low, high, _ = median_ci(values)
    return ("%s [%s, %s]" % (fmt, fmt, fmt)) % (median(values), low, high)


def report(args, times):
    """The table: per binary its median time and its ratio to the first binary."""
    ref = args.binaries[0][0]
    cov = median_ci(times[ref])[2]
    lines = ["## %s" % shlex.join(["fusebox-tune"] + args.command),
             "%d rounds, order rotated per round; interval: order statistics, coverage %.1f%%"
             % (args.rounds, 100 * cov), "",
             "| binary | wall s [CI] | ratio to %s [CI] |" % ref, "|---|---:|---:|"]
    for name, _ in args.binaries:
        ratio = ("1" if name == ref else
                 ci_text([t / r for t, r in zip(times[name], times[ref])], "%.3f"))
        lines.append("| %s | %s | %s |" % (name, ci_text(times[name], "%.3f"), ratio))
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    times = {name: [] for name, _ in args.binaries}
    expected = None
    for r in range(args.rounds):
        k = r % len(args.binaries)
        for name, path in args.binaries[k:] + args.binaries[:k]:
            try:
                wall, out = run_once(path, args.command, args.timeout)
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
                sys.exit("bench_planner: %s" % e)
            if expected is None:
                expected = out
            elif out != expected:
                sys.exit("bench_planner: %s printed other results than the first run (round %d)"
                         % (name, r + 1))
            times[name].append(wall)
        print("# round %d: %s" % (r + 1, ", ".join("%s %.3f s" % (n, times[n][-1])
                                                    for n, _ in args.binaries)), flush=True)
    text = report(args, times)
    print(text, end="")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "report.txt"), "w") as f:
            f.write(text)
        command = shlex.join([sys.executable] + (sys.argv if argv is None else
                                                 [sys.argv[0]] + list(argv)))
        result_summary.write_run_summary(args.out, text, "bench_planner", command,
                                         "the offline planner's wall time, interleaved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
