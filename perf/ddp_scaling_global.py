#!/usr/bin/env python3
"""The single best global bucket cap of perf/bench_ddp_scaling.py's runs, and fusebox beside it.

A user who cannot tune per cluster size picks one bucket_cap_mb for every setting. The best such
choice, in hindsight, is the fixed cap whose step is closest to each setting's best fixed cap on
average: the cap with the lowest mean over settings (profile, communication ratio, host count)
of its median step / the best fixed cap's median step. This script reads the medians that
bench_ddp_scaling's summaries hold (docs/results/data/ddp-scaling/*.json: the first table of
each setting, median step per cell over all repeats, as printed), names that cap, and prints
fusebox's median beside it per setting, with no new measurement. Then fusebox against the
step's lower bound (the summaries' computed `bound` column): where DDP's default leaves at least
HEADROOM of the bound, the share of the time between DDP's default and the bound that fusebox
removes (target REMOVED); where some measured plan comes within NEAR of the bound, whether
fusebox does too. It writes its own compact summary with --out (perf/results.py's format).

    python3 perf/ddp_scaling_global.py docs/results/data/ddp-scaling/*.json \\
        --out docs/results/data/ddp-scaling/global-cap.json
"""
import argparse
import collections
import os
import shlex
import statistics
import sys

import results as result_summary

CAPS = ("ddp25", "cap1", "cap5", "cap100", "pytorch")
HEADROOM = 1.3  # DDP's default / the bound from which the removal target applies
REMOVED = 0.75  # the share of DDP's default - bound fusebox removes there
NEAR = 1.05     # a plan within this of the bound: fusebox must be too


def medians_of(summary):
    """{(setting, hosts): {cell: median ms, "bound": the bound}} from one bench_ddp_scaling
    summary: its tables whose columns start with hosts and bound (the per-cell medians)."""
    out = {}
    for table in summary["tables"]:
        cols = table["columns"]
        if cols[:2] != ["hosts", "bound"]:
            continue
        for row in table["rows"]:
            cells = {c: float(v.split()[0]) for c, v in zip(cols[2:], row[2:]) if v not in ("", "-")}
            cells["bound"] = float(row[1].split()[0])
            out[(table["name"], int(row[0]))] = cells
    return out


def global_cap(medians):
    """The cap with the lowest mean ratio to each setting's best fixed cap, and those means."""
    means = {}
    for cap in CAPS:
        ratios = [m[cap] / min(m[c] for c in CAPS) for m in medians.values()]
        means[cap] = statistics.mean(ratios)
    return min(CAPS, key=lambda c: (means[c], CAPS.index(c))), means


BoundRow = collections.namedtuple(
    "BoundRow", "setting hosts bound headroom top best fused removed floor")


def bound_rows(medians):
    """Per setting and host count a BoundRow: the bound, DDP's default / bound (headroom), the
    best measured plan (not noallreduce: top) and its step / bound (best), fusebox / bound
    (fused), the share of DDP's default - bound that fusebox removes (None without a gap), no
    allreduce at all / bound (floor, None if not run)."""
    rows = []
    for (setting, hosts), m in sorted(medians.items()):
        bound = m["bound"]
        plans = {c: v for c, v in m.items() if c not in ("bound", "noallreduce")}
        top = min(plans, key=plans.get)
        gap = m["ddp25"] - bound
        removed = (m["ddp25"] - m["fusebox"]) / gap if gap > 0 else None
        rows.append(BoundRow(setting, hosts, bound, m["ddp25"] / bound, top, plans[top] / bound,
                             m["fusebox"] / bound, removed,
                             m["noallreduce"] / bound if "noallreduce" in m else None))
    return rows


