#!/usr/bin/env python3
"""Medians over rounds of run.sh's raw.txt, with each round's values."""
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1] if len(sys.argv) > 1 else "raw.txt"):
    f = line.split()
    if len(f) == 9:
        rows[(f[5], f[6], f[3])].append(float(f[8]))
print("| size | calls | old us (median; rounds) | new us (median; rounds) | new/old |")
print("| ---: | --- | --- | --- | ---: |")
for size in ("32K", "256K", "2M"):
    for phase in ("first4", "steady"):
        o, n = rows[(size, phase, "old")], rows[(size, phase, "new")]
        mo, mn = statistics.median(o), statistics.median(n)
        fmt = lambda v: " ".join("%.0f" % x for x in v)
        print("| %s | %s | %.1f; %s | %.1f; %s | %.2f |" % (size, phase, mo, fmt(o), mn, fmt(n), mn / mo))
