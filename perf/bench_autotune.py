#!/usr/bin/env python3
"""The autotuner benchmark: simulated at scale, then measured on this machine.

Part 1, simulated (skipped with --skip_sweep):

  fusebox-tune sweep --presets PRESETS --worlds WORLDS

  every shipped profile x network preset x world size: the tuned plan's predicted iteration
  time next to per-tensor, DDP default, Horovod default, HCCL default and MG-WFBP.

Part 2, measured (fusebox-perf overlap on local ranks, UCX backend). For each model in
--models and rank count in --ranks:

  a. one calibration run, `--compute_scale auto --plans ddp -n 1 -w 0`, which only reads the
     scale s1 at which backward takes as long as one allreduce of all gradients
     (r = t(all) / T_backward = 1);
  b. for each compute ratio r in --ratios, at the explicit scale s1 / r (a larger r means
     less compute, so communication is harder to hide), in a fresh policy cache:

       fusebox-run -n N -- fusebox-perf overlap --profile MODEL --compute_scale s1/r
           --plans per-tensor,ddp,ddp-cap1mb,ddp-cap5mb,ddp-cap100mb,horovod,mg-wfbp,tuned
           -n ROUNDS -w WARMUP --cache_dir OUT/cache/CELL --json ...

     Every plan is measured in ROUNDS randomised blocks (each visit: WARMUP iterations after
     the switch, then one measured); 'tuned' is the online tuner, which tunes first on its
     own engine, after which the plan it kept is measured interleaved with the others;
  c. the same scale and cache again with `--plans ddp,tuned`: the tuner must hit the cache
     and spend 0 tuning iterations (it is judged on the workload it was tuned on).

Report, per (model, ranks, ratio): each plan's median iteration time and its 95% CI; tuned
vs DDP's default (ratio of medians, and whether the CIs separate); tuned vs the best
non-tuned plan of the same run (ratio, CI overlap); tuned vs the lower bound; tuning
iterations and cost; the plan the tuner kept and its decision; the cache-hit run. Then a
summary over all cells and the simulator's validation: predicted vs measured iteration time
and exposed communication (iteration - compute) per plan.

Everything goes to --out (default build/bench-autotune/<timestamp>/): each run's log and
JSON, report.txt (the command line at the top), summary.json, and result.json: the run's
compact summary for a results page (perf/results.py). --docs DIR copies result.json to
DIR/resnet50-np2.json-style names (models and ranks), e.g. docs/results/data/autotune/.

Runs whose buffers would not fit in memory are skipped and said so (as in bench_overlap.py).
Exit status: 0 when every run succeeded and every cache check passed, 1 otherwise, 2 on
usage errors or missing binaries. Standard library only.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results as result_summary  # noqa: E402  perf/results.py
from autotune_report import (  # noqa: E402  perf/autotune_report.py: analysis, report
    PLANS, analyse, ms, report_cell, report_summary, report_validation)
from bench_overlap import MEASURE_CAP, MODEL_BYTES, MODELS, REPO, mem_available, run  # noqa: E402

DEFAULT_MODELS = ["resnet50", "vit_b16"]
MIN_ROUNDS = 5


# ---------------------------------------------------------------------------------------------
# Small helpers


def csv_list(text):
    return [x.strip() for x in text.split(",") if x.strip()]


def positive_floats(text):
    try:
        values = [float(x) for x in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def positive_ints(text):
    try:
        values = [int(x) for x in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def rounds_arg(text):
    n = int(text)
    if n < MIN_ROUNDS:
        raise argparse.ArgumentTypeError(f"at least {MIN_ROUNDS} rounds (a 95% CI of the median "
                                         f"needs them), got {n}")
    return n


def label(model):
    """A model name (or a profile path) usable in file names."""
    base = os.path.splitext(os.path.basename(model))[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", base)


def git_state():
    """The checkout's commit and whether it has local changes (read-only git commands)."""
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}{' (with local changes)' if dirty else ''}"


