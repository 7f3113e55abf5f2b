#!/usr/bin/env python3
"""Benchmark: real PyTorch DDP (gloo, CPU, 2 ranks) with and without the fusebox hook.

For each setting (a model on a link), every round starts 2 ranks
(perf/ddp_hook_worker.py). First fusebox tunes, as a user would run it:
DDP's defaults + fusebox.torch.register(model), an empty policy cache, step
after step until its tuning is over. Then six DDP models train side by side
from the fusebox model's state at that point:

    ddp25      DDP's default buckets (bucket_cap_mb=25)
    ddp1       bucket_cap_mb=1      \\
    ddp5       bucket_cap_mb=5       > the caps users set by hand
    ddp100     bucket_cap_mb=100    /
    fusebox    the tuned model, its hook in place
    nocomm     DDP with torch's noop_hook: no allreduce at all, the step's
               compute alone

in blocks of one step of every cell, in a fresh random order per block, on
the same batch; the first blocks are warm-up. Interleaving step by step puts
the machine's slow spells (minutes long on shared machines) on every cell
alike, and each block is a paired comparison. Every step is timed from before
zero_grad to the end of optimizer.step (three phases: forward, backward with
DDP's wait for its buckets, optimizer), and the slowest rank's time counts.
Since every cell starts from the same state on the same batches, the losses
of the cells that reduce must agree (bit for bit on 2 ranks): a check that
fusebox changes when and how gradients are reduced, not what.

nocomm is the headroom: no plan of buckets can make a step faster than its
compute, so ddp25 / nocomm is the largest speedup any bucketing could reach in
that setting, and (ddp25 - fusebox) / (ddp25 - nocomm) is the share of DDP's
exposed communication that fusebox removed (the same for the best cap).

Across rounds it reports, per cell: the median of the per-round medians with a
distribution-free confidence interval (order statistics; with 5 rounds that is
[min, max], 93.8% coverage: the report states the coverage), the ratio to
ddp25 and the ratio to the best hand-set cap of the same round (the median of
per-round ratios, with the same kind of interval). The "best cap" is picked in
hindsight from four noisy measurements, so it is a baseline biased in the
caps' favour. Then, for fusebox: its speedups, tuning iterations and cost,
what it chose each round, and how many rounds it kept a plan slower than
ddp25 beyond that round's noise (rule: fusebox's median is above ddp25's and
the interquartile ranges of their measured steps do not overlap).

Models: "transformer", a small causal LM (8000-token vocabulary, d_model 128,
2 encoder layers, 64 tokens per sample, 2.45M parameters, 9.8 MB of
gradients, about 0.4 s per step at batch 4 on one thread here);
"transformer7m", the same with d_model 256, 4 layers, feed-forward 1024
(7.26M parameters, 29 MB: most of its gradient bytes are the layers', which
DDP's default reduces only at the end of backward); "cnn",
torchvision's ResNet-18 with 10 classes on 3x32x32 (11.2M parameters, 44.7 MB,
about 0.14 s per step at batch 32; needs python3-torchvision). Communication is
comparable to compute for the transformers near 300 Mbit and for the CNN near
4 Gbit: run each model on its own links, e.g.

    sudo /usr/bin/python3 perf/bench_ddp_hook.py --models transformer7m --links loopback,300mbit,1gbit
    sudo /usr/bin/python3 perf/bench_ddp_hook.py --models cnn --links loopback,1gbit,4gbit

Links: "loopback" (both ranks in this network namespace over 127.0.0.1), or a
tc rate such as 300mbit or 1gbit: 2 network namespaces (fbbenchA, fbbenchB)
joined by a veth pair with a tbf qdisc at that rate on both ends (needs root).
Each rank runs with OMP_NUM_THREADS=1 and torch.set_num_threads(1).

Output, in --outdir/<timestamp>/ (or the --resume directory): rounds/*.json
(every round's raw result, written as soon as it is done), logs/ (each rank's
output), summary.json and report.txt (the printed report, with the exact
command line), both rewritten after every setting. It deletes the namespaces
it created on exit (also on failure and on SIGINT/SIGTERM/SIGHUP) and kills
only the rank processes it started.

    sudo /usr/bin/python3 perf/bench_ddp_hook.py --models transformer \\
        --links loopback,300mbit,1gbit --rounds 5
"""
import argparse
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

