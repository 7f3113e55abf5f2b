#!/usr/bin/env python3
"""The prediction of exposed communication with the overlap calibrated three ways, in one sweep.

Each held-out run (every plan but ddp, which calibrates the overlap, and tuned) has three
predictions made from the same measurement, all under the sizes timed beside the plans:

  pred          the overlap fitted on the calibration replays before the rounds, against the
                sizes timed then (what fusebox-perf overlap's pred column uses);
  refit_all     fitted again, after the rounds, on those replays and DDP's default plan's
                measured iterations in the rounds, against the sizes timed beside the plans;
  refit_rounds  the same on DDP's default plan's measured iterations alone.

usage: refit.py DIR[,DIR...]
"""
import glob
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "20261128-out-of-cache"))
from compare import pct  # noqa: E402

KINDS = [("pred", "predicted_exposed_us"), ("refit_all", "predicted_refit_all_exposed_us"),
         ("refit_rounds", "predicted_refit_rounds_exposed_us")]


def cells(errs):
    if not errs:
        return "0 | - | - | -"
    a = [abs(e) for e in errs]
    return "%d | %.0f%% | %.0f%% | %.0f%%" % (len(errs), 100 * statistics.median(a),
                                              100 * pct(a, 0.9),
                                              100.0 * sum(1 for e in errs if e < 0) / len(errs))


def main():
    dirs = []
    for a in sys.argv[1:]:
        dirs += a.split(",")
    errs = {k: {} for k, _ in KINDS}  # kind -> ratio -> [error]
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.json"))):
            ratio = os.path.basename(path)[:-5].rsplit("-r", 1)[1]
            for r in json.load(open(path))["results"]:
                if r["plan"] in ("ddp", "tuned") or r["exposed_us"] <= 0:
                    continue
                if any(r.get(f, 0) <= 0 for _, f in KINDS):
                    continue
                m = r["exposed_us"]
                for k, f in KINDS:
                    errs[k].setdefault(ratio, []).append((r[f] - m) / m)
    print("Paired, run by run (the same measurement): how often each refit is closer than pred.")
    print()
    for k, _ in KINDS[1:]:
        closer = farther = 0
        for ratio, v in errs[k].items():
            for e, e0 in zip(v, errs["pred"][ratio]):
                closer += abs(e) < abs(e0)
                farther += abs(e) > abs(e0)
        n = closer + farther
        # Two-sided sign test: the chance of a split at least this uneven if neither is closer.
        tail = sum(math.comb(n, i) for i in range(0, min(closer, farther) + 1)) / 2.0 ** n
        print("- %s: closer in %d of %d runs, farther in %d (sign test p = %.2f)" % (
            k, closer, n, farther, min(1.0, 2 * tail)))
    print()
    print("| prediction | ratio | n | median abs error | p90 abs error | under |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for k, _ in KINDS:
        pooled = [e for v in errs[k].values() for e in v]
        print("| %s | all | %s |" % (k, cells(pooled)))
        for ratio in sorted(errs[k], key=float):
            print("| %s | %s | %s |" % (k, ratio, cells(errs[k][ratio])))


if __name__ == "__main__":
    main()
