#!/usr/bin/env python3
"""Does choosing within the model's error pay? (Note [Choosing under the model's error] in
autotune/planner.h; docs/design.md, "Choosing under the model's error".)

On 2 local ranks (UCX), for each model in --models and communication ratio R in --ratios:

  1. once per run: an allreduce sweep on this machine (fusebox-perf allreduce --json) and the
     cost model fitted to it (fusebox-tune fit);
  2. the model's profile with its compute scaled so that, under that cost model, one allreduce
     of all gradients takes R times the backward (R = 0.5 compute-bound, 1 balanced, 2
     communication-bound);
  3. fusebox-tune on the scaled profile for 2 ranks: the plan it chooses with --model_error 0
     (the best predicted: "exact") and with --model_error E ("within");
  4. when the two differ, both and DDP's default measured in randomised blocks on the same
     replay (fusebox-perf overlap --compute_scale 1 --plans exact.json,within.json,ddp -n
     ROUNDS): each round visits every plan once in a fresh order, so rounds pair the plans.

Per (model, R) it prints both plans' bucket counts and predicted times, their measured medians
with 95% CIs, and within/exact: the paired ratio over rounds, median [order-statistic 95% CI]
(< 1: the plan chosen within the error is faster). A setting where both choices are the same
plan is reported as such and not measured.

Writes OUT/report.txt (what is printed, the command line first), OUT/result.json (its compact
summary for a results page, perf/results.py), the sweep, the cost model, the scaled profiles,
the plans and each run's JSON and log. Exit status: 0 when every run
succeeded. Standard library only.
"""

import argparse
import datetime
import json
import os
import re
import shlex
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "perf"))
import toolkit  # noqa: E402  perf/toolkit.py: the shared helpers
from toolkit import median, median_ci  # noqa: E402  (the same statistics as bench_gap)
import results as result_summary  # noqa: E402  perf/results.py: the results convention

TUNE_HEADER = re.compile(r"^# forward ([0-9.]+) ms, backward ([0-9.]+) ms; "
                         r"t\(all gradients\) = ([0-9.]+) ms")


def run(cmd, log, timeout):
    code, output = toolkit.run(cmd, timeout, log)
    if code != 0:
        sys.exit("bench_choice: %s failed (exit %d); see %s" % (cmd[0], code, log))
    return output


