#!/usr/bin/env python3
"""Pools bench_gap sweeps per arm: held-out exposed error, best/bound, tuned/best, least iter/bound.

usage: compare.py ARM=DIR[,DIR...] ...   (each DIR a bench_gap output directory of one sweep)
"""
import glob
import json
import os
import statistics
import sys


def pct(v, q):
    v = sorted(v)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def plan_errors(dirs):
    """plan -> signed exposed-communication errors over every run of the arm."""
    per = {}
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.json"))):
            for r in json.load(open(path))["results"]:
                if r["predicted_us"] > 0 and r["exposed_us"] > 0:
                    per.setdefault(r["plan"], []).append(
                        (r["predicted_exposed_us"] - r["exposed_us"]) / r["exposed_us"])
    return per


def arm_stats(dirs):
    errs, cells = [], []
    least = (float("inf"), "")
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.json"))):
            j = json.load(open(path))
            cell = os.path.basename(path)[:-5]
            res = {r["plan"]: r for r in j["results"]}
            for r in j["results"]:
                ratio = r["iteration_us"] / r["bound_us"]
                if ratio < least[0]:
                    least = (ratio, "%s %s" % (cell, r["plan"]))
                if r["plan"] in ("ddp", "tuned"):
                    continue
                if r["predicted_us"] > 0 and r["exposed_us"] > 0:
                    errs.append((r["predicted_exposed_us"] - r["exposed_us"]) / r["exposed_us"])
            others = [r for r in j["results"] if r["plan"] != "tuned"]
            best = min(others, key=lambda r: r["iteration_us"])
            bb = best["iteration_us"] / best["bound_us"]
            tb = None
            if "tuned" in res:
                t = res["tuned"]["iterations_us"]
                b = best["iterations_us"]
                n = min(len(t), len(b))
                tb = statistics.median(t[i] / b[i] for i in range(n))
            cells.append((cell, bb, tb, best["plan"]))
    return errs, cells, least


def main():
    arms = []
    for a in sys.argv[1:]:
        name, dirs = a.split("=", 1)
        arms.append((name, dirs.split(",")))
    print("| arm | held-out runs | median abs error | p90 abs error | under-predicted | "
          "cells best/bound <= 1.10 | cells tuned/best <= 1.05 | least iter/bound |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    per_cell = {}
    for name, dirs in arms:
        errs, cells, least = arm_stats(dirs)
        a = [abs(e) for e in errs]
        under = sum(1 for e in errs if e < 0)
        bb_ok = sum(1 for c in cells if c[1] <= 1.10)
        tb_ok = sum(1 for c in cells if c[2] is not None and c[2] <= 1.05)
        print("| %s | %d | %.0f%% | %.0f%% | %d (%.0f%%) | %d of %d | %d of %d | %.3f (%s) |" % (
            name, len(errs), 100 * statistics.median(a), 100 * pct(a, 0.9), under,
            100.0 * under / len(errs), bb_ok, len(cells), tb_ok,
            sum(1 for c in cells if c[2] is not None), least[0], least[1]))
        for c in cells:
            per_cell.setdefault(c[0], {}).setdefault(name, []).append(c)
    print()
    names = [n for n, _ in arms]
    print("| cell | " + " | ".join("%s best/bound (best plan)" % n for n in names) + " | " +
          " | ".join("%s tuned/best" % n for n in names) + " |")
    print("| --- " * (1 + 2 * len(names)) + "|")
    for cell in sorted(per_cell):
        row = [cell]
        for n in names:
            cs = per_cell[cell].get(n, [])
            row.append(", ".join("%.3f (%s)" % (c[1], c[3]) for c in cs))
        for n in names:
            cs = per_cell[cell].get(n, [])
            row.append(", ".join("%.3f" % c[2] if c[2] is not None else "-" for c in cs))
        print("| " + " | ".join(row) + " |")
    print()
    print("Median signed exposed error per plan (ddp calibrates the overlap; tuned is not held out):")
    print()
    per = {n: plan_errors(dirs) for n, dirs in arms}
    plans = sorted(set(p for n in names for p in per[n]))
    print("| plan | " + " | ".join(names) + " |")
    print("| --- " + "| ---: " * len(names) + "|")
    for p in plans:
        print("| %s | %s |" % (p, " | ".join(
            "%+.0f%%" % (100 * statistics.median(per[n][p])) if per[n].get(p) else "-"
            for n in names)))


if __name__ == "__main__":
    main()