import results as result_summary  # perf/results.py: the results convention
from toolkit import median_ci  # perf/toolkit.py (bench_trust, bench_ddp_scaling: via here)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "perf", "ddp_hook_worker.py")
PYTHON = "/usr/bin/python3"  # Debian's Python, which sees python3-torch
TORCHVISION_INSTALL = "apt-get install python3-torchvision"

CELLS = ("ddp25", "ddp1", "ddp5", "ddp100", "fusebox", "nocomm")
CAPS = ("ddp1", "ddp5", "ddp25", "ddp100")
REDUCING = CAPS + ("fusebox",)  # nocomm reduces nothing: its losses are its own
MODELS = ("transformer", "transformer7m", "gpt2small", "cnn", "resnet50")
LMS = ("transformer", "transformer7m", "gpt2small")
NS = ("fbbenchA", "fbbenchB")
DEV = ("fbvethA", "fbvethB")
ADDR = ("10.231.77.1", "10.231.77.2")
NS_PORT = 29731  # MASTER_PORT inside the namespaces (plus the round number)
RATE = re.compile(r"^[0-9]+(\.[0-9]+)?[kmg]?bit$")
NOISE_RULE = ("fusebox's median > ddp25's median and fusebox's first quartile > ddp25's "
              "third quartile (over the measured steps of that round)")


# ---------------------------------------------------------------- statistics

PHASES = ("forward", "backward", "optimizer")


def describe(values):
    """{'median', 'ci': [low, high], 'coverage'} of a list of per-round figures."""
    low, high, cov = median_ci(values)
    return {"median": statistics.median(values), "ci": [low, high], "coverage": cov}


def analyze(rounds):
    """The across-round figures of one setting from its rounds' worker results."""
    cells = {}
    cells_here = [c for c in CELLS if all(c in r["cells"] for r in rounds)]  # older runs: no nocomm
    per_round = {c: [r["cells"][c]["median_ms"] for r in rounds] for c in cells_here}
    best_cap = [min(r["cells"][c]["median_ms"] for c in CAPS) for r in rounds]
    for c in cells_here:
        ms = per_round[c]
        cells[c] = {
            "per_round_ms": ms,
            "ms": describe(ms),
            # Paired within each round: the median over blocks of this cell's
            # step / ddp25's step of the same block.
            "ratio_vs_ddp25": describe([r["cells"][c]["paired_ratio_vs_ddp25"] for r in rounds]),
            "ratio_vs_best_cap": describe([a / b for a, b in zip(ms, best_cap)]),
            # Where the step's time goes: medians over rounds of each phase.
            "phases_ms": {ph: statistics.median(r["cells"][c]["phases_ms"][ph] for r in rounds)
                          for ph in PHASES},
        }
    fb = [r["cells"]["fusebox"] for r in rounds]
    d25 = [r["cells"]["ddp25"] for r in rounds]
    slower = [i + 1 for i, (f, d) in enumerate(zip(fb, d25))
              if f["median_ms"] > d["median_ms"] and f["q1_ms"] > d["q3_ms"]]
    fusebox = {
        "speedup_vs_ddp25": describe([1 / r["cells"]["fusebox"]["paired_ratio_vs_ddp25"]
                                      for r in rounds]),
        "speedup_vs_best_cap": describe([b / f for b, f in zip(best_cap, per_round["fusebox"])]),
        "best_cap_per_round": [min(CAPS, key=lambda c: r["cells"][c]["median_ms"])
                               for r in rounds],
        "tuning_iterations": [f["tuning_iterations"] for f in fb],
        "tuning_cost_ms": [f["tuning_cost_ms"] for f in fb],
        "steps_to_tuned": [f["steps_to_tuned"] for f in fb],
        "chosen": [{"plan": f["plan"], "buckets": f["buckets"], "cache_hit": f["cache_hit"],
                    "decision": f["decision"]} for f in fb],
        "rounds_not_tuned_within_budget": [i + 1 for i, f in enumerate(fb)
                                           if not f["tuning_finished"]],
        "rounds_slower_than_ddp25_beyond_noise": slower,
        "noise_rule": NOISE_RULE,
    }
    checks = {
        "all_final_losses_finite": all(r["cells"][c]["loss_finite"] for r in rounds
                                       for c in cells_here),
        "max_loss_diff_vs_ddp25": max(r["cells"][c]["loss_max_abs_diff_vs_ddp25"]
                                      for r in rounds for c in REDUCING),
    }
    if all("nocomm" in r["cells"] for r in rounds):
        # The headroom, per round: what no bucketing can beat, and how much of
        # ddp25's exposed communication (its step minus nocomm's) a cell removed.
        # Rounds where ddp25 exposed nothing (nocomm as slow) have no share to give.
        def ms(r, c):
            return r["cells"][c]["median_ms"]
        exposing = [r for r in rounds if ms(r, "ddp25") > ms(r, "nocomm")]
        fusebox["headroom_vs_ddp25"] = describe([ms(r, "ddp25") / ms(r, "nocomm")
                                                 for r in rounds])
        fusebox["rounds_with_exposed_communication"] = len(exposing)
        if exposing:
            fusebox["exposed_removed"] = describe(
                [(ms(r, "ddp25") - ms(r, "fusebox")) / (ms(r, "ddp25") - ms(r, "nocomm"))
                 for r in exposing])
            fusebox["exposed_removed_by_best_cap"] = describe(
                [(ms(r, "ddp25") - min(ms(r, c) for c in CAPS)) /
                 (ms(r, "ddp25") - ms(r, "nocomm")) for r in exposing])
    return {"rounds": len(rounds), "cells": cells, "fusebox": fusebox, "checks": checks}


