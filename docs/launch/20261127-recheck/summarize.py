#!/usr/bin/env python3
"""Medians (and ranges) over rounds per configuration of an overlap A/B rounds file."""
import collections, statistics, sys
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    f = line.replace("=", " ").split()
    a = f.index("per-tensor(p50")
    name = f[1]
    for key, v in zip(["per-tensor p50", "per-tensor p99", "per-tensor iter ms"], f[a + 3:a + 6]):
        rows[name][key].append(float(v))
    for key, v in zip(["ddp p50", "ddp p99", "ddp iter ms"], f[a + 7:a + 10]):
        rows[name][key].append(float(v))
keys = ["per-tensor p50", "per-tensor p99", "per-tensor iter ms", "ddp p50", "ddp p99", "ddp iter ms"]
print("| configuration | " + " | ".join(keys) + " |")
print("| --- |" + " ---: |" * len(keys))
for name, d in rows.items():
    print("| %s | " % name + " | ".join("%.1f [%.1f-%.1f]" % (statistics.median(d[k]), min(d[k]), max(d[k])) for k in keys) + " |")
