#!/usr/bin/env python3
"""The executor's reaction under overlap (launch-to-start less queueing), from bench_gap sweeps:
per plan and over all runs, the median of the runs' medians and the median of their p99s
(fusebox-perf overlap's reaction_p50_us and reaction_p99_us, slowest rank). Also by the cell's
t(all)/T_b ratio.

  python3 docs/gap/20261129-issuer/reaction.py SWEEP_DIR [SWEEP_DIR ...]
"""
import glob
import json
import os
import statistics
import sys


def main(dirs):
    by_plan, by_ratio, all_runs = {}, {}, []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*-r*.json"))):
            ratio = os.path.basename(path).rsplit("-r", 1)[1][:-len(".json")]
            for r in json.load(open(path))["results"]:
                if r.get("reaction_p50_us") is None:
                    continue
                row = (r["reaction_p50_us"], r["reaction_p99_us"])
                by_plan.setdefault(r["plan"], []).append(row)
                by_ratio.setdefault(ratio, []).append(row)
                all_runs.append(row)
    print("| runs | n | median of run medians (us) | median of run p99s (us) |")
    print("| --- | ---: | ---: | ---: |")

    def line(name, rows):
        print("| %s | %d | %.1f | %.1f |" % (name, len(rows), statistics.median(x[0] for x in rows),
                                            statistics.median(x[1] for x in rows)))

    for plan in sorted(by_plan):
        line(plan, by_plan[plan])
    for ratio in sorted(by_ratio, key=float):
        line("t(all)/T_b = %s" % ratio, by_ratio[ratio])
    line("all", all_runs)


if __name__ == "__main__":
    main(sys.argv[1:])
