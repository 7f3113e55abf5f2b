#!/usr/bin/env python3
"""Three-arm rotations (abc.sh, abw.sh, abwarm.sh, abo.sh): per size, each arm's median time
(us) and its time over the static table's, paired by round (median; rounds it was faster).

usage: arms.py FILE ARM ARM ..."""
import collections
import statistics
import sys

path, arms = sys.argv[1], sys.argv[2:]
r = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(path):
    p = line.split()
    if "Chosen" in line or len(p) < 8:
        continue
    r[p[0]][int(p[2])].append(float(p[7]))
print(f"== {path}: {len(r['static'][min(r['static'])])} rounds")
for s in sorted(r["static"]):
    st = r["static"][s]
    cells = []
    for t in ["static"] + arms:
        ratios = [a / b for a, b in zip(r[t][s], st)]
        cells.append(f"{t} {statistics.median(r[t][s]):6.1f} ({statistics.median(ratios):.2f}, "
                     f"{sum(x < 1 for x in ratios)} faster)")
    print(f"{s:>6} " + "  ".join(cells))