class Report:
    """Lines printed to stdout and kept for report.txt."""

    def __init__(self):
        self.lines = []

    def __call__(self, text=""):
        print(text, flush=True)
        self.lines.extend(str(text).split("\n"))

    def write(self, path):
        with open(path, "w") as f:
            f.write("\n".join(self.lines) + "\n")


def note(text):
    """Progress, on stderr (not part of the report)."""
    print(f"bench_autotune: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Runs


class Runner:
    def __init__(self, args, bins):
        self.args = args
        self.bins = bins
        self.failed = []   # "what (why)"
        self.skipped = []

    def command(self, cmd, name):
        """Runs cmd, its output to OUT/name.log. Returns (rc, stdout), rc None on timeout."""
        log = os.path.join(self.args.out, name + ".log")
        note(f"{name}: running (log {log})")
        try:
            rc, out, secs = run(cmd, log, self.args.timeout)
        except subprocess.TimeoutExpired:
            with open(log, "a") as f:
                f.write(f"\n# bench_autotune: timed out after {self.args.timeout} s\n")
            self.failed.append(f"{name} (timed out after {self.args.timeout} s)")
            return None, ""
        note(f"{name}: exit {rc} after {secs:.0f} s")
        if rc != 0:
            self.failed.append(f"{name} (exit {rc}; see {name}.log)")
        return rc, out

    def overlap(self, model, ranks, name, scale, plans, rounds, warmup, cache=None, split=True):
        """One fusebox-perf overlap run; returns its JSON report, or None when it failed."""
        js = os.path.join(self.args.out, name + ".json")
        cmd = [self.bins["run"], "-n", str(ranks), "--", self.bins["perf"], "overlap",
               "--profile", model, "--plans", ",".join(plans), "--compute_scale", str(scale),
               "-n", str(rounds), "-w", str(warmup), "--json", js, "--progress", "0"]
        if cache is not None:
            cmd += ["--cache_dir", cache, "--tune_split", "1" if split else "0"]
            for flag in ("tune_candidates", "tune_blocks", "tune_pairs"):
                if getattr(self.args, flag) is not None:
                    cmd += [f"--{flag}", str(getattr(self.args, flag))]
        if os.path.exists(js):
            os.remove(js)
        rc, _ = self.command(cmd, name)
        if rc != 0:
            return None
        try:
            with open(js) as f:
                rep = json.load(f)
        except (OSError, ValueError) as e:
            self.failed.append(f"{name} (exit 0 but no readable JSON: {e})")
            return None
        rep["results_by_plan"] = {r["plan"]: r for r in rep["results"]}
        missing = [p for p in plans if p not in rep["results_by_plan"]]
        if missing:
            self.failed.append(f"{name} (no result for {', '.join(missing)})")
            return None
        return rep


def measure_cell(runner, model, ranks, ratio, s1, split):
    """Part 2 b and c for one (model, ranks, ratio). Returns the cell's dict, or None."""
    args = runner.args
    tag = f"{label(model)}-np{ranks}-r{ratio:g}"
    scale = s1 / ratio
    cache = os.path.join(args.out, "cache", tag)
    os.makedirs(cache, exist_ok=True)
    first = runner.overlap(model, ranks, tag, f"{scale:.6g}", PLANS, args.rounds, args.warmup,
                           cache, split)
    if first is None:
        return None
    second = runner.overlap(model, ranks, tag + "-cached", f"{scale:.6g}", ["ddp", "tuned"],
                            args.rounds, args.warmup, cache, split)
    return {"model": model, "ranks": ranks, "ratio": ratio, "scale": float(f"{scale:.6g}"),
            "first": first, "second": second}


# ---------------------------------------------------------------------------------------------


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"),
                    help="build directory holding tools/fusebox-run, perf/fusebox-perf and "
                         "tools/fusebox-tune (default: %(default)s)")
    ap.add_argument("--out", default=None,
                    help="directory for every log, JSON and report.txt (default: "
                         "build/bench-autotune/<timestamp>/)")
    ap.add_argument("--docs", default=None, metavar="DIR",
                    help="also copy the run's compact summary (result.json) to DIR, e.g. "
                         "docs/results/data/autotune; raw logs are not committed")
    ap.add_argument("--models", type=csv_list, default=DEFAULT_MODELS,
                    help=f"comma-separated profiles: shipped models ({', '.join(MODELS)}) or "
                         f"profile files (default: {','.join(DEFAULT_MODELS)})")
    ap.add_argument("--ranks", type=positive_ints, default=[2],
                    help="comma-separated local rank counts (default: 2)")
    ap.add_argument("--ratios", type=positive_floats, default=[0.5, 1.0, 2.0],
                    help="comma-separated compute ratios r = t(all)/T_backward; compute scale = "
                         "s1 / r, s1 from the calibration run (default: 0.5,1,2)")
    ap.add_argument("-n", "--rounds", type=rounds_arg, default=7,
                    help=f"fusebox-perf -n: randomised rounds, each measuring every plan once "
                         f"(default: %(default)s, at least {MIN_ROUNDS})")
    ap.add_argument("-w", "--warmup", type=int, default=1,
                    help="fusebox-perf -w: warm-up iterations per visit of a plan "
                         "(default: %(default)s)")
    ap.add_argument("--tune_candidates", type=int, default=None,
                    help="passed to fusebox-perf when given (default: fusebox-perf's own)")
    ap.add_argument("--tune_blocks", type=int, default=None,
                    help="passed to fusebox-perf when given (default: fusebox-perf's own)")
    ap.add_argument("--tune_pairs", type=int, default=None,
                    help="passed to fusebox-perf when given (default: fusebox-perf's own)")
    ap.add_argument("--skip_sweep", action="store_true",
                    help="skip part 1 (the simulated fusebox-tune sweep)")
    ap.add_argument("--sweep_presets", default="nvlink-h100,ib-400g,25gbe",
                    help="part 1: fusebox-tune sweep --presets (default: %(default)s)")
    ap.add_argument("--sweep_worlds", default="8,64,512,4096",
                    help="part 1: fusebox-tune sweep --worlds (default: %(default)s)")
    ap.add_argument("--timeout", type=int, default=1800,
                    help="seconds one run may take (default: %(default)s)")
    args = ap.parse_args()
    if args.warmup < 0:
        ap.error("-w must be >= 0")
    if not args.models:
        ap.error("--models: no model given")
    if args.out is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        args.out = os.path.join(REPO, "build", "bench-autotune", stamp)
    args.out = os.path.abspath(args.out)
    return args


