#!/usr/bin/env python3
"""Is a small regression of the kept plan rolled back on live runs? An injected loss, run by run.

    COMPUTE IS EMULATED DEVICE TIME (perf/devtime.py: the host sleeps);
    COMMUNICATION IS REAL (DDP's gloo allreduce between 2 ranks, in network
    namespaces on a tbf-shaped veth link, or on loopback). Label every number
    from it as such.

fusebox keeps a plan other than the user's DDP buckets only when it measured it
faster; after that, one step of the user's buckets every few steps is paired
with the kept plan's next step, and a sequential test on those pairs falls back
to the user's buckets once the kept plan is --inject (3%) slower than them
(Note [Catching small regressions] in autotune/regression.h). Here the loss is
made on purpose: each of --runs launches of perf/trust_worker.py trains the
device-time model under DDP (bucket_cap_mb --cap) + fusebox, and --inject-after
steps after fusebox keeps another plan, every step of that plan takes
(1 + --inject) x the baseline's verified median step (the difference slept
before backward, as a slower kernel would take it), while the baseline's own
check steps run as before. A run counts as rolled back when the hook falls back
to the user's buckets before its last step.

Report: one row per run (seed, the plan kept, its verified gain, the step it was
kept at, the extra device time injected per step, the step it fell back at, the
steps and check pairs that took), then how many of the runs that kept a plan
rolled it back (target: 9 of 10), and the median delay. A run in which fusebox
kept the user's buckets has nothing to regress and is reported as such; choose
a --cap that fusebox replaces (the default 100 MiB: one bucket, no overlap).

Output in --out (default build/bench-out/rollback/<timestamp>/): raw/*.json,
logs/, report.md and result.json (perf/results.py's summary). Shaped links need
root; the namespaces are those of perf/bench_trust.py and perf/bench_ddp_hook.py
(not at the same time).

    sudo /usr/bin/python3 perf/bench_rollback.py --runs 10
    /usr/bin/python3 perf/bench_rollback.py --link loopback --runs 1 --steps 150   # a quick look
"""
import argparse
import json
import os
import random
import shlex
import signal
import socket
import statistics
import sys
import time

import netns  # perf/netns.py: namespaces, shaping, ports
import bench_trust as trust     # perf/bench_trust.py: scales, launches, preflight
from trust_report import step_noise  # noqa: F401  (its tests call rb.step_noise)
import results as result_summary

REPO = trust.REPO
TARGET_RUNS = 0.9  # of the runs that kept a plan, rolled back before the end


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cap", type=float, default=100.0,
                    help="the user's bucket_cap_mb (MiB); pick one fusebox replaces "
                         "(default: %(default)s)")
    ap.add_argument("--runs", type=int, default=10, help="launches (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=500,
                    help="steps per launch: tuning (~60), --inject-after, then the detection "
                         "(default: %(default)s)")
    ap.add_argument("--inject", type=float, default=0.03,
                    help="the regression against the baseline, a fraction (default: "
                         "%(default)s)")
    ap.add_argument("--inject-after", type=int, default=30,
                    help="steps from the decision to the injection (default: %(default)s)")
    ap.add_argument("--link", default="1gbit", help="a tc rate, or loopback (default: "
                                                     "%(default)s)")
    ap.add_argument("--profile", default="resnet50")
    ap.add_argument("--compute-scale", type=float, default=None,
                    help="as in perf/bench_trust.py (default: forward + backward ~%g ms)"
                         % trust.COMPUTE_TARGET_MS)
    ap.add_argument("--param-scale", type=float, default=None,
                    help="as in perf/bench_trust.py (default: one allreduce ~ backward)")
    ap.add_argument("--seed", type=int, default=None, help="draws the runs' tuner seeds")
    ap.add_argument("--out", default=None)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--python", default=netns.PYTHON)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per launch")
    ap.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                    help="launch nothing: analyse the runs in DIR/raw again (with the run's "
                         "own settings) and rewrite DIR/report.md and DIR/result.json")
    args = ap.parse_args(argv)
    if args.link != "loopback" and not netns.RATE.match(args.link):
        ap.error("--link %r is neither 'loopback' nor a tc rate like 1gbit" % args.link)
    if args.runs < 1 or args.steps < 100:
        ap.error("need --runs >= 1 and --steps >= 100")
    if not 0 < args.inject < 1 or args.inject_after < 0 or args.cap <= 0:
        ap.error("need --inject in (0, 1), --inject-after >= 0 and --cap > 0")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2 ** 31)
    args.caps = [args.cap]  # what bench_trust's scales and launcher read
    return args


