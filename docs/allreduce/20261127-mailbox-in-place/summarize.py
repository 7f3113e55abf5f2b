#!/usr/bin/env python3
"""Per size: each build's median over rounds and its median per-round ratio to
the first build named (default 'old')."""
import collections, statistics, sys
path = sys.argv[1] if len(sys.argv) > 1 else "raw.txt"
base = sys.argv[2] if len(sys.argv) > 2 else "old"
t = collections.defaultdict(dict)  # (size, build) -> {round: us}
for line in open(path):
    f = line.split()
    if len(f) == 8:
        t[(int(f[5]), f[3])][int(f[1])] = float(f[7])
builds = sorted({b for _, b in t if b != base})
print("| size B | %s us | %s |" % (base, " | ".join(
    "%s us; %s/%s per round: median (range), faster in" % (b, b, base) for b in builds)))
print("| ---: | ---: |" + " --- |" * len(builds))
for size in sorted({s for s, _ in t}):
    o = t[(size, base)]
    cells = []
    for b in builds:
        n = t[(size, b)]
        r = [n[k] / o[k] for k in o if k in n]
        cells.append("%.3f; %.2f (%.2f-%.2f), %d of %d" % (
            statistics.median(n.values()), statistics.median(r), min(r), max(r),
            sum(x < 1 for x in r), len(r)))
    print("| %d | %.3f | %s |" % (size, statistics.median(o.values()), " | ".join(cells)))