def tuned_row(text):
    """(buckets, predicted iteration ms) of the tuned plan in fusebox-tune's table."""
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == "tuned":
            return int(f[-5]), float(f[-4])
    raise ValueError("no tuned row in fusebox-tune's output")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--models", default="resnet50,vit_b16")
    ap.add_argument("--ratios", default="0.5,1,2")
    ap.add_argument("--model_error", type=float, default=0.25,
                    help="the error the 'within' plan is chosen under (default %(default)s)")
    ap.add_argument("-n", "--rounds", type=int, default=15)
    ap.add_argument("--out", default=None,
                    help="output directory (default build/bench-choice/<timestamp>)")
    ap.add_argument("--timeout", type=int, default=1800)
    a = ap.parse_args()
    if a.rounds < 2 or not 0 < a.model_error <= 10:
        ap.error("need --rounds >= 2 and 0 < --model_error <= 10")
    out = a.out or os.path.join(a.build, "bench-choice",
                                datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    tool_run = os.path.join(a.build, "tools", "fusebox-run")
    perf = os.path.join(a.build, "perf", "fusebox-perf")
    tune = os.path.join(a.build, "tools", "fusebox-tune")
    report = []

    def say(line=""):
        print(line, flush=True)
        report.append(line)

    say("# " + shlex.join([sys.executable] + sys.argv))
    say("# started %s; model error for 'within': %g; %d rounds per setting" % (
        datetime.datetime.now().isoformat(timespec="seconds"), a.model_error, a.rounds))
    sweep = os.path.join(out, "allreduce.json")
    run([tool_run, "-n", "2", "--", perf, "allreduce", "-b", "4K", "-e", "128M", "-f", "4",
         "-n", "20", "-w", "5", "--json", sweep], os.path.join(out, "allreduce.log"), a.timeout)
    model_file = os.path.join(out, "cost-model.json")
    text = run([tune, "fit", "--from", sweep, "--ranks_per_node", "2", "--out", model_file],
               os.path.join(out, "fit.log"), a.timeout)
    say("# cost model fitted to this machine's sweep: " + " ".join(
        line.strip("# ") for line in text.splitlines()[:1]))
    say()
    say("| model | t(all)/T_b | exact: buckets, pred ms | within: buckets, pred ms | "
        "exact ms [95% CI] | within ms [95% CI] | ddp ms [95% CI] | within/exact [95% CI] |")
    say("|---|---|---|---|---|---|---|---|")
    failed = 0
    for model in a.models.split(","):
        with open(os.path.join(REPO, "autotune", "profiles", model + ".json")) as f:
            profile = json.load(f)
        base = run([tune, "--profile", os.path.join(REPO, "autotune", "profiles", model + ".json"),
                    "--cost_model", model_file, "--world", "2", "--ranks_per_node", "2"],
                   os.path.join(out, model + "-base.log"), a.timeout)
        m = next(TUNE_HEADER.match(line) for line in base.splitlines() if TUNE_HEADER.match(line))
        backward_ms, t_all_ms = float(m.group(2)), float(m.group(3))
        for ratio in a.ratios.split(","):
            stem = os.path.join(out, "%s-r%s" % (model, ratio))
            scale = t_all_ms / (float(ratio) * backward_ms)
            scaled = dict(profile, forward_us=profile["forward_us"] * scale,
                          backward_us=profile["backward_us"] * scale,
                          tensors=[dict(t, ready_us=t["ready_us"] * scale)
                                   for t in profile["tensors"]])
            scaled["model"] = model  # the same name: fusebox-tune and the replay label it so
            with open(stem + "-profile.json", "w") as f:
                json.dump(scaled, f)
            rows = {}
            for name, error in (("exact", 0.0), ("within", a.model_error)):
                text = run([tune, "--profile", stem + "-profile.json", "--cost_model", model_file,
                            "--world", "2", "--ranks_per_node", "2", "--model_error", str(error),
                            "--out", "%s-%s.json" % (stem, name)],
                           "%s-%s.log" % (stem, name), a.timeout)
                rows[name] = tuned_row(text)
                path = "%s-%s.json" % (stem, name)
                with open(path) as f:
                    plan = json.load(f)
                plan["name"] = name  # the replay labels its plans by name
                with open(path, "w") as f:
                    json.dump(plan, f)
            with open(stem + "-exact.json") as f1, open(stem + "-within.json") as f2:
                same = json.load(f1)["buckets"] == json.load(f2)["buckets"]
            head = "| %s | %s | %d, %.2f | %d, %.2f |" % (model, ratio, *rows["exact"],
                                                         *rows["within"])
            if same:
                say(head + " the same plan: not measured | | | |")
                continue
            plans = "%s-exact.json,%s-within.json,ddp" % (stem, stem)
            cmd = [tool_run, "-n", "2", "--", perf, "overlap", "--profile", stem + "-profile.json",
                   "--compute_scale", "1", "--plans", plans, "-n", str(a.rounds), "-w", "2",
                   "--json", stem + ".json"]
            code, _ = toolkit.run(cmd, a.timeout, stem + ".log")
            if code != 0:
                failed += 1
                say(head + " FAILED (exit %d; see %s.log) | | | |" % (code, stem))
                continue
            with open(stem + ".json") as f:
                results = json.load(f)["results"]
            by = {r["plan"]: r for r in results}
            cells = []
            for key in ("exact", "within", "ddp"):
                r = by[key]
                lo, hi = r["iteration_ci95_us"]
                cells.append("%.2f [%.2f, %.2f]" % (r["iteration_us"] / 1e3, lo / 1e3, hi / 1e3))
            pairs = [w / e for w, e in zip(by["within"]["iterations_us"],
                                           by["exact"]["iterations_us"])]
            lo, hi, _ = median_ci(pairs)
            say(head + " %s | %s | %s | %.3f [%.3f, %.3f] |" % (*cells, median(pairs), lo, hi))
    say()
    say("# within/exact: per round, the 'within' plan's iteration over the 'exact' plan's in the "
        "same randomised block; median over rounds [order-statistic 95% CI]; < 1: choosing "
        "within the model's error measured faster")
    with open(os.path.join(out, "report.txt"), "w") as f:
        f.write("\n".join(report) + "\n")
    result_summary.write_run_summary(out, "\n".join(report) + "\n", "bench_choice",
                                     " ".join(["python3"] + sys.argv),
                                     "the plans chosen with and without the model's error")
    print("# written to %s" % out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
