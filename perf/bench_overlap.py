#!/usr/bin/env python3
"""The overlap benchmark: every shipped profile, 2 and 4 local ranks, UCX backend.

For each model in --models and each world size in --ranks it runs

  <build>/tools/fusebox-run -n N -- <build>/perf/fusebox-perf overlap --profile MODEL
      --plans per-tensor,ddp,horovod,hccl --compute_scale auto -n ITERS -w WARMUP --json ...

('auto' makes the replayed backward as long as one allreduce of all gradient bytes on that
world size, so that communication and backward take comparable time), and then, to show the
engine's own overhead, the same model on ONE rank (communication is free) at the compute scale
the smallest multi-rank run chose: there the iteration time must be within 2% of the replayed
compute time (forward + backward).

A run is skipped (and said so) when its fusion buffers would not fit: N ranks x gradient bytes
(+ the largest allreduce measured for the cost model) must stay under 80% of MemAvailable.

Prints one table (model, ranks, scale, plan, buckets, iteration, exposed communication, lower
bound, ratio) and the overhead table; writes <out>/overlap.json and each run's log.
Exit status: 0 when every run succeeded, 1 otherwise. Standard library only.
"""

import argparse
import json
import os
import sys
import time

import toolkit  # perf/toolkit.py: the shared helpers (run)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["resnet50", "bert_large", "gpt2_small", "gpt2_xl", "vit_b16"]
# fp32 gradient bytes of the shipped profiles (docs/design.md), for the memory check.
MODEL_BYTES = {"resnet50": 25557032 * 4, "bert_large": 336226108 * 4,
               "gpt2_small": 124439808 * 4, "gpt2_xl": 1557611200 * 4,
               "vit_b16": 86567656 * 4}
MEASURE_CAP = 512 << 20


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def run(cmd, log_path, timeout):
    """(exit code, merged output, seconds) of cmd, logged to log_path (toolkit.run)."""
    start = time.time()
    code, output = toolkit.run(cmd, timeout, log_path)
    return code, output, time.time() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--out", default=os.path.join(REPO, "build", "bench-overlap"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--plans", default="per-tensor,ddp,horovod,hccl")
    ap.add_argument("-n", "--iters", type=int, default=5)
    ap.add_argument("-w", "--warmup", type=int, default=1)
    ap.add_argument("--views", type=int, default=1, choices=[0, 1])
    ap.add_argument("--timeout", type=int, default=1800, help="per run, seconds")
    args = ap.parse_args()

    run_bin = os.path.join(args.build, "tools", "fusebox-run")
    perf_bin = os.path.join(args.build, "perf", "fusebox-perf")
    for b in (run_bin, perf_bin):
        if not os.access(b, os.X_OK):
            print(f"bench_overlap: {b} is missing; build first (bash scripts/build.sh)",
                  file=sys.stderr)
            return 2
    os.makedirs(args.out, exist_ok=True)
    models = [m for m in args.models.split(",") if m]
    ranks = [int(r) for r in args.ranks.split(",") if r]
    rows, overhead, skipped, failed = [], [], [], []

    def overlap(model, n, scale, tag):
        js = os.path.join(args.out, f"{model}-np{n}{tag}.json")
        cmd = [run_bin, "-n", str(n), "--", perf_bin, "overlap", "--profile", model,
               "--plans", args.plans, "--compute_scale", str(scale), "-n", str(args.iters),
               "-w", str(args.warmup), "--views", str(args.views), "--json", js, "--progress", "0"]
        rc, out, secs = run(cmd, os.path.join(args.out, f"{model}-np{n}{tag}.log"), args.timeout)
        sys.stdout.write(out)
        sys.stdout.flush()
        if rc != 0:
            failed.append(f"{model} np{n}{tag} (exit {rc})")
            return None
        with open(js) as f:
            return json.load(f)

    for model in models:
        copies = 1 if args.views else 2
        scale_for_overhead = None
        for n in ranks:
            need = n * (MODEL_BYTES.get(model, 0) * copies + MEASURE_CAP)
            avail = mem_available()
            if avail and need > 0.8 * avail:
                skipped.append(f"{model} on {n} ranks: needs ~{need / 2**30:.1f} GiB of buffers, "
                               f"{avail / 2**30:.1f} GiB available")
                continue
            rep = overlap(model, n, "auto", "")
            if rep is None:
                continue
            if scale_for_overhead is None:
                scale_for_overhead = rep["compute_scale"]
            for r in rep["results"]:
                rows.append((model, n, rep["compute_scale"], r))
        if scale_for_overhead is not None:
            rep = overlap(model, 1, scale_for_overhead, "-overhead")
            if rep is not None:
                for r in rep["results"]:
                    overhead.append((model, rep["compute_scale"], r))

    print("\n## Overlap benchmark (UCX backend, local ranks; medians of the slowest rank)")
    print(f"# iters {args.iters}, warmup {args.warmup}, "
          f"{'gradients in place (views)' if args.views else 'gradients copied'}; "
          "compute scale: backward as long as t(all gradients)")
    hdr = (f"| {'model':<10} | {'ranks':>5} | {'scale':>7} | {'plan':<10} | {'buckets':>7} | "
           f"{'iter ms':>9} | {'exposed ms':>10} | {'bound ms':>9} | {'iter/bound':>10} |")
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    for model, n, scale, r in rows:
        print(f"| {model:<10} | {n:>5} | {scale:>7.3g} | {r['plan']:<10} | {r['buckets']:>7} | "
              f"{r['iteration_us'] / 1e3:>9.2f} | {r['exposed_us'] / 1e3:>10.2f} | "
              f"{r['bound_us'] / 1e3:>9.2f} | {r['iteration_us'] / r['bound_us']:>10.3f} |")
    print("\n## Engine overhead: 1 rank (communication free), iteration vs replayed compute")
    hdr = (f"| {'model':<10} | {'scale':>7} | {'plan':<10} | {'compute ms':>10} | "
           f"{'iter ms':>9} | {'iter/compute':>12} | {'target <= 1.02':>14} |")
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    worst = 0.0
    for model, scale, r in overhead:
        ratio = r["iteration_us"] / r["compute_us"]
        worst = max(worst, ratio)
        print(f"| {model:<10} | {scale:>7.3g} | {r['plan']:<10} | {r['compute_us'] / 1e3:>10.2f} | "
              f"{r['iteration_us'] / 1e3:>9.2f} | {ratio:>12.4f} | "
              f"{'PASS' if ratio <= 1.02 else 'FAIL':>14} |")
    for s in skipped:
        print(f"# skipped: {s}")
    for f in failed:
        print(f"# FAILED: {f}")
    with open(os.path.join(args.out, "overlap.json"), "w") as f:
        json.dump({"rows": [{"model": m, "ranks": n, "compute_scale": s, **r}
                            for m, n, s, r in rows],
                   "overhead": [{"model": m, "compute_scale": s, **r} for m, s, r in overhead],
                   "skipped": skipped, "failed": failed}, f, indent=1)
    print(f"# worst 1-rank iteration/compute: {worst:.4f}; results in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
