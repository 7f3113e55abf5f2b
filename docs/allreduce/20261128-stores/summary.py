#!/usr/bin/env python3
"""Per size, column and --ucx_shm_stores mode: the median and every run's time (ms)."""
import glob
import json
import os
import statistics
import sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
runs = {}
for path in sorted(glob.glob(os.path.join(here, "*-*.json"))):
    mode, rep = os.path.basename(path)[:-5].split("-")
    for r in json.load(open(path))["results"]:
        for col in ("ip", "oop"):
            runs.setdefault((r["bytes"], col, mode), []).append(r[col]["time_us"] / 1e3)
print("| bytes | column | stores | median (ms) | runs in order (ms) |")
print("| ---: | --- | --- | ---: | --- |")
for k in sorted(runs):
    v = runs[k]
    print("| %d | %s | %s | %.1f | %s |" % (k + (statistics.median(v), " ".join("%.1f" % x for x in v))))