def analyze(launch, steps):
    """One run's row from rank 0's JSON line."""
    fb = launch.get("fusebox") or {}
    inj = fb.get("injection") or {}
    row = {"seed": fb.get("seed"), "decision": trust.short_decision(fb),
           "kept_buckets": fb.get("buckets"), "checks": fb.get("checks"),
           "fallbacks": fb.get("fallbacks"), **inj}
    if inj.get("decided_at") is not None and launch.get("step_ms"):
        row["noise"] = step_noise(launch["step_ms"], inj["decided_at"])
    if inj.get("decided_at") is None:
        row["outcome"] = "kept yours: nothing to regress"
    elif inj.get("inject_at") is not None and inj["inject_at"] >= steps:
        row["outcome"] = "kept late: no step injected"
    elif inj.get("fallback_at") is not None and inj["fallback_at"] >= inj["inject_at"]:
        row["outcome"] = "rolled back"
        row["delay_steps"] = inj["fallback_at"] - inj["inject_at"]
    elif inj.get("fallback_at") is not None:
        row["outcome"] = "fell back before the injection"
    else:
        row["outcome"] = "not rolled back in %d steps" % (steps - inj["inject_at"])
    if inj.get("baseline_ms"):
        row["gain"] = 1 - inj["kept_ms"] / inj["baseline_ms"]
    return row


def fmt(v, spec):
    return "-" if v is None else spec % v


