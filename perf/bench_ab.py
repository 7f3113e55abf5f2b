#!/usr/bin/env python3
"""Interleaved A/B of fusebox-perf allreduce under different flags, on local ranks.

Each round runs every variant once, in an order rotated from round to round, so that what the
machine does over time (other tenants, a VM's vCPUs moving) falls on all of them alike:

  python3 perf/bench_ab.py --build build --rounds 8 --baseline cached \\
      --variant cached='--ucx_shm_stores cached' --variant auto='--ucx_shm_stores auto' \\
      --variant streamed='--ucx_shm_stores streamed' -- -b 256K -e 64M -f 4 -n 20 -w 3

Every variant runs `<build>/tools/fusebox-run -n RANKS -- <build>/perf/fusebox-perf allreduce
--launch 0 --progress 0 ARGS FLAGS`. It prints, per size, each variant's median out-of-place
time over the rounds [order-statistic 95% CI], and its speed-up over the baseline: the median
over rounds of baseline time / variant time in the same round [95% CI] (> 1: faster than the
baseline). With fewer than 6 rounds no order-statistic interval reaches 95%; the one printed is
then min..max. Raw outputs go to <out>/<variant>-<round>.txt, the table to <out>/report.txt,
and its compact summary for a results page to <out>/result.json (perf/results.py).
Exit status: 0 when every run succeeded and checked its results (#wrong 0). Standard library
only.
"""

import argparse
import datetime
import os
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from toolkit import median, median_ci  # noqa: E402  perf/toolkit.py: the shared helpers
import results as result_summary  # noqa: E402  perf/results.py: the results convention


def parse_rows(text):
    """{size: (out-of-place us, #wrong)} from rank 0's data lines."""
    rows = {}
    for line in text.splitlines():
        if not line.startswith("[0]:"):
            continue
        f = line[4:].split()
        if len(f) < 13 or not f[0].isdigit():
            continue
        try:
            rows[int(f[0])] = (float(f[5]), f[8])
        except ValueError:
            continue
    return rows


def fmt_size(b):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div}{unit}"
    return str(b)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="fusebox build directory")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=FLAGS",
                    help="a variant: its name and its fusebox-perf flags (repeat)")
    ap.add_argument("--baseline", help="the variant others are compared with (default: first)")
    ap.add_argument("--out", default=None, help="directory for raw outputs and report.txt")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--from_raw", action="store_true",
                    help="run nothing: report from the raw outputs already in --out")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then fusebox-perf allreduce flags")
    a = ap.parse_args(argv)
    variants = []
    for v in a.variant:
        name, sep, flags = v.partition("=")
        if not sep or not name or not name.replace("-", "").replace("_", "").isalnum():
            ap.error(f"--variant must be NAME=FLAGS with a plain name, got {v!r}")
        if name in (n for n, _ in variants):
            ap.error(f"variant {name!r} given twice")
        variants.append((name, shlex.split(flags)))
    names = [n for n, _ in variants]
    base = a.baseline or names[0]
    if base not in names:
        ap.error(f"--baseline {base!r} is not a variant ({', '.join(names)})")
    if a.rounds < 1 or a.ranks < 1:
        ap.error("--rounds and --ranks must be at least 1")
    extra = a.args[1:] if a.args[:1] == ["--"] else a.args
    run = os.path.join(a.build, "tools", "fusebox-run")
    perf = os.path.join(a.build, "perf", "fusebox-perf")
    for p in (run, perf):
        if not a.from_raw and not os.access(p, os.X_OK):
            ap.error(f"{p} is not an executable: build first (bash scripts/build.sh)")
    if a.from_raw and not a.out:
        ap.error("--from_raw needs --out")
    out = a.out or datetime.datetime.now().strftime("/tmp/bench_ab-%Y%m%d-%H%M%S")
    os.makedirs(out, exist_ok=True)

    times = {n: {} for n in names}  # name -> size -> [us per round]
    ok = True
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            flags = dict(variants)[name]
            cmd = [run, "-n", str(a.ranks), "--", perf, "allreduce", "--launch", "0",
                   "--progress", "0"] + extra + flags
            raw = os.path.join(out, f"{name}-{r + 1}.txt")
            if a.from_raw:
                with open(raw) as f:
                    text, rc = f.read(), 0
            else:
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
                    text, rc = p.stdout + p.stderr, p.returncode
                except subprocess.TimeoutExpired as e:
                    text, rc = f"{e}\n", 124
                with open(raw, "w") as f:
                    f.write("$ " + shlex.join(cmd) + "\n" + text)
            rows = parse_rows(text)
            if rc != 0 or not rows:
                print(f"# round {r + 1} {name}: exit {rc}, {len(rows)} sizes; see {out}",
                      file=sys.stderr)
                ok = False
            for size, (us, wrong) in rows.items():
                if wrong not in ("0", "N/A"):
                    ok = False
                times[name].setdefault(size, []).append((r, us))
        if not a.from_raw:
            print(f"# round {r + 1}/{a.rounds} done", file=sys.stderr)

    lines = [f"# bench_ab: {a.ranks} local ranks, {a.rounds} rounds, variants rotated per round; "
             f"started from {a.build}",
             f"# fusebox-perf allreduce {shlex.join(extra)}",
             "# " + "; ".join(f"{n}: {shlex.join(f) or '(no flags)'}" for n, f in variants),
             f"# time = median out-of-place us [95% CI] and the slowest round; x{base} = median "
             f"over rounds of "
             f"{base}'s time / the variant's in the same round [95% CI] (> 1: faster)", ""]
    head = ["size"] + [f"{n} us [CI] max" for n in names] + [f"{n} x{base}" for n in names if n != base]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---:"] * len(head)) + "|")
    sizes = sorted(set().union(*(times[n].keys() for n in names)))
    for size in sizes:
        cells = [fmt_size(size)]
        for n in names:
            xs = [us for _, us in times[n].get(size, [])]
            if not xs:
                cells.append("-")
                continue
            lo, hi, _ = median_ci(xs)
            cells.append(f"{median(xs):.1f} [{lo:.1f}, {hi:.1f}] {max(xs):.1f}")
        b = dict(times[base].get(size, []))
        for n in names:
            if n == base:
                continue
            ratios = [b[r] / us for r, us in times[n].get(size, []) if r in b and us > 0]
            if not ratios:
                cells.append("-")
                continue
            lo, hi, _ = median_ci(ratios)
            cells.append(f"{median(ratios):.2f} [{lo:.2f}, {hi:.2f}]")
        lines.append("| " + " | ".join(cells) + " |")
    report = "\n".join(lines) + "\n"
    print(report, end="")
    with open(os.path.join(out, "report.txt"), "w") as f:
        f.write(report)
    result_summary.write_run_summary(out, report, "bench_ab",
                                     shlex.join(["python3"] + sys.argv),
                                     "fusebox against itself under different flags, interleaved")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
