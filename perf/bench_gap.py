#!/usr/bin/env python3
"""How far measured plans are from the lower bound, and where the difference goes.

For each model in --models and each communication ratio R in --ratios (one allreduce of all
gradient bytes takes R times the replayed backward: 0.5 compute-bound, 1 balanced, 2
communication-bound) it runs, on 2 local ranks, from an empty policy cache:

  <build>/tools/fusebox-run -n 2 -- <build>/perf/fusebox-perf overlap --profile MODEL
      --compute_scale auto --comm_ratio R --plans PLANS --explain -n ROUNDS -w 1 --json ...

Every plan is measured in randomised blocks (each round visits every plan once, in a fresh
order, after the same warm-up), so the rounds pair the plans. It prints, per model and ratio:

  * every plan's median iteration [95% CI] and its ratio to the lower bound (docs/design.md);
  * best/bound: the best measured plan's median over the bound (target <= 1.10);
  * tuned/best: the paired ratio of the tuned plan to the best plan that is not the tuned one,
    median over rounds [order-statistic 95% CI] (target <= 1.05; with fewer than 6 rounds no
    order-statistic interval reaches 95%, and the one printed is min..max);
  * the gap report of every plan (fusebox-perf overlap --explain): where iteration - bound goes;
  * exposed communication measured and predicted (autotune::Simulate with the overlap terms
    calibrated at the start of each run on DDP's default plan and DDP with 2 MiB buckets:
    slowdown and cost per collective, while backward runs and after it; the cost model fitted
    to the allreduce sizes timed again in every round, the median of each), and over the
    held-out plans the median and p90 of |error| and how many are under- and over-predicted;
    beside it the same figures under the sizes timed once before the rounds (the earlier
    prediction), for comparison;
  * the precision of the measured medians themselves: each held-out run's rounds drawn again
    with replacement (a bootstrap, from a fixed seed), and how far the median moves, median and
    p90 over all draws. A prediction that knew every run's true median would miss the measured
    one by at least about this much: the bootstrap treats rounds as independent, so slow
    phases longer than a round and shifts between runs are not in it. On a 2-vCPU VM the
    exposed time of one plan moves from round to round by an order of magnitude (a bucket that
    stalls for milliseconds); a median of 7 rounds moved by p90 about 40%, of 21 about 24%,
    while two 21-round sweeps differed by p90 62% (commit 9e140a7). Hence 21 rounds
    by default.

With --repeats K > 1 the whole sweep runs K times, one after another, and the report adds:

  * the measurement's own repeatability: for every held-out plan of every cell, how far its
    measured exposed communication moved between repeats (|a - b| / mean over each pair of
    repeats), median and p90: no prediction can match one run more closely than the runs
    match each other;
  * the prediction error pooled over the repeats: per plan and cell, the mean prediction
    against the mean measurement, with the same median, p90 and sides; also over the plans
    whose mean exposed communication is at least 1 ms (below it a relative error measures
    scheduling jitter, not the model).

Writes <out>/<model>-r<R>[-k<repeat>].json and .log for each run and <out>/report.txt (what
is printed).
Exit status: 0 when every run succeeded. Standard library only.
"""

import argparse
import datetime
import json
import math
import os
import random
import shlex
import subprocess
import sys
import tempfile

import results as result_summary  # perf/results.py: the results convention
import toolkit  # perf/toolkit.py: the shared helpers (median_ci, run)
from toolkit import median

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TERMS = ["late_gradients", "window", "launch_to_start", "transfer_excess", "copy_back", "plan",
         "tail"]


def quantile(sorted_xs, q):
    """The smallest value with at least a fraction q of the values at or below it."""
    return sorted_xs[min(len(sorted_xs) - 1, max(0, int(math.ceil(q * len(sorted_xs))) - 1))]


BOOTSTRAP_DRAWS = 200


