#!/usr/bin/env python3
"""Exposed-communication error of the overlap runs, as the scaling report computes it
(exposed = iteration - replayed compute; error = (predicted - measured) / measured), for the runs
predicted under the model fitted from 1 MiB up (../raw) and those predicted under the model
fitted to every size of the same allreduce runs (this folder). Usage: python3 summarize.py"""
import json
import math
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))


def errors(folder):
    rows = []
    for rate in ("1gbit", "4gbit"):
        for h in (2, 4, 8):
            path = os.path.join(folder, "overlap-%s-%dhosts.json" % (rate, h))
            if not os.path.exists(path):
                continue
            for r in json.load(open(path))["results"]:
                me = r["iteration_us"] - r["compute_us"]
                pe = r["predicted_us"] - r["compute_us"]
                rows.append((rate, h, r["plan"], pe / 1e3, me / 1e3, (pe - me) / me))
    return rows


def p90(xs):
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(0.9 * len(s)) - 1))]


for name, folder in (("fitted from 1 MiB up (../raw)", os.path.join(HERE, "..", "raw")),
                     ("fitted to every size, 64 KiB-16 MiB (this folder)", HERE)):
    rows = errors(folder)
    print("## %s" % name)
    print("| link | hosts | plan | exposed pred ms | exposed meas ms | error |")
    print("|---|---|---|---|---|---|")
    for rate, h, plan, pe, me, e in rows:
        print("| %s | %d | %s | %.1f | %.1f | %+.0f%% |" % (rate, h, plan, pe, me, 100 * e))
    a = [abs(e) for *_, e in rows]
    print("%d runs: |error| median %.0f%%, p90 %.0f%%, under-predicted %d, over-predicted %d\n" % (
        len(rows), 100 * statistics.median(a), 100 * p90(a), sum(e < 0 for *_, e in rows),
        sum(e > 0 for *_, e in rows)))
