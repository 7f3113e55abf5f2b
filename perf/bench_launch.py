#!/usr/bin/env python3
"""Launch-to-start, side by side: two builds of fusebox-perf, interleaved, on the same machine.

What it measures (fusebox-perf's own figures, 2 local ranks, UCX backend):

  idle      fusebox-perf allreduce --launch S: a non-blocking AllReduce issued after a 1 ms
            pause (the progress thread idle, as when backward hands over its first bucket),
            polled with Test() and never driven; issue -> the backend starting it, and issue ->
            its completion (end to end), p50/p99.
  blocking  fusebox-perf allreduce -z 1 at 8 B: every call waited before the next (the
            caller executes its own collective), mean time per call.
  overlap   fusebox-perf overlap on the bundled profile: every bucket's launch -> start, less
            the time it queued behind the previous bucket's allreduce (the executor's
            reaction), p50/p99 of the worst rank; and the iteration time of each plan.

Each of --repeats rounds runs both builds in alternating order (A B, then B A, ...); a cell's
figure is the median over rounds. Raw outputs (every JSON and log) go to --out.

  python3 perf/bench_launch.py --baseline /tmp/old/build --build build --out build/bench-out/launch

Two settings of one build compare the same way: give the same directory to both and the
flags that differ to --baseline-flags and --flags, e.g.

  python3 perf/bench_launch.py --baseline build --baseline-flags '--ucx_issuer_begins off' \
      --build build --flags '--ucx_issuer_begins on' --out build/bench-out/launch
"""
import argparse
import datetime
import json
import os
import shlex
import sys

import results as result_summary  # perf/results.py: the results convention
import toolkit  # perf/toolkit.py: the shared helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(argv, log_path, timeout):
    code, _ = toolkit.run(argv, timeout, log_path, header="# %s" % " ".join(argv))
    if code != 0:
        with open(log_path) as f:
            tail = f.read()[-2000:]
        raise RuntimeError("%s failed (exit %d); log %s:\n%s" % (argv[0], code, log_path, tail))