def bound_report(medians):
    rows = bound_rows(medians)
    lines = ["## fusebox against the lower bound", "",
             "Per setting: medians over all repeats; bound = the summaries' computed lower "
             "bound of the step; removed = (ddp25 - fusebox) / (ddp25 - bound); noallreduce = "
             "the step with no allreduce at all, which no plan can beat (the bound leaves out "
             "the ranks' CPU work).", "",
             "| setting | hosts | bound ms | ddp25 / bound | best plan | best / bound | "
             "fusebox / bound | removed | noallreduce / bound |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append("| %s | %d | %.1f | %.3f | %s | %.3f | %.3f | %s | %s |" % (
            r.setting, r.hosts, r.bound, r.headroom, r.top, r.best, r.fused,
            "-" if r.removed is None else "%.0f%%" % (100 * r.removed),
            "-" if r.floor is None else "%.3f" % r.floor))
    wide = [r for r in rows if r.headroom >= HEADROOM]
    near = [r for r in rows if r.best <= NEAR]
    lines += ["", "| target | cells | met | result |", "| --- | ---: | ---: | --- |"]
    for text, cells, met in (
            ("fusebox removes >= %.0f%% of ddp25 - bound where ddp25 / bound >= %.1f"
             % (100 * REMOVED, HEADROOM), wide, [r for r in wide if r.removed >= REMOVED]),
            ("fusebox within %.2f of the bound where some measured plan is" % NEAR, near,
             [r for r in near if r.fused <= NEAR])):
        lines.append("| %s | %d | %d | %s |" % (text, len(cells), len(met),
                                                "-" if not cells else
                                                "PASS" if len(met) == len(cells) else "FAIL"))
    return lines


def report(medians, paths):
    best, means = global_cap(medians)
    lines = ["## the single best global cap", "",
             "Mean over %d settings of each fixed cap's median step / that setting's best fixed "
             "cap (medians over all repeats, from %s); lower is better."
             % (len(medians), ", ".join(os.path.basename(p) for p in paths)), "",
             "| cap | mean ratio to the setting's best |", "| --- | ---: |"]
    lines += ["| %s | %.3f |" % (c, means[c]) for c in CAPS]
    lines += ["", "## fusebox beside the global cap (%s)" % best, "",
              "Per setting: median step ms over all repeats; ratios lower is faster.", "",
              "| setting | hosts | %s ms | best fixed cap | best ms | fusebox ms | "
              "fusebox / %s | fusebox / best |" % (best, best),
              "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for (setting, hosts), m in sorted(medians.items()):
        top = min(CAPS, key=lambda c: m[c])
        lines.append("| %s | %d | %.1f | %s | %.1f | %.1f | %.3f | %.3f |" % (
            setting, hosts, m[best], top, m[top], m["fusebox"], m["fusebox"] / m[best],
            m["fusebox"] / m[top]))
    lines += [""] + bound_report(medians)
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summaries", nargs="+", help="bench_ddp_scaling result.json files")
    ap.add_argument("--out", help="write this report's compact summary here")
    args = ap.parse_args(argv)
    medians = {}
    for path in args.summaries:
        try:
            medians.update(medians_of(result_summary.load_summary(path)))
        except (OSError, ValueError, KeyError) as e:
            sys.exit("ddp_scaling_global: %s: %s" % (path, e))
    missing = [k for k, m in medians.items()
               if any(c not in m for c in CAPS + ("fusebox", "bound"))]
    if not medians or missing:
        sys.exit("ddp_scaling_global: no settings, or settings without every cap, fusebox and "
                 "the bound: %s"
                 % missing)
    text = report(medians, args.summaries)
    print(text, end="")
    if args.out:
        command = shlex.join(["python3", "perf/ddp_scaling_global.py"] +
                             [os.path.relpath(p) for p in args.summaries] +
                             ["--out", os.path.relpath(args.out)])
        summary = result_summary.make_summary(
            text, "ddp_scaling_global", command,
            "the single best global cap of the DDP scaling runs, and fusebox beside it",
            result_summary.git_commit(), result_summary.datetime.date.today().isoformat(),
            result_summary.this_machine())
        result_summary.write_summary(args.out, summary)


if __name__ == "__main__":
    main()
