#!/usr/bin/env python3
"""Interleaved rounds of `fusebox-perf overlap` (2 local ranks) under several
configurations (each its own build and flags); prints, per configuration and
plan, the median over rounds of iter/bound and of the launch-to-start p50/p99
(the executor's reaction, us). Raw logs go to --out.

  python3 overlap_ab.py --rounds 4 --out DIR --profile resnet50 --ratio 2 \
      --config 'base|/tmp/basebuild|' --config 'new|/tmp/fbb|'
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"^\[0\]:\s+(\S+)\s+(\d+)\s+([\d.]+)\s+\[[^\]]*\]\s+([\d.]+)\s+([\d.-]+)\s+"
                  r"([\d.-]+)\s+([\d.]+)\s+([\d.]+)\s+\S+\s+\S+\s+\S+\s+([\d.]+)\s*/\s*([\d.]+)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default="resnet50")
    ap.add_argument("--ratio", default="2", help="--comm_ratio (t(all)/T_backward)")
    ap.add_argument("--plans", default="ddp,ddp-cap1mb,ddp-cap5mb,horovod,per-tensor")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--config", action="append", required=True, help="NAME|BUILD|FLAGS")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    configs = [c.split("|", 2) for c in a.config]
    rows = {}  # (config, plan) -> list of (iter/bound, p50, p99, iter)
    for r in range(1, a.rounds + 1):
        for name, build, flags in configs:
            cmd = [os.path.join(build, "tools/fusebox-run"), "-n", "2", "--",
                   os.path.join(build, "perf/fusebox-perf"), "overlap", "--profile", a.profile,
                   "--compute_scale", "auto", "--comm_ratio", a.ratio, "--plans", a.plans,
                   "-n", str(a.iters), "-w", "1", "--explain"] + flags.split()
            log = os.path.join(a.out, "%s-%d.log" % (name, r))
            with open(log, "w") as f:
                f.write("$ " + " ".join(cmd) + "\n")
                f.flush()
                p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
            if p.returncode != 0:
                sys.exit("%s failed (%d); see %s" % (name, p.returncode, log))
            got = []
            for line in open(log):
                m = LINE.match(line)
                if m:
                    plan, it, ratio = m.group(1), float(m.group(3)), float(m.group(8))
                    rows.setdefault((name, plan), []).append(
                        (ratio, float(m.group(9)), float(m.group(10)), it))
                    got.append("%s %.3f" % (plan, ratio))
            print("round %d %-10s %s" % (r, name, "  ".join(got)), flush=True)
    print("\nmedian over %d rounds: iter/bound, iteration ms, launch-to-start p50/p99 us" % a.rounds)
    plans = a.plans.split(",")
    print("| plan | " + " | ".join(c[0] for c in configs) + " |")
    print("| --- |" + " ---: |" * len(configs))
    for plan in plans:
        cells = []
        for name, _, _ in configs:
            v = rows.get((name, plan), [])
            if not v:
                cells.append("-")
                continue
            med = lambda k: statistics.median(x[k] for x in v)
            cells.append("%.3f (%.2f ms; %.1f/%.1f)" % (med(0), med(3), med(1), med(2)))
        print("| %s | %s |" % (plan, " | ".join(cells)))


if __name__ == "__main__":
    main()
