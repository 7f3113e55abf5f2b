#!/usr/bin/env python3
"""Two bench_gap sweeps of the same build, cell by cell and plan by plan (A = the first, B = the
second): iteration time B/A, iteration over the run's bound B/A, exposed communication, the gap report's late-gradients term, and each
sweep's held-out prediction error (the plans bench_gap holds out: all but ddp and tuned).

  python3 docs/gap/20261129-issuer/compare.py A_DIR B_DIR
"""
import glob
import json
import os
import statistics
import sys

HELD_OUT = {"ddp-cap1mb", "ddp-cap5mb", "ddp-cap100mb", "horovod", "mg-wfbp"}


def load(d):
    out = {}
    for p in sorted(glob.glob(os.path.join(d, "*-r*.json"))):
        cell = os.path.basename(p)[:-len(".json")]
        for r in json.load(open(p))["results"]:
            out[(cell, r["plan"])] = r
    return out


def errors(runs):
    e = [(r["predicted_exposed_us"] - r["exposed_us"]) / r["exposed_us"] for r in runs
         if r["exposed_us"] > 0]
    a = sorted(abs(x) for x in e)
    return (statistics.median(a), a[min(len(a) - 1, int(0.9 * len(a)))],
            sum(x < 0 for x in e), len(e))


def main(a_dir, b_dir):
    a, b = load(a_dir), load(b_dir)
    keys = sorted(set(a) & set(b))
    ratios = [b[k]["iteration_us"] / a[k]["iteration_us"] for k in keys]
    print("iteration B/A over %d plan-cells: median %.3f, range %.3f-%.3f, B faster in %d" % (
        len(ratios), statistics.median(ratios), min(ratios), max(ratios),
        sum(x < 1 for x in ratios)))
    for ratio in ("0.5", "1", "2"):
        rs = [b[k]["iteration_us"] / a[k]["iteration_us"] for k in keys
              if k[0].endswith("-r" + ratio)]
        print("  t(all)/T_b = %s: median %.3f, B faster in %d of %d" % (
            ratio, statistics.median(rs), sum(x < 1 for x in rs), len(rs)))
    # Each run scales compute to its own t(all) (--compute_scale auto), so iteration times of two
    # sweeps differ with that scale; iteration over the run's own bound does not.
    rel = [(b[k]["iteration_us"] / b[k]["bound_us"]) / (a[k]["iteration_us"] / a[k]["bound_us"])
           for k in keys]
    print("iteration/bound B over A: median %.3f, range %.3f-%.3f, B lower in %d of %d" % (
        statistics.median(rel), min(rel), max(rel), sum(x < 1 for x in rel), len(rel)))
    late = [(a[k]["gap"]["late_gradients_us"], b[k]["gap"]["late_gradients_us"]) for k in keys]
    print("late gradients (ms), median over plan-cells: A %.2f, B %.2f; B larger in %d of %d" % (
        statistics.median(x for x, _ in late) / 1e3, statistics.median(y for _, y in late) / 1e3,
        sum(y > x for x, y in late), len(late)))
    for name, d in (("A", a), ("B", b)):
        runs = [d[k] for k in keys if k[1] in HELD_OUT]
        m, p90, under, n = errors(runs)
        print("%s held-out exposed error: median %.0f%%, p90 %.0f%%, under-predicted %d of %d" % (
            name, 100 * m, 100 * p90, under, n))
    print()
    print("| cell | plan | iter A ms | iter B ms | B/A | exposed A | exposed B | pred A | pred B |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k in keys:
        print("| %s | %s | %.2f | %.2f | %.3f | %.2f | %.2f | %.2f | %.2f |" % (
            k[0], k[1], a[k]["iteration_us"] / 1e3, b[k]["iteration_us"] / 1e3,
            b[k]["iteration_us"] / a[k]["iteration_us"], a[k]["exposed_us"] / 1e3,
            b[k]["exposed_us"] / 1e3, a[k]["predicted_exposed_us"] / 1e3,
            b[k]["predicted_exposed_us"] / 1e3))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
