#!/usr/bin/env python3
"""Median out-of-place time per variant and size over the rounds of a raw file.

Rows: TAG <rank prefix> size count type redop root time algbw busbw #wrong ...
(fusebox-perf and fusebox-mpi-allreduce print the same columns)."""
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 9 or f[4] != "float":
        continue
    rows[(f[0], int(f[2]))].append(float(f[7]))
for (tool, size), v in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print("%-8s %6d B  median %6.1f us  (rounds: %s)" %
          (tool, size, statistics.median(v), " ".join("%.0f" % x for x in v)))