def format_report(args, rows):
    lines = ["## injected regression of %g%% against the user's DDP (bucket_cap_mb=%g)"
             % (args.inject * 100, args.cap), "",
             "%s; %d steps per run; the kept plan's steps made (1 + %g) x the baseline's "
             "verified median from %d steps after the decision; delay = steps from the "
             "injection to the fallback; step noise = 1.4826 x the median absolute deviation "
             "of log(step i+1 / step i) after the decision, about the noise of a check pair's "
             "log-ratio (Note [Catching small regressions] in autotune/regression.h gives the "
             "pairs a 3%% regression takes at each noise)."
             % (trust.caption(args, "One launch per run").rstrip("."), args.steps, args.inject,
                args.inject_after), "",
             "| run | kept | gain | kept at step | extra ms/step | injected at | fell back at | "
             "delay steps | checks | step noise | outcome |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for i, r in enumerate(rows, 1):
        lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            i, r["decision"], fmt(None if r.get("gain") is None else 100 * r["gain"], "%.1f%%"),
            fmt(r.get("decided_at"), "%d"), fmt(r.get("extra_ms"), "%.1f"),
            fmt(r.get("inject_at"), "%d"), fmt(r.get("fallback_at"), "%d"),
            fmt(r.get("delay_steps"), "%d"), fmt(r.get("checks"), "%d"),
            fmt(r.get("noise"), "%.3f"), r["outcome"]))
    eligible = [r for r in rows if r.get("decided_at") is not None
                and r.get("inject_at", args.steps) < args.steps]
    rolled = [r for r in eligible if r["outcome"] == "rolled back"]
    delays = [r["delay_steps"] for r in rolled]
    need = -(-int(TARGET_RUNS * 100) * len(eligible) // 100)
    verdict = "PASS" if eligible and len(rolled) >= need else "FAIL"
    lines += ["", "| runs | kept a plan | rolled back | median delay steps | max delay steps | "
                  "target | verdict |",
              "| ---: | ---: | ---: | ---: | ---: | --- | --- |",
              "| %d | %d | %d | %s | %s | >= %d of %d | %s |" % (
                  len(rows), len(eligible), len(rolled),
                  fmt(statistics.median(delays) if delays else None, "%.0f"),
                  fmt(max(delays) if delays else None, "%d"), need, len(eligible), verdict)]
    return "\n".join(lines) + "\n"


def reanalyse(args, command):
    """--from DIR: the report again from DIR/raw, under the run's own head."""
    raws = []
    for name in os.listdir(os.path.join(args.from_dir, "raw")):
        with open(os.path.join(args.from_dir, "raw", name)) as f:
            raws.append(json.load(f))
    raws.sort(key=lambda r: r["run"])
    with open(os.path.join(args.from_dir, "report.md")) as f:
        head = [line for line in f.read().splitlines() if line.startswith("# ")]
    # The run's own settings: its command line (the report's first line),
    # with the scales the worker reported.
    run_args = parse_args(shlex.split(head[0][2:])[2:])
    model = raws[0]["launch"]["model"]
    run_args.compute_scale, run_args.param_scale = model["compute_scale"], model["param_scale"]
    run_args.runs = len(raws)
    head += ["# re-analysed %s: %s" % (time.strftime("%Y-%m-%d %H:%M:%S"), command)]
    rows = [analyze(r["launch"], run_args.steps) for r in raws]
    return run_args, head, rows


def main(argv=None):
    args = parse_args(argv)
    command = shlex.join([sys.executable] + (sys.argv if argv is None else
                                             [sys.argv[0]] + list(argv)))
    if args.from_dir:
        run_args, head, rows = reanalyse(args, command)
        write_report(run_args, head, rows, args.from_dir, head[0][2:])
        return
    trust.preflight(args)
    figures = trust.choose_scales(args)
    outdir = args.out or os.path.join(REPO, "build", "bench-out", "rollback",
                                      time.strftime("%Y%m%d-%H%M%S"))
    for sub in ("raw", "logs"):
        os.makedirs(os.path.join(outdir, sub), exist_ok=True)
    head = ["# %s" % command, "# started %s on %s (%d CPUs); seed %d" % (
        time.strftime("%Y-%m-%d %H:%M:%S"), socket.gethostname(), os.cpu_count() or 0,
        args.seed)] + ["# " + line for line in trust.describe_scales(figures, args)[:4]]
    print("\n".join(head), flush=True)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, trust.exit_on_signal)
    seeds = random.Random(args.seed)
    launcher = trust.Launcher(args, outdir)
    extra = ["--inject-regression", repr(args.inject), "--inject-after", str(args.inject_after)]
    rows, shaped = [], args.link != "loopback"
    try:
        if shaped:
            netns.setup(args.link)
        for run in range(1, args.runs + 1):
            seed = seeds.randrange(1, 2 ** 63)
            launch = launcher.run("rollback-run%d" % run, "fusebox", args.cap, seed, extra)
            row = analyze(launch, args.steps)
            rows.append(row)
            with open(os.path.join(outdir, "raw", "run%d.json" % run), "w") as f:
                json.dump({"run": run, "seed": seed, "row": row, "launch": launch}, f)
            print("# run %d: %s; %s" % (run, row["decision"], row["outcome"]), flush=True)
    except RuntimeError as e:
        sys.exit("bench_rollback: %s" % e)
    except KeyboardInterrupt:
        sys.exit("bench_rollback: interrupted (finished runs are in %s)" % outdir)
    finally:
        launcher.kill()
        if shaped:
            netns.teardown()
    write_report(args, head, rows, outdir, command)


def write_report(args, head, rows, outdir, command):
    body = format_report(args, rows)
    print("\n" + body, end="", flush=True)
    report = "\n".join(head) + "\n\n" + body
    with open(os.path.join(outdir, "report.md"), "w") as f:
        f.write(report)
    result_summary.write_run_summary(outdir, report, "bench_rollback", command,
                                     "an injected regression rolled back on live runs")
    print("# written to %s" % outdir)


if __name__ == "__main__":
    main()