def format_setting(setting, result, args):
    """The report section of one setting (a markdown table and summary lines)."""
    def ci(d, fmt):
        return ("[" + fmt + ", " + fmt + "]") % tuple(d["ci"])

    n = result["rounds"]
    cov = result["cells"]["ddp25"]["ms"]["coverage"]
    lines = [
        "## %s" % setting,
        "%d rounds; per round: fusebox tunes from an empty cache (at most %d steps), then %d "
        "blocks of one step of every cell in a random order, the last %d measured; a cell's "
        "figure is the median of the slowest rank's measured steps" % (
            n, args.tune_steps, args.steps, args.measure),
        "intervals: order-statistic CI of the median over rounds, %.1f%% coverage" % (100 * cov),
        "x ddp25: the median over blocks of cell step / ddp25 step in the same block (paired; "
        "lower is faster); x best cap: cell ms / the fastest of %s in that round, chosen in "
        "hindsight" % "/".join(CAPS),
        "",
        "| cell | median ms | CI ms | x ddp25 | CI | x best cap | CI |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in result["cells"]:
        r = result["cells"][c]
        lines.append("| %s | %.1f | %s | %.3f | %s | %.3f | %s |" % (
            c, r["ms"]["median"], ci(r["ms"], "%.1f"),
            r["ratio_vs_ddp25"]["median"], ci(r["ratio_vs_ddp25"], "%.3f"),
            r["ratio_vs_best_cap"]["median"], ci(r["ratio_vs_best_cap"], "%.3f")))
    lines += [
        "",
        "where a step's time goes (ms; medians over rounds of each phase's median; forward "
        "includes zero_grad and the hook's step start, backward DDP's wait for its buckets):",
        "",
        "| cell | forward | backward | optimizer |",
        "|---|---|---|---|",
    ]
    for c in result["cells"]:
        ph = result["cells"][c]["phases_ms"]
        lines.append("| %s | %.1f | %.1f | %.1f |" % (c, ph["forward"], ph["backward"],
                                                    ph["optimizer"]))
    fb = result["fusebox"]
    tuning = fb["tuning_iterations"]
    cost = fb["tuning_cost_ms"]
    lines += [
        "",
        "fusebox speedup (reference ms / fusebox ms, higher is faster): vs ddp25 %.3fx %s, "
        "vs best cap %.3fx %s" % (
            fb["speedup_vs_ddp25"]["median"], ci(fb["speedup_vs_ddp25"], "%.3f"),
            fb["speedup_vs_best_cap"]["median"], ci(fb["speedup_vs_best_cap"], "%.3f")),
        "fusebox tuning: iterations median %g, max %d; cost ms median %.0f, max %.0f; "
        "rounds not tuned within %d steps: %s" % (
            statistics.median(tuning), max(tuning), statistics.median(cost), max(cost),
            args.tune_steps, ", ".join(map(str, fb["rounds_not_tuned_within_budget"])) or "none"),
        "best cap per round: %s" % ", ".join(fb["best_cap_per_round"]),
    ]
    if "headroom_vs_ddp25" in fb:
        def pct(d):
            return "%.0f%% [%.0f%%, %.0f%%]" % (100 * d["median"], 100 * d["ci"][0],
                                              100 * d["ci"][1])
        lines.append(
            "headroom (nocomm, no allreduce at all): ddp25 / nocomm %.3fx %s is the most any "
            "bucketing could gain here" % (fb["headroom_vs_ddp25"]["median"],
                                           ci(fb["headroom_vs_ddp25"], "%.3f")))
        if "exposed_removed" in fb:
            lines.append(
                "share of ddp25's exposed communication (ddp25 - nocomm) removed, over the %d "
                "rounds where ddp25 exposed any: fusebox %s, best cap %s" % (
                    fb["rounds_with_exposed_communication"], pct(fb["exposed_removed"]),
                    pct(fb["exposed_removed_by_best_cap"])))
    lines += [
        "rounds where fusebox kept a plan slower than ddp25 beyond that round's noise: "
        "%d of %d%s (rule: %s)" % (
            len(fb["rounds_slower_than_ddp25_beyond_noise"]), n,
            (" (rounds %s)" % ", ".join(map(str, fb["rounds_slower_than_ddp25_beyond_noise"]))
             if fb["rounds_slower_than_ddp25_beyond_noise"] else ""), fb["noise_rule"]),
        "checks: final losses finite in every cell: %s; largest |loss - ddp25 loss| over the "
        "measured blocks (every reducing cell starts from the same state and sees the same "
        "batches): "
        "%g" % (
            "yes" if result["checks"]["all_final_losses_finite"] else "NO",
            result["checks"]["max_loss_diff_vs_ddp25"]),
        "fusebox chose, per round:",
    ]
    for i, c in enumerate(fb["chosen"]):
        lines.append("  round %d: %s (%s buckets%s), %d tuning iterations, tuned after %s "
                     "steps: %s" % (
                         i + 1, c["plan"], c["buckets"], ", cache hit" if c["cache_hit"] else "",
                         tuning[i], fb["steps_to_tuned"][i], c["decision"]))
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------- network setup

def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def namespaces_present():
    listed = sh("ip", "netns", "list", check=False).stdout.split()
    return [ns for ns in NS if ns in listed]


def teardown():
    """Deletes the namespaces (and with them the veth pair)."""
    for ns in NS:
        sh("ip", "netns", "del", ns, check=False)


def setup(rate):
    """Two namespaces joined by a veth pair, each end's egress shaped to `rate`."""
    for ns in NS:
        sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", DEV[0], "netns", NS[0], "type", "veth", "peer", "name", DEV[1],
       "netns", NS[1])
    for ns, dev, addr in zip(NS, DEV, ADDR):
        sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
           rate, "burst", "256kb", "latency", "50ms")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ rounds

