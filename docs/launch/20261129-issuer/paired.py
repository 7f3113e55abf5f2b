#!/usr/bin/env python3
"""Per-round pairs of bench_launch's overlap replays: iteration time new/baseline and the
executor's reaction (launch-to-start less queueing), baseline and new, every round.

  python3 docs/launch/20261129-issuer/paired.py docs/launch/20261129-issuer/results.json
"""
import json
import statistics
import sys


def main(path):
    r = json.load(open(path))
    faster = total = 0
    for plan in sorted(r["new"]["overlap"]):
        base, new = r["baseline"]["overlap"][plan], r["new"]["overlap"][plan]
        ratios = sorted(b["iteration_us"] / a["iteration_us"] for a, b in zip(base, new))
        n_faster = sum(x < 1 for x in ratios)
        if plan.endswith("@0.5"):
            faster += n_faster
            total += len(ratios)
        print("%-16s iteration new/baseline: median %.3f, range %.3f-%.3f, new faster in %d of %d"
              % (plan, statistics.median(ratios), ratios[0], ratios[-1], n_faster, len(ratios)))
        for key in ("reaction_p50_us", "reaction_p99_us"):
            print("%-16s %s baseline %s" % ("", key, " ".join("%.1f" % x[key] for x in base)))
            print("%-16s %s new      %s" % ("", key, " ".join("%.1f" % x[key] for x in new)))
    print("compute scale 0.5, all plans: new faster in %d of %d rounds" % (faster, total))


if __name__ == "__main__":
    main(sys.argv[1])
