#!/usr/bin/env python3
"""Plots `fusebox-tune scale --csv` output with matplotlib (Debian's
python3-matplotlib): for each (model, network),

  <out>/<model>-<network>-efficiency.png   scaling efficiency vs world size,
                                           one line per plan (log2 x axis)
  <out>/<model>-<network>-exposed.png      exposed communication per plan at
                                           each world size (grouped bars, log y)

    fusebox-tune scale --profiles all --presets ib-400g,25gbe --ranks_per_node 8 --csv s.csv
    python3 perf/cluster/plot_scaling.py s.csv --out plots/

Prints one line per file written.
"""
import argparse
import csv
import os
import sys
from collections import OrderedDict

FIELDS = ("model", "network", "plan", "world", "nodes", "buckets", "compute_ms", "iteration_ms",
          "exposed_ms", "lower_bound_ms", "efficiency", "throughput")
MAX_ROWS = 1_000_000


def load(path):
    groups = OrderedDict()  # (model, network) -> plan -> [(world, row)]
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [k for k in FIELDS if k not in (reader.fieldnames or [])]
        if missing:
            sys.exit("plot_scaling: %s: missing columns %s" % (path, ", ".join(missing)))
        for i, row in enumerate(reader):
            if i >= MAX_ROWS:
                sys.exit("plot_scaling: %s: more than %d rows" % (path, MAX_ROWS))
            try:
                r = {"world": int(row["world"]), "efficiency": float(row["efficiency"]),
                     "exposed_ms": float(row["exposed_ms"]),
                     "iteration_ms": float(row["iteration_ms"])}
            except ValueError as e:
                sys.exit("plot_scaling: %s: row %d: %s" % (path, i + 2, e))
            plans = groups.setdefault((row["model"], row["network"]), OrderedDict())
            plans.setdefault(row["plan"], []).append(r)
    if not groups:
        sys.exit("plot_scaling: %s: no rows" % path)
    return groups


def safe(name):
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="fusebox-tune scale --csv output")
    ap.add_argument("--out", default=".", help="directory for the PNG files")
    ap.add_argument("--network", help="name the network NAME in titles and file names (e.g. for "
                                      "a fitted model, whose CSV says 'fitted')")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_scaling: needs matplotlib (apt-get install python3-matplotlib)")
    groups = load(args.csv)
    os.makedirs(args.out, exist_ok=True)
    for (model, network), plans in groups.items():
        network = args.network or network
        base = os.path.join(args.out, "%s-%s" % (safe(model), safe(network)))
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for plan, rows in plans.items():
            rows = sorted(rows, key=lambda r: r["world"])
            ax.plot([r["world"] for r in rows], [r["efficiency"] for r in rows], marker="o",
                    linewidth=2.5 if plan == "tuned" else 1.2, label=plan)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("world size (ranks)")
        ax.set_ylabel("scaling efficiency (compute / iteration)")
        ax.set_title("%s on %s: predicted weak scaling" % (model, network))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(base + "-efficiency.png", dpi=110)
        plt.close(fig)
        print(base + "-efficiency.png")

        worlds = sorted({r["world"] for rows in plans.values() for r in rows if r["world"] > 1})
        if not worlds:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        width = 0.8 / len(plans)
        for j, (plan, rows) in enumerate(plans.items()):
            by_world = {r["world"]: r["exposed_ms"] for r in rows}
            ax.bar([i + j * width for i in range(len(worlds))],
                   [max(by_world.get(w, 0), 1e-3) for w in worlds], width, label=plan)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(worlds))])
        ax.set_xticklabels([str(w) for w in worlds])
        ax.set_yscale("log")
        ax.set_xlabel("world size (ranks)")
        ax.set_ylabel("exposed communication per iteration (ms)")
        ax.set_title("%s on %s: communication not hidden behind backward" % (model, network))
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(base + "-exposed.png", dpi=110)
        plt.close(fig)
        print(base + "-exposed.png")


if __name__ == "__main__":
    main()
