#!/usr/bin/env python3
"""Median out-of-place time per variant and size over the rounds of a raw file."""
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    n = len(f)  # fusebox-perf / MPI row: ... size count type redop root time algbw busbw #wrong x4
    rows[(f[0], int(f[n - 13]))].append(float(f[n - 8]))
for (tool, size), v in sorted(rows.items()):
    print("%-8s %6d B  median %6.1f us  (rounds: %s)" %
          (tool, size, statistics.median(v), " ".join("%.0f" % x for x in v)))
