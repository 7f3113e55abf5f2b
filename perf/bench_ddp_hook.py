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
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib

import results as result_summary  # perf/results.py: the results convention
from netns import (  # perf/netns.py: namespaces, shaped links, rank processes
    NS_PORT, PYTHON, RATE, RankProcesses, launch_env, namespaces_present, place_rank, setup,
    teardown)
from ddp_hook_report import CELLS, analyze, format_setting  # perf/ddp_hook_report.py

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "perf", "ddp_hook_worker.py")
TORCHVISION_INSTALL = "apt-get install python3-torchvision"

MODELS = ("transformer", "transformer7m", "gpt2small", "cnn", "resnet50")
LMS = ("transformer", "transformer7m", "gpt2small")


# ------------------------------------------------------------------ rounds

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