def bootstrap_median_moves(rounds, measured, rng):
    """How far the median of a run's rounds moves when its rounds are drawn again with
    replacement (BOOTSTRAP_DRAWS times), relative to the measured median."""
    if len(rounds) < 2 or not measured > 0:
        return []
    return [abs(median([rng.choice(rounds) for _ in rounds]) - measured) / measured
            for _ in range(BOOTSTRAP_DRAWS)]


def error_line(errors):
    """Median and p90 of |error| and the split between sides, against the targets."""
    a_err = sorted(abs(e) for e in errors)
    under = sum(1 for e in errors if e < 0)
    return ("median |error| %.0f%% (target <= 20%%), p90 %.0f%% (target <= 35%%), "
            "under-predicted %d (%.0f%%), over-predicted %d (%.0f%%) (target: 35-65%% each side)"
            % (100 * median(a_err), 100 * quantile(a_err, 0.9), under,
               100.0 * under / len(errors), len(errors) - under,
               100.0 * (len(errors) - under) / len(errors)))


def report_prediction(say, errors, errors_before, precision):
    """The exposed-communication prediction errors of the held-out plans, and how precise the
    measured medians are themselves."""
    say()
    say("## exposed-communication prediction, held-out plans (every plan but DDP's default, "
        "which calibrated the overlap with DDP at 2 MiB, and tuned)")
    say("runs %d: %s" % (len(errors), error_line(errors)))
    if len(errors_before) == len(errors):
        say("  the same runs under the sizes timed once before the rounds (the earlier "
            "prediction): %s" % error_line(errors_before))
    if precision:
        p_sorted = sorted(precision)
        say("  precision of the measured medians themselves (each run's rounds drawn again "
            "%d times): median %.0f%%, p90 %.0f%% (at least about how far a prediction that "
            "knew each run's true median would be from the measured one; runs differ more)" %
            (BOOTSTRAP_DRAWS, 100 * median(p_sorted), 100 * quantile(p_sorted, 0.9)))


