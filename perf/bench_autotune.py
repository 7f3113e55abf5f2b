#!/usr/bin/env python3
"""The autotuner benchmark of issue 4: simulated at scale, then measured on this machine.

1. Simulated: `fusebox-tune sweep` over every shipped profile x presets (nvlink-h100, ib-400g,
   25gbe) x world sizes (8, 64, 512, 4096): the tuned plan's predicted iteration time, its ratio
   to the lower bound and to the best any finer plan reaches, next to per-tensor, DDP default,
   Horovod default, HCCL default and MG-WFBP.
2. Measured: for each model and world size (2 and 4 local ranks, UCX) one run of

     fusebox-run -n N -- fusebox-perf overlap --profile MODEL --compute_scale auto
         --plans per-tensor,ddp,horovod,hccl,mg-wfbp,tuned --cache_dir OUT/cache ...

   (every plan side by side in one run; 'tuned' is the online tuner: it measures DDP's default
   and the best predicted candidates in real iterations and keeps the fastest), then a second
   run of `--plans ddp,tuned` with the same cache, which must hit it and spend zero tuning
   iterations. Reported: each plan's iteration time, DDP/tuned, best baseline/tuned, tuning
   iterations of both runs, and the simulator's prediction error per plan (its validation).

Runs that would not fit in memory are skipped and said so (as bench_overlap.py does).
Exit status: 0 when every run succeeded, 1 otherwise. Standard library only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_overlap import MEASURE_CAP, MODEL_BYTES, MODELS, REPO, mem_available, run  # noqa: E402

BASELINES = ["per-tensor", "ddp", "horovod", "hccl", "mg-wfbp"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--out", default=os.path.join(REPO, "build", "bench-autotune"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("-n", "--iters", type=int, default=7)
    ap.add_argument("-w", "--warmup", type=int, default=1)
    ap.add_argument("--skip_sweep", action="store_true")
    ap.add_argument("--timeout", type=int, default=1800, help="per run, seconds")
    args = ap.parse_args()

    run_bin = os.path.join(args.build, "tools", "fusebox-run")
    perf_bin = os.path.join(args.build, "perf", "fusebox-perf")
    tune_bin = os.path.join(args.build, "tools", "fusebox-tune")
    for b in (run_bin, perf_bin, tune_bin):
        if not os.access(b, os.X_OK):
            print(f"bench_autotune: {b} is missing; build first (bash scripts/build.sh)",
                  file=sys.stderr)
            return 2
    os.makedirs(args.out, exist_ok=True)
    cache = os.path.join(args.out, "cache")
    failed, skipped = [], []

    if not args.skip_sweep:
        cmd = [tune_bin, "sweep", "--presets", "nvlink-h100,ib-400g,25gbe",
               "--worlds", "8,64,512,4096"]
        rc, out, _ = run(cmd, os.path.join(args.out, "sweep.log"), args.timeout)
        print("## Simulated (fusebox-tune sweep)\n$ " + " ".join(cmd[1:]))
        sys.stdout.write(out)
        if rc != 0:
            failed.append(f"sweep (exit {rc})")

    def overlap(model, n, plans, tag, split):
        js = os.path.join(args.out, f"{model}-np{n}{tag}.json")
        cmd = [run_bin, "-n", str(n), "--", perf_bin, "overlap", "--profile", model,
               "--plans", plans, "--compute_scale", "auto", "-n", str(args.iters),
               "-w", str(args.warmup), "--cache_dir", cache, "--json", js, "--progress", "0",
               "--tune_split", "1" if split else "0"]
        rc, out, _ = run(cmd, os.path.join(args.out, f"{model}-np{n}{tag}.log"), args.timeout)
        sys.stdout.write(out)
        sys.stdout.flush()
        if rc != 0:
            failed.append(f"{model} np{n}{tag} (exit {rc})")
            return None
        with open(js) as f:
            return json.load(f)

    rows = []
    print("\n## Measured (fusebox-perf overlap, UCX, local ranks)")
    for model in [m for m in args.models.split(",") if m]:
        for n in [int(r) for r in args.ranks.split(",") if r]:
            need = n * (MODEL_BYTES.get(model, 0) + MEASURE_CAP)
            avail = mem_available()
            if avail and need > 0.8 * avail:
                skipped.append(f"{model} on {n} ranks: needs ~{need / 2**30:.1f} GiB, "
                               f"{avail / 2**30:.1f} GiB available")
                continue
            # A split gradient also needs its own buffer: allow splits only where
            # that fits too.
            split = not avail or n * (2 * MODEL_BYTES.get(model, 0) + MEASURE_CAP) <= 0.8 * avail
            if not split:
                skipped.append(f"{model} on {n} ranks: tuned without splitting (memory)")
            first = overlap(model, n, ",".join(BASELINES + ["tuned"]), "", split)
            if first is None:
                continue
            second = overlap(model, n, "ddp,tuned", "-cached", split)
            rows.append((model, n, first, second))

    print("\n## Tuned vs baselines, measured in the same run (medians of the slowest rank, ms)")
    hdr = (f"| {'model':<10} | {'ranks':>5} | " + " | ".join(f"{p:>10}" for p in BASELINES) +
           f" | {'tuned':>8} | {'ddp/tuned':>9} | {'ddp/bound':>9} | {'best/tuned':>10} | "
           f"{'tune its':>8} | {'2nd run':>12} |")
    print(hdr)
    print("|" + "|".join("-" * len(c) for c in hdr.split("|")[1:-1]) + "|")
    speedups, vs_best, errors, ceilings = [], [], [], []
    for model, n, first, second in rows:
        by = {r["plan"]: r for r in first["results"]}
        tuned = by["tuned"]["iteration_us"]
        best = min(by[p]["iteration_us"] for p in BASELINES if p in by)
        speedups.append(by["ddp"]["iteration_us"] / tuned)
        vs_best.append(best / tuned)
        second_txt = "failed"
        if second is not None:
            s = {r["plan"]: r for r in second["results"]}["tuned"]
            second_txt = (f"{s['tuning_iterations']} its" +
                          (", hit" if s.get("cache_hit") else ", MISS"))
        print(f"| {model:<10} | {n:>5} | " +
              " | ".join(f"{by[p]['iteration_us'] / 1e3:>10.2f}" for p in BASELINES) +
              f" | {tuned / 1e3:>8.2f} | {speedups[-1]:>9.3f} | "
              f"{by['ddp']['iteration_us'] / by['ddp']['bound_us']:>9.3f} | {vs_best[-1]:>10.3f} | "
              f"{by['tuned']['tuning_iterations']:>8} | {second_txt:>12} |")
        ceilings.append(by["ddp"]["iteration_us"] / by["ddp"]["bound_us"])
        for r in first["results"]:
            if r.get("predicted_us", 0) > 0:
                errors.append((model, n, r["plan"], r["predicted_us"], r["iteration_us"]))
    if speedups:
        print(f"# DDP default / tuned: mean {statistics.mean(speedups):.3f} (target >= 1.15); "
              f"DDP default / lower bound, the most any plan could gain: mean "
              f"{statistics.mean(ceilings):.3f}; best baseline / tuned: min {min(vs_best):.3f}, "
              f"median {statistics.median(vs_best):.3f} (target: not below noise)")

    print("\n## Simulator validation: predicted vs measured iteration time (same runs)")
    hdr = f"| {'model':<10} | {'ranks':>5} | {'plan':<10} | {'pred ms':>9} | {'meas ms':>9} | {'error':>7} |"
    print(hdr)
    print("|" + "|".join("-" * len(c) for c in hdr.split("|")[1:-1]) + "|")
    rel = []
    for model, n, plan, pred, meas in errors:
        e = (pred - meas) / meas
        rel.append(abs(e))
        print(f"| {model:<10} | {n:>5} | {plan:<10} | {pred / 1e3:>9.2f} | {meas / 1e3:>9.2f} | "
              f"{100 * e:>+6.1f}% |")
    if rel:
        print(f"# |pred - meas| / meas: median {100 * statistics.median(rel):.1f}%, "
              f"max {100 * max(rel):.1f}% over {len(rel)} plan runs")
    for s in skipped:
        print(f"# skipped: {s}")
    for f in failed:
        print(f"# FAILED: {f}")
    with open(os.path.join(args.out, "autotune.json"), "w") as f:
        json.dump({"runs": [{"model": m, "ranks": n, "first": a, "second": b}
                            for m, n, a, b in rows], "skipped": skipped, "failed": failed}, f,
                  indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