def launch_env(build, link, world, ns_port):
    """The environment every rank of one launch shares: torchrun's variables
    for `world` ranks, fusebox.torch from `build`, one thread; on a shaped
    link one "host" per namespace, rank 0's on `ns_port`."""
    env = dict(os.environ, WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(os.path.abspath(build), "python"))
    if link == "loopback":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   GLOO_SOCKET_IFNAME="lo", LOCAL_WORLD_SIZE=str(world))
    else:
        env.update(MASTER_ADDR=ADDR[0], MASTER_PORT=str(ns_port),
                   LOCAL_WORLD_SIZE="1", LOCAL_RANK="0")
    return env


def place_rank(env, cmd, link, rank):
    """One rank's environment and command: its RANK, and on a shaped link its
    namespace and interface."""
    rank_env = dict(env, RANK=str(rank))
    if link == "loopback":
        rank_env["LOCAL_RANK"] = str(rank)
        return rank_env, cmd
    rank_env["GLOO_SOCKET_IFNAME"] = DEV[rank]
    return rank_env, ["ip", "netns", "exec", NS[rank]] + cmd


class RankProcesses:
    """The ranks of one launch at a time, kept track of so that only they are
    killed when anything goes wrong (each in a session of its own)."""

    def __init__(self, timeout_s, poll_s):
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.procs = []

    def start(self, cmd, env, stdout, stderr):
        self.procs.append(subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr,
                                           start_new_session=True))

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs = []

    def wait(self, what, logs):
        """Waits for every rank; fails at once when one fails or the launch
        takes longer than the timeout, with the tails of `logs`."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            codes = [p.poll() for p in self.procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed or time.monotonic() > deadline:
                why = ("rank %d exited with %d" % failed[0] if failed
                       else "timed out after %d s" % self.timeout_s)
                raise RuntimeError("%s: %s\n%s" % (what, why, log_tails(logs)))
            if all(c == 0 for c in codes):
                return
            time.sleep(self.poll_s)


class Rounds(RankProcesses):
    """Starts the ranks of each round (RankProcesses)."""

    def __init__(self, args, outdir):
        super().__init__(args.timeout, 0.5)
        self.args = args
        self.outdir = outdir

    def run(self, model, link, number, order):
        """Runs one round; returns the worker's JSON with the round's metadata."""
        args = self.args
        tag = "%s-%s-r%d" % (model, link, number)
        out = os.path.join(self.outdir, "rounds", tag + ".json")
        batch = args.batch_transformer if model in LMS else args.batch_cnn
        cache = tempfile.mkdtemp(prefix="fusebox-ddp-cache.")  # fresh: tuning from scratch
        partial = out + ".partial"
        env = launch_env(args.build, link, args.ranks, NS_PORT + number)
        cmd = [args.python, WORKER, "--out", partial, "--model", model,
               "--order", ",".join(order),
               "--steps", str(args.steps), "--tune_steps", str(args.tune_steps),
               "--measure", str(args.measure), "--batch", str(batch),
               "--cache", cache, "--threads", "1", "--device", args.device,
               "--image", str(args.image)]
        logs = []
        try:
            for rank in range(args.ranks):
                rank_env, rank_cmd = place_rank(env, cmd, link, rank)
                log = os.path.join(self.outdir, "logs", "%s-rank%d.log" % (tag, rank))
                logs.append(log)
                with open(log, "w") as f:
                    self.start(rank_cmd, rank_env, f, subprocess.STDOUT)
            self.wait(tag, logs)
        finally:
            self.kill()
            shutil.rmtree(cache, ignore_errors=True)
        with open(partial) as f:
            result = json.load(f)
        result["round"] = {"model": model, "link": link, "number": number, "order": order,
                           "batch": batch, "params": round_params(args)}
        with open(out, "w") as f:
            json.dump(result, f)
        os.remove(partial)
        return result



def log_tails(logs, lines=15):
    parts = []
    for log in logs:
        with open(log, errors="replace") as f:
            parts.append("--- %s (last %d lines)\n%s" % (
                log, lines, "".join(f.readlines()[-lines:])))
    return "\n".join(parts)


def round_params(args):
    """What a stored round must match to be reused by --resume."""
    return {"steps": args.steps, "measure": args.measure, "tune_steps": args.tune_steps,
            "batch_transformer": args.batch_transformer, "batch_cnn": args.batch_cnn,
            "device": args.device, "ranks": args.ranks, "image": args.image}


def load_round(path, args):
    """A round stored by an earlier run with the same parameters, or None."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        result = json.load(f)
    if result["round"]["params"] != round_params(args):
        sys.exit("bench_ddp_hook: %s was run with %s, not %s: resume with the same flags or "
                 "into a new directory" % (path, result["round"]["params"], round_params(args)))
    return result


