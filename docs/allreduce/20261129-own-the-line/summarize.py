#!/usr/bin/env python3
"""Summarise ab.sh's rounds: per size, the median over rounds of each per-round time ratio, with a
distribution-free 95% CI of that median (order statistics of the binomial), and rounds below 1.

Times are each arm's better of its out-of-place and in-place columns (us). "best" is the fastest of
OpenMPI's arms in the same round. Usage: summarize.py RAWDIR [A-label B-label]."""
import glob, math, os, re, statistics, sys

def read(path):
    out = {}
    for line in open(path):
        f = re.sub(r"^\[\d+\]:", "", line).split()
        if len(f) >= 13 and f[0].isdigit() and f[2] == "float":
            out[int(f[0])] = min(float(f[5]), float(f[9]))
    return out

def ci(xs):
    """Ranks (1-based) of a >= 95% distribution-free CI of the median of len(xs) values."""
    n = len(xs)
    k = 0
    while True:  # largest k with P(Bin(n, .5) <= k) <= 2.5%
        if sum(math.comb(n, i) for i in range(k + 2)) / 2 ** n > 0.025:
            break
        k += 1
    s = sorted(xs)
    return (s[k], s[n - 1 - k]) if k < n - 1 - k else (s[0], s[-1])

raw = sys.argv[1]
la, lb = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ("A", "B")
runs = {}
for p in glob.glob(os.path.join(raw, "*-*.txt")):
    r, arm = os.path.basename(p)[:-4].split("-", 1)
    runs.setdefault(int(r), {})[arm] = read(p)
rounds = sorted(runs)
sizes = sorted(set.intersection(*[set(v) for r in rounds for v in runs[r].values()]))
print("%d rounds from %s; ratios of times (< 1: the first is faster), median [95%% CI] (rounds < 1)"
      % (len(rounds), raw))
print("%8s %9s %9s %9s | %-24s %-24s %-24s" % ("bytes", la + " us", lb + " us", "best us",
      lb + "/" + la, la + "/best", lb + "/best"))
def cell(xs):
    lo, hi = ci(xs)
    return "%.2f [%.2f-%.2f] (%d)" % (statistics.median(xs), lo, hi, sum(x < 1 for x in xs))
for b in sizes:
    ta = [runs[r]["A"][b] for r in rounds]
    tb = [runs[r]["B"][b] for r in rounds]
    best = [min(v[b] for k, v in runs[r].items() if k.startswith("mpi")) for r in rounds]
    print("%8d %9.2f %9.2f %9.2f | %-24s %-24s %-24s" % (
        b, statistics.median(ta), statistics.median(tb), statistics.median(best),
        cell([y / x for x, y in zip(ta, tb)]), cell([x / m for x, m in zip(ta, best)]),
        cell([y / m for y, m in zip(tb, best)])))
