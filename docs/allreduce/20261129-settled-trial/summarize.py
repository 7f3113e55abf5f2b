#!/usr/bin/env python3
"""Medians over rounds of ab.sh's rows, and per-round ratios.

usage: summarize.py ab-8hosts-4gbit.txt [...]

For each file and size: the out-of-place time (us) of every tool, median over rounds; the
measured choice over the static table, paired by round (median, its 95% CI, rounds where
measured was faster); and OpenMPI's best algorithm (the least median of a1, a3, a4, a6) over
each fusebox arm (> 1: fusebox faster), with a 95% CI of the median of the ratio to the same
round's best; then how often the measured arm chose each algorithm per size class. The CIs are
distribution-free (sign test): with 6 rounds they are the range, with 10 the 2nd to 9th.
"""
import collections
import math
import statistics
import sys


def median_ci(values, level=0.95):
    """A distribution-free confidence interval for the median (sign test): the k-th smallest
    and k-th largest value, k the largest with P(Binomial(n, 1/2) <= k - 1) <= (1 - level) / 2;
    the least and the largest where no k qualifies (fewer than 6 values)."""
    v, n = sorted(values), len(values)
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) <= k)
    while k < n // 2:
        below += math.comb(n, k) / 2 ** n
        if below > (1 - level) / 2:
            break
        k += 1
    k = max(k, 1)
    return v[k - 1], v[n - k]


def load(path):
    rounds = collections.defaultdict(lambda: collections.defaultdict(list))  # tool -> size -> [us]
    for line in open(path):
        parts = line.split()
        if len(parts) < 2 or "Chosen" in line:
            continue
        tool = parts[0]
        nums = [p for p in parts[1:] if not p.startswith("[")]
        try:
            size, us = int(nums[0]), float(nums[5])
        except (ValueError, IndexError):
            continue
        rounds[tool][size].append(us)
    return rounds


def chosen(path, tag):
    """How often the measured arm (rows labelled `tag`) chose each algorithm, by class."""
    counts = collections.defaultdict(collections.Counter)
    for line in open(path):
        if not line.startswith(tag + " ") or "Chosen: " not in line:
            continue
        for part in line.split("Chosen: ", 1)[1].split("; "):
            cls, rest = part.split(" B: ", 1)
            counts[cls.strip()][rest.split(" (", 1)[0]] += 1
    for cls, c in counts.items():
        print(f"   {tag} chose for {cls}: " + ", ".join(f"{a} {n}" for a, n in c.most_common()))


def main():
    for path in sys.argv[1:]:
        r = load(path)
        mpis = sorted(t for t in r if t.startswith("mpi"))
        print(f"== {path}: rounds {min(len(v) for t in r for v in r[t].values())}")
        print(f"{'size':>6} {'static':>8} {'measured':>8} " +
              " ".join(f"{t:>7}" for t in mpis) +
              "  meas/static (95% CI, faster)   best/static  best/measured (95% CI of the per-round ratio)")
        for size in sorted(r["static"]):
            st, me = r["static"][size], r["measured"][size]
            n = min(len(st), len(me))
            ratios = [me[i] / st[i] for i in range(n)]
            best_tool = min(mpis, key=lambda t: statistics.median(r[t][size]))
            best = statistics.median(r[best_tool][size])
            per_round_best = [min(r[t][size][i] for t in mpis) for i in range(n)]
            vs = [per_round_best[i] / me[i] for i in range(n)]
            lo, hi = median_ci(ratios)
            vs_lo, vs_hi = median_ci(vs)
            print(f"{size:>6} {statistics.median(st):8.1f} {statistics.median(me):8.1f} " +
                  " ".join(f"{statistics.median(r[t][size]):7.1f}" for t in mpis) +
                  f"  {statistics.median(ratios):.2f} ({lo:.2f}-{hi:.2f}, "
                  f"{sum(x < 1 for x in ratios)} of {n})" +
                  f"   {best / statistics.median(st):5.2f}x      "
                  f"{best / statistics.median(me):5.2f}x {best_tool} "
                  f"({vs_lo:.2f}-{vs_hi:.2f})")
        chosen(path, "measured")


if __name__ == "__main__":
    main()
