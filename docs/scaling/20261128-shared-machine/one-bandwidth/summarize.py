#!/usr/bin/env python3
"""Exposed-communication error of the 4 Gbit overlap runs, as the scaling report computes it
(exposed = iteration - replayed compute; error = (predicted - measured) / measured), for the
runs predicted under the model with the shared-machine term (../raw) and those predicted under
one bandwidth (this folder). Usage: python3 summarize.py (from this folder)."""
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))


def errors(folder):
    rows = []
    for h in (2, 4, 8):
        d = json.load(open(os.path.join(folder, "overlap-4gbit-%dhosts.json" % h)))
        for r in d["results"]:
            me = r["iteration_us"] - r["compute_us"]
            pe = r["predicted_us"] - r["compute_us"]
            rows.append((h, r["plan"], pe / 1e3, me / 1e3, (pe - me) / me))
    return rows


for name, folder in (("shared-machine term (../raw)", os.path.join(HERE, "..", "raw")),
                     ("one bandwidth (this folder)", HERE)):
    rows = errors(folder)
    print("## %s" % name)
    print("| hosts | plan | exposed pred ms | exposed meas ms | error |")
    print("|---|---|---|---|---|")
    for h, plan, pe, me, e in rows:
        print("| %d | %s | %.1f | %.1f | %+.0f%% |" % (h, plan, pe, me, 100 * e))
    a = sorted(abs(e) for *_, e in rows)
    print("|error| median %.0f%%, under-predicted %d of %d\n" % (
        100 * statistics.median(a), sum(e < 0 for *_, e in rows), len(rows)))
