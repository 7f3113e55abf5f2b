#!/usr/bin/env python3
"""Summarises run.sh's raw outputs: per size, the median out-of-place time of
each tool over the rounds, and the ratios after/before and after/mpi with a
95% bootstrap CI over rounds (a ratio below 1 means 'after' is faster)."""
import glob
import os
import random
import re
import statistics
import sys

raw = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "raw")
ROW = re.compile(r"^(?:\[0\]:)?\s+(\d+)\s+\d+\s+float\s+sum\s+-1\s+([\d.]+)")


def times(path):
    out = {}
    for line in open(path):
        m = ROW.match(line)
        if m:
            out[int(m.group(1))] = float(m.group(2))
    return out


def load(tool, kind):
    rounds = {}
    for p in glob.glob(os.path.join(raw, "%s-%s-r*.txt" % (tool, kind))):
        r = int(re.search(r"-r(\d+)\.txt$", p).group(1))
        rounds[r] = times(p)
    return rounds


def ci(ratios, n=4000):
    rng = random.Random(1)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


print("| run | size (B) | before us | after us | mpi us | after/before | 95% CI | after/mpi | 95% CI |")
print("|---|---:|---:|---:|---:|---:|---|---:|---|")
for kind, label in (("lat", "8 B, -n 20000"), ("sweep", "sweep, -n 2000")):
    data = {t: load(t, kind) for t in ("before", "after", "mpi")}
    rounds = sorted(set(data["before"]) & set(data["after"]) & set(data["mpi"]))
    sizes = sorted(set.intersection(*(set(data[t][r]) for t in data for r in rounds)))
    for s in sizes:
        b = [data["before"][r][s] for r in rounds]
        a = [data["after"][r][s] for r in rounds]
        m = [data["mpi"][r][s] for r in rounds]
        ab = [x / y for x, y in zip(a, b)]
        am = [x / y for x, y in zip(a, m)]
        lo1, hi1 = ci(ab)
        lo2, hi2 = ci(am)
        print("| %s | %d | %.2f | %.2f | %.2f | %.3f | [%.3f, %.3f] | %.3f | [%.3f, %.3f] |" % (
            label, s, statistics.median(b), statistics.median(a), statistics.median(m),
            statistics.median(ab), lo1, hi1, statistics.median(am), lo2, hi2))
print("\n%d rounds; times are blocking (every call waited), out-of-place, rank 0's average per call." % len(rounds))
