#!/usr/bin/env python3
"""Per run and plan: exposed communication predicted (in-run cost model) / measured, and the error."""
import glob
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
for p in sorted(glob.glob(os.path.join(here, "*.json"))):
    j = json.load(open(p))
    row = []
    for r in j["results"]:
        e = ((r["predicted_exposed_us"] - r["exposed_us"]) / r["exposed_us"]
             if r["exposed_us"] > 0 else float("nan"))
        row.append("%s %.1f/%.1f ms %+.0f%%" % (r["plan"], r["predicted_exposed_us"] / 1e3,
                                               r["exposed_us"] / 1e3, 100 * e))
    print(os.path.basename(p), " | ".join(row))