def cell_order(setting, number):
    """This round's cell order: shuffled with a seed fixed by setting and round
    (crc32, not hash(), so that it is the same in every run)."""
    order = list(CELLS)
    random.Random(number + zlib.crc32(setting.encode())).shuffle(order)
    return order


# -------------------------------------------------------------------- main

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="transformer,cnn",
                    help="models, comma separated, from: %s (default: %%(default)s)"
                         % ", ".join(MODELS))
    ap.add_argument("--links", default="loopback,300mbit,1gbit",
                    help="links, comma separated: loopback, or a tc rate such as 300mbit or "
                         "1gbit (namespaces, needs root) (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds per setting, each with all six cells in a fresh order and "
                         "fresh ranks (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=10,
                    help="blocks per round, side by side: one step of every cell each, in a "
                         "fresh random order (default: %(default)s)")
    ap.add_argument("--measure", type=int, default=8,
                    help="measured blocks: the last of --steps; the first are warm-up "
                         "(default: %(default)s)")
    ap.add_argument("--tune_steps", type=int, default=70,
                    help="most steps fusebox may take to tune, before the blocks; a round "
                         "that does not finish tuning in time is reported (default: "
                         "%(default)s)")
    ap.add_argument("--batch-transformer", dest="batch_transformer", type=int, default=4,
                    help="transformer and transformer7m samples per rank per step (default: "
                         "%(default)s)")
    ap.add_argument("--batch-cnn", dest="batch_cnn", type=int, default=32,
                    help="cnn samples per rank per step (default: %(default)s)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"),
                    help="the build directory; its python/ holds fusebox.torch "
                         "(default: the repository's build/)")
    ap.add_argument("--outdir", default=os.path.join(REPO, "build", "bench-out", "ddp-hook"),
                    help="results go into OUTDIR/<timestamp>/ (default: build/bench-out/ddp-hook); "
                         "result.json there is the run's summary for a results page")
    ap.add_argument("--resume", metavar="DIR",
                    help="write into DIR, an earlier run's output directory, instead, reusing "
                         "its finished rounds (they must have been run with the same --steps, "
                         "--measure, --tune_steps and batches); report.txt and summary.json "
                         "are rewritten for the settings of this invocation")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where the ranks' models live: cpu, or cuda (ranks share the GPUs "
                         "visible, LOCAL_RANK modulo their number; DDP reduces over gloo, "
                         "fusebox on its native path) (default: %(default)s)")
    ap.add_argument("--ranks", type=int, default=2,
                    help="ranks per round; more than 2 on loopback only (default: %(default)s)")
    ap.add_argument("--image", type=int, default=32,
                    help="cnn and resnet50: image side in pixels (default: %(default)s)")
    ap.add_argument("--python", default=PYTHON,
                    help="the Python with torch that runs the ranks (default: %(default)s; on "
                         "the GPU machines /opt/torch/.venv/bin/python)")
    ap.add_argument("--timeout", type=int, default=3600,
                    help="seconds one round may take before the run fails (default: "
                         "%(default)s)")
    args = ap.parse_args()
    args.models = args.models.split(",")
    args.links = args.links.split(",")
    for m in args.models:
        if m not in MODELS:
            ap.error("unknown model %r (choose from %s)" % (m, ", ".join(MODELS)))
    for link in args.links:
        if link != "loopback" and not RATE.match(link):
            ap.error("link %r is neither 'loopback' nor a tc rate like 300mbit" % link)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.ranks < 2 or (args.ranks != 2 and args.links != ["loopback"]):
        ap.error("--ranks must be at least 2, and exactly 2 over a shaped link (one rank per "
                 "namespace)")
    if args.image < 8:
        ap.error("--image must be at least 8")
    if not 2 <= args.measure <= args.steps or args.tune_steps < 1:
        ap.error("need 2 <= --measure <= --steps and --tune_steps >= 1")
    return args


