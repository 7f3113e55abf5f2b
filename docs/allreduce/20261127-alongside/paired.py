#!/usr/bin/env python3
"""Per-round ratio of variant A's time to B's per size: paired.py FILE A B (rounds in file order)."""
import collections, statistics, sys
path, a, b = sys.argv[1:4]
rows = collections.defaultdict(list)
for line in open(path):
    f = line.split()
    if len(f) < 9 or f[4] != "float":
        continue
    rows[(f[0], int(f[2]))].append(float(f[7]))
for size in sorted({s for _, s in rows}):
    x, y = rows.get((a, size), []), rows.get((b, size), [])
    r = [p / q for p, q in zip(x, y)]
    if not r:
        continue
    print("%8d B  %s/%s median %.2f (range %.2f-%.2f), %s faster in %d of %d rounds" %
          (size, a, b, statistics.median(r), min(r), max(r), a, sum(v < 1 for v in r), len(r)))
