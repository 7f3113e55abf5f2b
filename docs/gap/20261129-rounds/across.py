#!/usr/bin/env python3
"""The model's error against the measurement's repeatability across sweeps of one build.

For every held-out run (each cell and plan of a sweep, but ddp, which calibrates the overlap, and
tuned), prints the model's error on exposed communication beside the error of a "prediction"
that is the median of the same cell and plan's exposed time in the other sweeps: what this
machine gives when the same measurement is simply repeated.

usage: across.py DIR[,DIR...]   (bench_gap sweeps of one build)
"""
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "20261128-out-of-cache"))
from compare import pct  # noqa: E402




def line(name, errs):
    a = [abs(e) for e in errs]
    under = sum(1 for e in errs if e < 0)
    return "| %s | %d | %.0f%% | %.0f%% | %.0f%% |" % (
        name, len(errs), 100 * statistics.median(a), 100 * pct(a, 0.9), 100.0 * under / len(errs))


def main():
    dirs = []
    for a in sys.argv[1:]:
        dirs += a.split(",")
    runs = []  # (dir, cell, plan, measured exposed, predicted exposed)
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.json"))):
            cell = os.path.basename(path)[:-5]
            for r in json.load(open(path))["results"]:
                if r["plan"] in ("ddp", "tuned") or r["exposed_us"] <= 0 or r["predicted_us"] <= 0:
                    continue
                runs.append((d, cell, r["plan"], r["exposed_us"], r["predicted_exposed_us"]))
    by_key = {}
    for d, cell, plan, x, _ in runs:
        by_key.setdefault((cell, plan), []).append((d, x))
    for lo, hi, name in ((0, float("inf"), "all runs"), (1000, float("inf"), "exposed >= 1 ms"),
                         (0, 1000, "exposed < 1 ms")):
        model, other = [], []
        for d, cell, plan, x, p in runs:
            if not lo <= x < hi:
                continue
            rest = [y for e, y in by_key[(cell, plan)] if e != d]
            if not rest:
                continue
            model.append((p - x) / x)
            other.append((statistics.median(rest) - x) / x)
        if not model:
            continue
        print("%s (%d sweeps):" % (name, len(dirs)))
        print()
        print("| prediction | n | median abs error | p90 abs error | under |")
        print("| --- | ---: | ---: | ---: | ---: |")
        print(line("the model", model))
        print(line("the median of the other sweeps' measurements", other))
        print()


if __name__ == "__main__":
    main()