def preflight(args):
    """Fails at once, with what to do, when the run could not finish."""
    if any(link != "loopback" for link in args.links):
        if os.geteuid() != 0:
            sys.exit("bench_ddp_hook: shaped links need root (ip netns, tc); run it with "
                     "sudo, or use --links loopback")
        present = namespaces_present()
        if present:
            sys.exit("bench_ddp_hook: network namespace(s) %s exist already (another run, or "
                     "one that was killed): delete them with 'ip netns del NAME' if they are "
                     "not in use" % ", ".join(present))
    if {"cnn", "resnet50"} & set(args.models) and subprocess.run(
            [args.python, "-c", "import torchvision"], capture_output=True).returncode != 0:
        sys.exit("bench_ddp_hook: the cnn and resnet50 models need torchvision: %s"
                 % TORCHVISION_INSTALL)
    if args.device == "cuda" and subprocess.run(
            [args.python, "-c", "import sys, torch; sys.exit(not torch.cuda.is_available())"],
            capture_output=True).returncode != 0:
        sys.exit("bench_ddp_hook: --device cuda, but %s's torch sees no GPU" % args.python)
    check = subprocess.run([args.python, "-c", "import fusebox.torch"], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=os.path.join(
                               os.path.abspath(args.build), "python")))
    if check.returncode != 0:
        sys.exit("bench_ddp_hook: cannot import fusebox.torch from %s/python (build it: bash "
                 "scripts/build.sh):\n%s" % (args.build, check.stderr.strip()))