def report_repeatability(say, held_out, repeats):
    """Run-to-run scatter of the held-out plans' exposed time, and the prediction error of the
    repeats' mean (held_out: (model, ratio, plan) -> [(measured, predicted, predicted before)]
    per repeat)."""
    scatter = []
    pooled, pooled_1ms, pooled_before = [], [], []
    # Only plan-cells measured in every repeat (a failed run leaves gaps).
    complete = {k: v for k, v in held_out.items() if len(v) == repeats}
    for samples in complete.values():
        meas = [m for m, _, _ in samples]
        for i in range(len(meas)):
            for k in range(i + 1, len(meas)):
                mean = (meas[i] + meas[k]) / 2
                if mean > 0:
                    scatter.append(abs(meas[i] - meas[k]) / mean)
        m = sum(meas) / len(meas)
        p = sum(q for _, q, _ in samples) / len(samples)
        if m > 0:
            pooled.append((p - m) / m)
            if all(b > 0 for _, _, b in samples):
                pb = sum(b for _, _, b in samples) / len(samples)
                pooled_before.append((pb - m) / m)
            if m >= 1000:
                pooled_1ms.append((p - m) / m)
    say()
    say("## repeatability and pooled prediction over %d repeats (held-out plans; %d "
        "plan-cells in every repeat, %d left out)" % (repeats, len(complete),
                                                      len(held_out) - len(complete)))
    if scatter:
        s_sorted = sorted(scatter)
        say("measured exposed, run to run (|a - b| / mean, %d pairs): median %.0f%%, p90 %.0f%%"
            " (the noise floor of one run)" % (len(scatter), 100 * median(s_sorted),
                                               100 * quantile(s_sorted, 0.9)))
    if pooled:
        say("mean of the repeats, %d plan-cells: %s" % (len(pooled), error_line(pooled)))
    if pooled_before and len(pooled_before) == len(pooled):
        say("  under the sizes timed once before the rounds: %s" % error_line(pooled_before))
    if pooled_1ms:
        say("  those exposing >= 1 ms, %d plan-cells: %s" % (len(pooled_1ms),
                                                             error_line(pooled_1ms)))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--outdir", default=os.path.join(REPO, "build", "bench-out", "gap"),
                    help="a timestamped directory is made under it")
    ap.add_argument("--models", default="resnet50,vit_b16,gpt2_small")
    ap.add_argument("--ratios", default="0.5,1,2")
    ap.add_argument("--plans", default="ddp,ddp-cap1mb,ddp-cap5mb,ddp-cap100mb,horovod,mg-wfbp,tuned")
    ap.add_argument("-n", "--rounds", type=int, default=21,
                    help="rounds per cell (see 'precision' above: a median of 7 rounds moves "
                    "by p90 about 40%% when the rounds are drawn again, of 21 about 24%%)")
    ap.add_argument("--timeout", type=int, default=1800, help="per run, seconds")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run the whole sweep this many times (see above)")
    ap.add_argument("--perf_flags", default="",
                    help="more fusebox-perf flags for every run (e.g. '--ucx_shm_stores cached')")
    a = ap.parse_args()

    run_tool = os.path.join(a.build, "tools", "fusebox-run")
    perf = os.path.join(a.build, "perf", "fusebox-perf")
    for tool in (run_tool, perf):
        if not os.access(tool, os.X_OK):
            sys.exit("bench_gap: %s is missing; build first (bash scripts/build.sh)" % tool)
    out = os.path.join(a.outdir, datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    say("# bench_gap: 2 local ranks, ucx; plans %s; %d randomised rounds; empty policy cache "
        "per run" % (a.plans, a.rounds))
    say("# command per cell: fusebox-run -n 2 -- fusebox-perf overlap --profile MODEL "
        "--compute_scale auto --comm_ratio R --plans %s --explain -n %d -w 1 %s" %
        (a.plans, a.rounds, a.perf_flags))
    if a.repeats < 1:
        sys.exit("bench_gap: --repeats must be at least 1")
    failed = 0
    summary = []
    errors = []  # exposed-communication prediction errors of the held-out plans
    errors_before = []  # the same under the sizes timed before the rounds
    precision = []  # every bootstrap draw of every held-out run: |its median - median| / median
    rng = random.Random(1)
    held_out = {}  # (model, ratio, plan) -> [(measured, predicted) per repeat]
    cells = [(k, m, r) for k in range(a.repeats) for m in a.models.split(",")
             for r in a.ratios.split(",")]
    for repeat, model, ratio in cells:
        stem = os.path.join(out, "%s-r%s" % (model, ratio))
        if a.repeats > 1:
            stem += "-k%d" % (repeat + 1)
        with tempfile.TemporaryDirectory() as cache:
            cmd = [run_tool, "-n", "2", "--", perf, "overlap", "--profile", model,
                   "--compute_scale", "auto", "--comm_ratio", ratio, "--plans", a.plans,
                   "--explain", "-n", str(a.rounds), "-w", "1", "--cache_dir", cache,
                   "--json", stem + ".json"] + shlex.split(a.perf_flags)
            try:
                code, output = toolkit.run(cmd, a.timeout)
            except subprocess.TimeoutExpired as e:
                output, code = toolkit.partial_output(e), "timeout after %d s" % a.timeout
        with open(stem + ".log", "w") as f:
            f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n" + output)
        if code != 0:
            failed += 1
            say("## %s, t(all)/T_b = %s: FAILED (exit %s; see %s.log)" %
                (model, ratio, code, stem))
            continue
        with open(stem + ".json") as f:
            j = json.load(f)
        res = {r["plan"]: r for r in j["results"]}
        say()
        say("## %s, t(all)/T_b = %s%s (compute scale %.4g, backward %.2f ms, %d ranks)" %
            (model, ratio, ", repeat %d" % (repeat + 1) if a.repeats > 1 else "",
             j["compute_scale"], j["backward_us"] / 1e3, j["nranks"]))
        say("overlap: slowdown %.2f, %.0f us per collective; after backward %.2f, %.0f us "
            "(calibrated on DDP's default plan and DDP with 2 MiB buckets)" %
            (j["overlap_slowdown"], j.get("overlap_overhead_us", 0),
             j.get("after_backward_slowdown", 1), j.get("after_backward_overhead_us", 0)))
        say("| plan | buckets | iter ms | 95% CI | iter/bound | exposed ms | pred exposed | "
            "exp err | " + " | ".join(t.replace("_", " ") for t in TERMS) + " |")
        say("| --- " * (8 + len(TERMS)) + "|")
        for r in j["results"]:
            lo, hi = r["iteration_ci95_us"]
            g = r["gap"]
            err = None
            if r["predicted_us"] > 0 and r["exposed_us"] > 0:
                err = (r["predicted_exposed_us"] - r["exposed_us"]) / r["exposed_us"]
                # DDP's default (and DDP with 2 MiB buckets, not in the list)
                # calibrated the overlap: the others are held out.
                if r["plan"] not in ("ddp", "tuned"):
                    errors.append(err)
                    precision += bootstrap_median_moves(r.get("exposed_rounds_us", []),
                                                        r["exposed_us"], rng)
                    if r.get("predicted_before_us", 0) > 0:
                        errors_before.append((r["predicted_before_exposed_us"] - r["exposed_us"])
                                             / r["exposed_us"])
            if r["plan"] not in ("ddp", "tuned") and r["predicted_us"] > 0:
                # Every repeat's figures, none exposed (0) included.
                held_out.setdefault((model, ratio, r["plan"]), []).append(
                    (r["exposed_us"], r["predicted_exposed_us"],
                     r.get("predicted_before_exposed_us", 0)))
            say("| %s | %d | %.2f | [%.2f, %.2f] | %.3f | %.2f | %.2f | %s | %s |" % (
                r["plan"], r["buckets"], r["iteration_us"] / 1e3, lo / 1e3, hi / 1e3,
                r["iteration_us"] / r["bound_us"], r["exposed_us"] / 1e3,
                r["predicted_exposed_us"] / 1e3,
                "n/a" if err is None else "%+.0f%%" % (100 * err),
                " | ".join("%.2f" % (g[t + "_us"] / 1e3) for t in TERMS)))
        others = [r for r in j["results"] if r["plan"] != "tuned"]
        best = min(others, key=lambda r: r["iteration_us"])
        line = "best measured: %s, best/bound %.3f" % (
            best["plan"], best["iteration_us"] / best["bound_us"])
        if "tuned" in res:
            t = res["tuned"]
            # Paired by round: the tuned plan against the best non-tuned plan of the run.
            pairs = [x / y for x, y in zip(t["iterations_us"], best["iterations_us"])]
            lo, hi, _ = toolkit.median_ci(pairs)
            line += "; tuned kept %s; tuned/best %.3f [%.3f, %.3f] over %d rounds" % (
                t.get("chosen", "?"), median(pairs), lo, hi, len(pairs))
            summary.append((model, ratio if a.repeats == 1 else "%s (%d)" % (ratio, repeat + 1),
                            best["iteration_us"] / best["bound_us"],
                            median(pairs), lo, hi, t.get("chosen", "?")))
        say(line)
    say()
    say("## summary (targets: best/bound <= 1.10, tuned/best <= 1.05)")
    say("| model | t(all)/T_b | best/bound | tuned/best | 95% CI | tuned kept |")
    say("| --- | --- | --- | --- | --- | --- |")
    for m, r, bb, tb, lo, hi, chosen in summary:
        say("| %s | %s | %.3f | %.3f | [%.3f, %.3f] | %s |" % (m, r, bb, tb, lo, hi, chosen))
    if errors:
        report_prediction(say, errors, errors_before, precision)
    if a.repeats > 1 and held_out:
        report_repeatability(say, held_out, a.repeats)
    with open(os.path.join(out, "report.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    result_summary.write_run_summary(out, "\n".join(lines) + "\n", "bench_gap",
                                     shlex.join(["python3"] + sys.argv),
                                     "measured plans against the lower bound")
    print("wrote %s" % out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
