#!/usr/bin/env python3
"""Medians over rounds of ab.sh's rows, and per-round ratios.

usage: summarize.py FILE [...]

For each file and size: the out-of-place time (us) of every arm, median over rounds; new over
old, paired by round (median, its 95% CI, rounds where new was faster); and OpenMPI's best over
each fusebox arm (> 1: fusebox faster): the least of a3-a6 in the same round over the arm's time,
median and 95% CI. Then how often each fusebox arm's measured choice chose each algorithm per
size class. The CIs are distribution-free (sign test), as in ../20261129-settled-trial.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "20261129-settled-trial"))
from summarize import chosen, load, median_ci  # noqa: E402


def main():
    for path in sys.argv[1:]:
        r = load(path)
        mpis = sorted(t for t in r if t.startswith("mpi"))
        print(f"== {path}: rounds {min(len(v) for t in r for v in r[t].values())}")
        print(f"{'size':>7} {'old':>8} {'new':>8} " + " ".join(f"{t:>7}" for t in mpis) +
              "  new/old (95% CI, new faster)  best/old (95% CI)  best/new (95% CI)")
        for size in sorted(r["old"]):
            old, new = r["old"][size], r["new"][size]
            n = min(len(old), len(new), *(len(r[t][size]) for t in mpis))
            ratios = [new[i] / old[i] for i in range(n)]
            best = [min(r[t][size][i] for t in mpis) for i in range(n)]
            vs_old = [best[i] / old[i] for i in range(n)]
            vs_new = [best[i] / new[i] for i in range(n)]
            cells = []
            for v in (ratios, vs_old, vs_new):
                lo, hi = median_ci(v)
                cells.append(f"{statistics.median(v):.2f} ({lo:.2f}-{hi:.2f})")
            print(f"{size:>7} {statistics.median(old):8.1f} {statistics.median(new):8.1f} " +
                  " ".join(f"{statistics.median(r[t][size]):7.1f}" for t in mpis) +
                  f"  {cells[0]}, {sum(x < 1 for x in ratios)} of {n}   {cells[1]}   {cells[2]}")
        chosen(path, "old")
        chosen(path, "new")


if __name__ == "__main__":
    main()