def exit_on_signal(signum, frame):
    """SIGTERM/SIGHUP: unwind, so that the ranks are killed and the namespaces deleted."""
    print("bench_ddp_hook: %s: stopping (finished rounds are kept)" % signal.Signals(signum).name,
          file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def main():
    args = parse_args()
    preflight(args)
    command = shlex.join([sys.executable] + sys.argv)
    outdir = args.resume or os.path.join(args.outdir, time.strftime("%Y%m%d-%H%M%S"))
    for sub in ("rounds", "logs"):
        os.makedirs(os.path.join(outdir, sub), exist_ok=True)
    header = "# %s\n# started %s on %s (%d CPUs); ranks: %s %s\n\n" % (
        command, time.strftime("%Y-%m-%d %H:%M:%S"), socket.gethostname(), os.cpu_count(),
        args.python, os.path.relpath(WORKER, REPO))
    print(header, end="", flush=True)
    summary = {"command": command, "args": vars(args), "settings": {}}
    report = header
    rounds = Rounds(args, outdir)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, exit_on_signal)
    try:
        for model in args.models:
            for link in args.links:
                setting = "%s/%s" % (model, link)
                try:
                    if link != "loopback":
                        setup(link)
                    results = []
                    for number in range(1, args.rounds + 1):
                        path = os.path.join(outdir, "rounds", "%s-%s-r%d.json"
                                            % (model, link, number))
                        result = load_round(path, args)
                        how = "reused"
                        if result is None:
                            result = rounds.run(model, link, number, cell_order(setting, number))
                            how = "done"
                        results.append(result)
                        print("# %s round %d %s: %s" % (setting, number, how, ", ".join(
                            "%s %.1f ms" % (c, result["cells"][c]["median_ms"])
                            for c in result["round"]["order"])), flush=True)
                finally:
                    if link != "loopback":
                        teardown()
                result = analyze(results)
                section = format_setting(setting, result, args)
                print("\n" + section, flush=True)
                report += section + "\n"
                summary["settings"][setting] = result
                with open(os.path.join(outdir, "summary.json"), "w") as f:
                    json.dump(summary, f, indent=1)
                with open(os.path.join(outdir, "report.txt"), "w") as f:
                    f.write(report)
                result_summary.write_run_summary(outdir, report, "bench_ddp_hook", command,
                                                 "real DDP with and without fusebox")
    except RuntimeError as e:
        sys.exit("bench_ddp_hook: %s" % e)
    except KeyboardInterrupt:
        sys.exit("bench_ddp_hook: interrupted (finished rounds are in %s)" % outdir)
    finally:
        rounds.kill()
    print("# written to %s" % outdir)


if __name__ == "__main__":
    main()
