#!/usr/bin/env python3
"""Per-round ratios of two variants in a raw file (rows in round order):
median ratio, its spread, and in how many rounds the second was faster."""
import collections, statistics, sys
path, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
seen = collections.defaultdict(list)  # (tool, size) -> times in round order
for line in open(path):
    f = line.split()
    n = len(f)
    seen[(f[0], int(f[n - 13]))].append(float(f[n - 8]))
for size in sorted({s for (_, s) in seen}):
    x, y = seen.get((a, size), []), seen.get((b, size), [])
    r = [q / p for p, q in zip(x, y)]
    if not r:
        continue
    print("%6d B  %s/%s median %.2f (range %.2f-%.2f), %s faster in %d of %d rounds" % (
        size, b, a, statistics.median(r), min(r), max(r), b, sum(v < 1 for v in r), len(r)))
