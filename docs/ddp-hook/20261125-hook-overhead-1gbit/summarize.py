"""Pools the runs of run.sh: per cell, the paired ratio to `plain` in every measured block of
every run, its median and a 95% bootstrap interval of the median (10,000 resamples, fixed seed).
Usage: python3 summarize.py raw"""
import ast, glob, os, random, statistics, sys

runs = sorted(glob.glob(os.path.join(sys.argv[1], "run*-rank0.txt")))
ratios, decisions = {}, []
for path in runs:
    with open(path) as f:
        for line in f:
            if line.startswith("seed "):
                decisions.append(line.strip())
            if line.startswith("raw "):
                times = ast.literal_eval(line[4:])
                for cell, ts in times.items():
                    ratios.setdefault(cell, []).extend(a / b for a, b in zip(ts, times["plain"]))
rng = random.Random(1)
print("%d runs; tuned cell per run:" % len(runs))
for d in decisions:
    print("  " + d)
print("| cell | blocks | paired x plain (median) | 95% CI | blocks slower than plain |")
print("|---|---:|---:|---|---:|")
for cell, r in ratios.items():
    meds = sorted(statistics.median(rng.choices(r, k=len(r))) for _ in range(10000))
    print("| %s | %d | %.3f | [%.3f, %.3f] | %d%% |" % (
        cell, len(r), statistics.median(r), meds[249], meds[9749],
        round(100 * sum(x > 1 for x in r) / len(r))))
