#!/usr/bin/env python3
"""Plots the DDP scaling benchmark (perf/bench_ddp_scaling.py) from its run summaries.

    python3 perf/plot_ddp_scaling.py docs/results/data/ddp-scaling/*-500mbit.json \
        --out docs/results/ddp-scaling.png

One panel per setting (profile and communication-to-backward ratio): the median step time of
each cell against the number of hosts, with its 95% interval as an error bar: one thin line per
fixed cap (DDP's default 25 MiB, 1, 5 and 100 MiB, PyTorch's pre-bucketing rule), fusebox tuned
from an empty cache (bold) and from the nearest size's cache entry, and below them the step
with no allreduce and the computed lower bound (dashed). Read from the summaries' first table
per setting (columns hosts, bound, noallreduce, then one per cell, "median [low, high]").

Compute in those runs is EMULATED device time; communication is real DDP over gloo between
network namespaces on shaped links (see docs/results/ddp-scaling.md).
"""
import argparse
import json
import re
import sys

CELL = re.compile(r"^\s*([0-9.]+)\s*(?:\[\s*([0-9.]+)\s*,\s*([0-9.]+)\s*\])?\s*$")

# Cell name -> (label, style); the order is the legend's.
STYLE = {
    "ddp25": ("DDP default (25 MiB)", dict(color="tab:red", lw=1.2)),
    "cap1": ("cap 1 MiB", dict(color="tab:orange", lw=1.2)),
    "cap5": ("cap 5 MiB", dict(color="tab:olive", lw=1.2)),
    "cap100": ("cap 100 MiB", dict(color="tab:brown", lw=1.2)),
    "pytorch": ("PyTorch pre-bucketing rule", dict(color="tab:purple", lw=1.2)),
    "fusebox": ("fusebox (empty cache)", dict(color="tab:blue", lw=2.6)),
    "fusebox_warm": ("fusebox (nearest size's entry)", dict(color="tab:cyan", lw=1.6, ls="--")),
    "noallreduce": ("no allreduce", dict(color="0.45", lw=1.0, ls=":")),
    "bound": ("lower bound (computed)", dict(color="black", lw=1.0, ls="--")),
}


def parse_cell(text):
    """(median, low, high) from "m [lo, hi]" or "m"; None for an empty cell."""
    m = CELL.match(text or "")
    if not m:
        return None
    med = float(m.group(1))
    lo = float(m.group(2)) if m.group(2) else med
    hi = float(m.group(3)) if m.group(3) else med
    return med, lo, hi


def settings(summary):
    """[(title, {cell: [(hosts, median, low, high)]})] from one run summary: every table whose
    columns begin hosts, bound."""
    out = []
    for t in summary.get("tables", []):
        cols = t.get("columns", [])
        if cols[:2] != ["hosts", "bound"]:
            continue
        series = {}
        for row in t["rows"]:
            hosts = int(row[0])
            for name, text in zip(cols[1:], row[1:]):
                v = parse_cell(text)
                if v is not None:
                    series.setdefault(name, []).append((hosts,) + v)
        out.append((t.get("heading") or t.get("name", "?"), series))
    return out


def plot(panels, out_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 4.2), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        for name in list(STYLE) + sorted(set(series) - set(STYLE)):
            if name not in series:
                continue
            pts = sorted(series[name])
            label, style = STYLE.get(name, (name, dict(lw=1.0)))
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(xs, ys, yerr=err, label=label, capsize=2, marker="o", ms=3, **style)
        hosts = sorted({p[0] for s in series.values() for p in s})
        ax.set_xticks(hosts)
        ax.set_xlabel("hosts (one rank each)")
        ax.set_ylabel("step time, ms (median, 95% CI)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle("Real DDP over gloo on emulated hosts (500 Mbit), compute as EMULATED device "
                 "time", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.savefig(out_path, dpi=90)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summaries", nargs="+", help="run summaries of perf/bench_ddp_scaling.py")
    ap.add_argument("--out", required=True, help="the image to write (.png or .svg)")
    args = ap.parse_args(argv)
    panels = []
    for path in args.summaries:
        try:
            with open(path) as f:
                summary = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit("plot_ddp_scaling: cannot read %s: %s" % (path, e))
        panels += settings(summary)
    if not panels:
        sys.exit("plot_ddp_scaling: no table with columns 'hosts, bound, ...' in %s"
                 % ", ".join(args.summaries))
    plot(panels, args.out)
    print("wrote %s (%d settings)" % (args.out, len(panels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