def median(xs):
    """The median of the values present (None: not measured), or None."""
    return toolkit.median([x for x in xs if x is not None])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="build directory of the build compared with")
    ap.add_argument("--build", default=os.path.join(REPO, "build"), help="build directory (new)")
    ap.add_argument("--launcher", default=None,
                    help="fusebox-run to start both (default: <build>/tools/fusebox-run)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--samples", type=int, default=50, help="launch samples per size")
    ap.add_argument("--sizes", default="8,65536,4194304", help="bytes, comma-separated")
    ap.add_argument("--overlap-iters", type=int, default=6)
    ap.add_argument("--overlap-plans", default="ddp,per-tensor",
                    help="plans of the overlap replay (fusebox-perf overlap --plans)")
    ap.add_argument("--overlap-scales", default="0.5",
                    help="compute scales of the overlap replay, comma-separated (one replay each)")
    ap.add_argument("--baseline-flags", default="",
                    help="more fusebox-perf flags for every baseline run")
    ap.add_argument("--flags", default="", help="more fusebox-perf flags for every new run")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.samples < 1:
        ap.error("--repeats and --samples must be >= 1")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    launcher = args.launcher or os.path.join(args.build, "tools", "fusebox-run")
    builds = {"baseline": args.baseline, "new": args.build}
    extra = {"baseline": shlex.split(args.baseline_flags), "new": shlex.split(args.flags)}
    scales = [s for s in args.overlap_scales.split(",") if s]
    for name, b in builds.items():
        if not os.path.exists(os.path.join(b, "perf", "fusebox-perf")):
            print("bench_launch: %s: no perf/fusebox-perf under %s" % (name, b), file=sys.stderr)
            return 2
    os.makedirs(args.out, exist_ok=True)

    results = {name: {"idle": {s: [] for s in sizes}, "idle_done": {s: [] for s in sizes},
                      "blocking": [], "overlap": {}}
               for name in builds}
    for rep in range(args.repeats):
        order = list(builds) if rep % 2 == 0 else list(reversed(list(builds)))
        for name in order:
            perf = os.path.join(builds[name], "perf", "fusebox-perf")
            tag = "%s-r%d" % (name, rep)
            print("[round %d] %s ..." % (rep + 1, name), flush=True)
            for s in sizes:
                j = os.path.join(args.out, "%s-idle-%d.json" % (tag, s))
                run([launcher, "-n", "2", "--", perf, "allreduce", "-b", str(s), "-e", str(s),
                     "-n", "5", "-w", "2", "--launch", str(args.samples), "--json", j]
                    + extra[name],
                    j.replace(".json", ".log"), args.timeout)
                row = json.load(open(j))["results"][0]
                results[name]["idle"][s].append(row.get("launch_us"))
                results[name]["idle_done"][s].append(row.get("launch_done_us"))
            j = os.path.join(args.out, "%s-blocking.json" % tag)
            run([launcher, "-n", "2", "--", perf, "allreduce", "-b", "8", "-e", "8", "-z", "1",
                 "-n", "2000", "-w", "200", "--launch", "0", "--json", j] + extra[name],
                j.replace(".json", ".log"), args.timeout)
            results[name]["blocking"].append(json.load(open(j))["results"][0]["ip"]["time_us"])
            for scale in scales:
                j = os.path.join(args.out, "%s-overlap%s.json" % (
                    tag, "" if scales == ["0.5"] else "-s" + scale))
                run([launcher, "-n", "2", "--", perf, "overlap", "--plans", args.overlap_plans,
                     "--compute_scale", scale, "-n", str(args.overlap_iters), "-w", "1",
                     "--json", j] + extra[name], j.replace(".json", ".log"), args.timeout)
                for r in json.load(open(j))["results"]:
                    key = r["plan"] if len(scales) == 1 else "%s@%s" % (r["plan"], scale)
                    results[name]["overlap"].setdefault(key, []).append(r)

    lines = ["# Launch-to-start: %s %s vs %s %s" % (args.build, args.flags, args.baseline,
                                                   args.baseline_flags), "",
             "- %s, %d rounds (builds alternating), 2 ranks, UCX; medians over rounds" % (
                 datetime.datetime.now().isoformat(timespec="seconds"), args.repeats),
             "- load average at the end: %.1f on %d CPUs" % (os.getloadavg()[0], os.cpu_count()),
             "", "| figure | baseline | new | new / baseline |", "|---|---|---|---|"]

    def add(label, a, b, fmt="%.1f"):
        ratio = "%.2fx" % (b / a) if a and b is not None else "-"
        lines.append("| %s | %s | %s | %s |" % (label, fmt % a if a is not None else "-",
                                               fmt % b if b is not None else "-", ratio))

    for s in sizes:
        for q in ("p50", "p99"):
            vals = [median([d[q] for d in results[n]["idle"][s] if d]) for n in builds]
            add("idle launch-to-start %d B, %s (us)" % (s, q), *vals)
        for q in ("p50", "p99"):
            vals = [median([d[q] for d in results[n]["idle_done"][s] if d]) for n in builds]
            add("idle launch-to-done %d B, %s (us)" % (s, q), *vals)
    add("blocking 8 B, time per call (us)", *[median(results[n]["blocking"]) for n in builds],
        fmt="%.2f")
    for plan in sorted(results["new"]["overlap"]):
        for key, label in (("reaction_p50_us", "reaction p50 (us)"),
                           ("reaction_p99_us", "reaction p99 (us)"),
                           ("iteration_us", "iteration (ms)")):
            vals = []
            for n in builds:
                v = median([r.get(key) for r in results[n]["overlap"].get(plan, [])])
                vals.append(v / 1e3 if v is not None and key == "iteration_us" else v)
            add("overlap %s: %s" % (plan, label), *vals, fmt="%.2f")
    report = "\n".join(lines) + "\n"
    print(report)
    result_summary.write_run_summary(
        args.out, report, "bench_launch", shlex.join(["python3"] + sys.argv),
        "launch-to-start of the UCX backend, two builds or flag sets interleaved")
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write("# %s\n\n" % " ".join([os.path.basename(sys.executable)] + sys.argv) + report)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