def main():
    args = parse_args()
    bins = {"run": os.path.join(args.build, "tools", "fusebox-run"),
            "perf": os.path.join(args.build, "perf", "fusebox-perf"),
            "tune": os.path.join(args.build, "tools", "fusebox-tune")}
    needed = ["run", "perf"] + ([] if args.skip_sweep else ["tune"])
    missing = [bins[b] for b in needed if not os.access(bins[b], os.X_OK)]
    if missing:
        for b in missing:
            print(f"bench_autotune: {b} is missing or not executable", file=sys.stderr)
        print("bench_autotune: build first (bash scripts/build.sh), or point --build at a build "
              "directory", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    runner = Runner(args, bins)
    rpt = Report()

    rpt("$ " + shlex.join(["python3"] + sys.argv))
    rpt(f"# in {os.getcwd()}; repository {REPO} at {git_state()}")
    rpt(f"# {datetime.datetime.now().isoformat(timespec='seconds')}, host {platform.node()}, "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"MemAvailable {mem_available() / 2**30:.1f} GiB")
    rpt(f"# results in {args.out}")

    if not args.skip_sweep:
        cmd = [bins["tune"], "sweep", "--presets", args.sweep_presets, "--worlds",
               args.sweep_worlds]
        _, out = runner.command(cmd, "sweep")
        rpt("\n## Part 1: simulated (fusebox-tune sweep)\n$ fusebox-tune " +
            shlex.join(cmd[1:]))
        rpt(out.rstrip("\n"))
        rpt("# (part 1 is autotune::Simulate's prediction under the presets, not a measurement)")

    rpt("\n## Part 2: measured (fusebox-perf overlap, UCX, local ranks)")
    rpt(f"# plans {','.join(PLANS)}; {args.rounds} randomised rounds, {args.warmup} warm-up "
        f"iteration(s) per visit; times are medians of the slowest rank with 95% CIs of the "
        f"median; r = t(all)/T_backward (larger r: less compute to hide communication behind)")
    cells = []
    for model in args.models:
        for ranks in args.ranks:
            mbytes = MODEL_BYTES.get(model, 0)
            need = ranks * (mbytes + MEASURE_CAP)
            avail = mem_available()
            if avail and need > 0.8 * avail:
                runner.skipped.append(f"{model} on {ranks} ranks: needs ~{need / 2**30:.1f} GiB, "
                                      f"{avail / 2**30:.1f} GiB available")
                continue
            # A split gradient needs a buffer of its own: the tuner may split only where
            # that fits too.
            split = not avail or ranks * (2 * mbytes + MEASURE_CAP) <= 0.8 * avail
            if not split:
                runner.skipped.append(f"{model} on {ranks} ranks: tuned without splitting "
                                      f"(memory)")
            cal = runner.overlap(model, ranks, f"{label(model)}-np{ranks}-calibrate", "auto",
                                 ["ddp"], 1, 0)
            if cal is None:
                continue
            s1 = cal["compute_scale"]
            rpt(f"# {model}, {ranks} ranks: calibration (--compute_scale auto) s1 = {s1:.4g} "
                f"(t(all) {ms(cal['comm']['t_total_us'])} ms); scales: " +
                ", ".join(f"r={r:g}: {s1 / r:.4g}" for r in args.ratios))
            for ratio in args.ratios:
                cell = measure_cell(runner, model, ranks, ratio, s1, split)
                if cell is not None:
                    cells.append((cell, analyse(cell)))
                    report_cell(rpt, *cells[-1])

    if cells:
        report_summary(rpt, cells)
        report_validation(rpt, cells)
    else:
        rpt("\n# no cell was measured")
    for s in runner.skipped:
        rpt(f"# skipped: {s}")
    for f in runner.failed:
        rpt(f"# FAILED: {f}")
    for cell, a in cells:
        if cell["second"] is not None and not a["cache_ok"]:
            rpt(f"# CHECK FAILED: {cell['model']} np{cell['ranks']} r={cell['ratio']:g}: the "
                f"second run was not a cache hit with 0 tuning iterations")

    summary = {"command": ["python3"] + sys.argv, "out": args.out, "skipped": runner.skipped,
               "failed": runner.failed, "cells": []}
    for cell, a in cells:
        entry = {k: cell[k] for k in ("model", "ranks", "ratio", "scale")}
        entry.update({k: v for k, v in a.items() if k != "second"})
        if "second" in a:
            entry["second"] = {k: v for k, v in a["second"].items() if k not in ("tuned", "ddp")}
        summary["cells"].append(entry)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    rpt.write(os.path.join(args.out, "report.txt"))

    summary_path = result_summary.write_run_summary(
        args.out, "\n".join(rpt.lines) + "\n", "bench_autotune",
        shlex.join(["python3"] + sys.argv), "the online tuner on replayed profiles")
    if args.docs:
        os.makedirs(args.docs, exist_ok=True)
        name = "%s-np%s.json" % ("-".join(os.path.splitext(os.path.basename(m))[0]
                                          for m in args.models), "-".join(str(r) for r in args.ranks))
        shutil.copy2(summary_path, os.path.join(args.docs, name))
        note(f"copied the run's summary to {os.path.join(os.path.abspath(args.docs), name)}")

    ok = not runner.failed and all(a["cache_ok"] for _, a in cells)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
