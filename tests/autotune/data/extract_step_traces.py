#!/usr/bin/env python3
"""Rebuilds step_traces.json: recorded per-step times of real PyTorch DDP runs
on this project's machine, in the order the steps ran, for the regression
detector's synthetic runs (autotune/regression.h, autotune/testing/).

Sources, read from git (the files left the tree in a later commit):
  docs/ddp-hook/<run>/rounds/<setting>-r<k>.json   fusebox's DDP benchmark
      (perf/bench_ddp_hook.py): every round runs 2 warm-up and 8 measured
      blocks of one step of every cell (5 or 6 DDP models) in a random order,
      and stores each cell's measured steps ("measured_ms", slowest rank).
      The order of block b > 0 is random.Random(crc32(",".join(order)) + b)
      .sample(list(CELLS), len(CELLS)) (perf/ddp_hook_worker.py), block 0 runs
      meta.order, so the steps can be put back in the order they ran.
  docs/ddp-hook/20261125-hook-overhead-1gbit/raw/run<k>-rank0.txt: an A/B of
      4 DDP cells (ResNet-18 over 1 Gbit), 4 warm-up and 40 measured blocks in
      the order random.Random(seed * 100003 + block).sample(cells, 4), seed k;
      the "raw" line holds each cell's steps (slowest rank).
One trace per setting (model x link of one benchmark run, its rounds one after
another, in the order of "paths") and one per A/B run. Each step keeps its time
in ms and a group id, 8 x round + the index of its cell in "cells" (the round
is the index in "paths"): the cells are different plans, so a consumer divides
each step by its group's median to keep the step-to-step noise without the
plans' differences.

Usage: extract_step_traces.py [REPO] > step_traces.json"""
import ast, collections, json, random, re, subprocess, sys, zlib

COMMIT = "54e2c5e2"
repo = sys.argv[1] if len(sys.argv) > 1 else "."


def git(*args):
    return subprocess.run(["git", "-C", repo] + list(args), check=True, capture_output=True,
                          text=True).stdout


def ddp_hook_traces():
    all_cells = ["ddp25", "ddp1", "ddp5", "ddp100", "fusebox", "nocomm"]  # CELLS' order
    files = [f for f in git("ls-tree", "-r", "--name-only", COMMIT, "docs/ddp-hook").split()
             if "/rounds/" in f]
    settings = collections.OrderedDict()
    for f in sorted(files):
        m = re.match(r"docs/ddp-hook/([^/]+)/rounds/(.+)-r(\d+)\.json$", f)
        settings.setdefault((m.group(1), m.group(2)), []).append((int(m.group(3)), f))
    out = []
    for (run, setting), rounds in settings.items():
        ms, group, paths, cells_seen = [], [], [], []
        for k, (number, f) in enumerate(sorted(rounds)):
            d = json.loads(git("show", COMMIT + ":" + f))
            meta = d["meta"]
            order = meta["order"]
            cells = [c for c in all_cells if c in order]
            assert sorted(cells) == sorted(order) and sorted(cells) == sorted(d["cells"]), f
            warmup = meta["blocks"] - meta["measured_blocks"]
            seed = zlib.crc32(",".join(order).encode())
            for block in range(warmup, meta["blocks"]):
                this = list(order) if block == 0 else random.Random(seed + block).sample(
                    list(cells), len(cells))
                for c in this:
                    ms.append(round(d["cells"][c]["measured_ms"][block - warmup], 2))
                    group.append(k * 8 + cells.index(c))
            paths.append(f)
            cells_seen = cells
        out.append({"id": "ddp-hook/%s/%s" % (run, setting), "source": "ddp-hook",
                    "commit": COMMIT, "paths": paths, "cells": cells_seen,
                    "what": "%d rounds x %d measured blocks x %d cells, steps in the order run"
                            % (len(paths), 8, len(cells_seen)),
                    "ms": ms, "group": group})
    return out


def ab_traces():
    base = "docs/ddp-hook/20261125-hook-overhead-1gbit/raw"
    out = []
    for run in (1, 2, 3):
        path = "%s/run%d-rank0.txt" % (base, run)
        text = git("show", COMMIT + ":" + path)
        raw = ast.literal_eval(next(l for l in text.splitlines() if l.startswith("raw "))[4:])
        cells = list(raw)  # the script's insertion order: tuned, fixed, plain_old, plain
        n = len(raw[cells[0]])
        warmup = 4
        ms, group = [], []
        for block in range(warmup, warmup + n):
            for c in random.Random(run * 100003 + block).sample(cells, len(cells)):
                ms.append(raw[c][block - warmup])
                group.append(cells.index(c))
        out.append({"id": "hook-overhead-1gbit/run%d" % run, "source": "hook-overhead-1gbit",
                    "commit": COMMIT, "paths": [path], "cells": cells,
                    "what": "%d measured blocks x %d cells, steps in the order run" % (n, len(cells)),
                    "ms": ms, "group": group})
    return out


traces = ddp_hook_traces() + ab_traces()
doc = {"about": "Recorded per-step times (ms, slowest rank) of real PyTorch DDP training runs, "
                "steps in the order they ran; a step's group is 8 x round (its index in paths) + "
                "its cell's index in cells, its plan within one round: divide by the group's "
                "median to keep the noise without the plans' differences. Made by "
                "extract_step_traces.py from the files of commit " + COMMIT + ".",
       "traces": traces}
# One trace per line: small and diffable.
print("{\"about\": %s,\n \"traces\": [" % json.dumps(doc["about"]))
print(",\n".join("  " + json.dumps(t, separators=(",", ":")) for t in traces))
print(" ]}")
