#!/usr/bin/env python3
"""One rank of perf/bench_ddp_scaling.py: every cell (bucket plan) of one launch, in turn.

    COMPUTE IS EMULATED DEVICE TIME (perf/devtime.py: the host sleeps);
    COMMUNICATION IS REAL (DDP's allreduce over gloo, between network namespaces).

Started by the driver inside one emulated host (a network namespace) with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT and GLOO_SOCKET_IFNAME set. One process
group serves every cell, so torch and the group start once per launch. For each
cell of --cells, in the order given (the driver shuffles it per repeat), the rank
builds a fresh DeviceTimeModel.from_profile(--profile, --compute-scale,
--param-scale, seed 0) (the same weights for every cell) and a fresh
DistributedDataParallel over it:

    ddp25         DDP's default buckets (bucket_cap_mb=25)
    cap<N>        bucket_cap_mb=N (cap1, cap5, cap100)
    pytorch       bucket_cap_mb=--pytorch-cap (the driver computes it from
                  PyTorch's pre-bucketing rule)
    fusebox       DDP's default + fusebox.torch.register(ddp, cache_dir=
                  --cold-cache, seed=...): tuned from an empty policy cache
    fusebox_warm  the same with cache_dir=--warm-cache, which holds entries of
                  other cluster sizes only (the nearest seeds the search)
    noallreduce   DDP with a communication hook that returns each bucket
                  unreduced, as a completed future: no allreduce at all
    from<N>       DDP's default + fusebox.torch.register(ddp, plan=FILE,
                  cache_dir=False): the plan fusebox tuned at N hosts (--plans
                  from<N>=FILE, a plan file), run here untuned: the cross-size
                  matrix

Then --warmup untimed steps (fusebox and from<N> cells first run until the
hook's phase is no longer learning/profiling/screening/verifying, at most
--tune-steps steps, timed and reported apart, and fusebox cells then need no
warm-up: their plan ran while it was verified; the ranks agree on the end of tuning with one
1-element MIN allreduce after each tuning step), then --steps timed steps.

Timing: time.perf_counter() at the start of every step (before zero_grad) and
after the last step; a step's time is from its start to the next step's start
(the last: to the end). After the timed span (outside it) the ranks exchange
their stamps and CPU times; the driver keeps per step the slowest rank's time.
Rank 0 also reads /proc/stat (the whole machine, every core) at both ends of
each timed span.

Rank 0 writes --out (JSON): {"world_size", "order", "cells": {cell: {
"step_ms" (per step, max over ranks), "rank_step_ms", "tuning_step_ms",
"tuning_finished", "cpu_busy" (machine, fraction of all cores busy),
"rank_cpu_cores" (sum over ranks of process CPU seconds / wall seconds),
"span_s", "setup_s", "final_loss", "fusebox": snapshot fields or null}},
"model": profile_summary()}. Logs go to stderr.
"""
import argparse
import gc
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from devtime import DeviceTimeModel  # noqa: E402

FIXED_CAPS = {"ddp25": 25.0, "cap1": 1.0, "cap5": 5.0, "cap100": 100.0}
FUSEBOX_CELLS = ("fusebox", "fusebox_warm")
CELLS = tuple(FIXED_CAPS) + ("pytorch",) + FUSEBOX_CELLS + ("noallreduce",)
TUNING_PHASES = ("learning", "profiling", "screening", "verifying")
SNAPSHOT_FIELDS = ("phase", "decision", "tuning_iterations", "tuning_cost_ms", "seed",
                   "fallbacks", "cache_hit", "plan_installs", "iterations")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", required=True, help="comma separated, in the order to run")
    ap.add_argument("--profile", default="resnet50")
    ap.add_argument("--compute-scale", type=float, required=True)
    ap.add_argument("--param-scale", type=float, required=True)
    ap.add_argument("--steps", type=int, required=True, help="timed steps per cell")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before a fixed plan's")
    ap.add_argument("--tune-steps", type=int, default=90,
                    help="most steps a fusebox cell may take to finish tuning")
    ap.add_argument("--pytorch-cap", type=float, default=50.0, help="the pytorch cell's MiB")
    ap.add_argument("--cold-cache", default=None, help="fusebox's policy cache (empty)")
    ap.add_argument("--warm-cache", default=None, help="fusebox_warm's policy cache")
    ap.add_argument("--seed", type=int, default=1, help="fusebox's tuner seed (fusebox_warm: +1)")
    ap.add_argument("--plans", default="",
                    help="from<N>=plan file,...: the plans of the from<N> cells")
    ap.add_argument("--out", required=True, help="rank 0's JSON result")
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args(argv)
    args.cells = args.cells.split(",")
    try:
        args.plans = dict(p.split("=", 1) for p in args.plans.split(",") if p)
    except ValueError:
        ap.error("--plans is from<N>=FILE,...")
    for c in args.cells:
        if c not in CELLS and c not in args.plans:
            ap.error("unknown cell %r (known: %s, and the from<N> of --plans)"
                     % (c, ", ".join(CELLS)))
    if args.steps < 1 or args.warmup < 0 or args.tune_steps < 1:
        ap.error("need --steps >= 1, --warmup >= 0, --tune-steps >= 1")
    return args


def machine_cpu():
    """(busy, total) jiffies of the whole machine from /proc/stat's cpu line."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
    total = sum(fields[:8])                                     # without guest time
    return total - idle, total


def _no_allreduce(state, bucket):
    """A DDP comm hook that reduces nothing: the bucket's own gradient, done."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def build(cell, args, seed):
    """The cell's model, DDP and fusebox handle (or None)."""
    model = DeviceTimeModel.from_profile(args.profile, compute_scale=args.compute_scale,
                                         param_scale=args.param_scale, seed=0)
    if cell in FIXED_CAPS:
        ddp = DDP(model, bucket_cap_mb=FIXED_CAPS[cell])
    elif cell == "pytorch":
        ddp = DDP(model, bucket_cap_mb=args.pytorch_cap)
    else:
        ddp = DDP(model)   # DDP's default: fusebox's baseline, noallreduce's buckets
    handle = None
    if cell == "noallreduce":
        ddp.register_comm_hook(None, _no_allreduce)
    elif cell in args.plans:
        import fusebox.torch
        handle = fusebox.torch.register(ddp, cache_dir=False, plan=args.plans[cell])
    elif cell in FUSEBOX_CELLS:
        import fusebox.torch
        cache = args.cold_cache if cell == "fusebox" else args.warm_cache
        if not cache:
            raise SystemExit("scaling_worker: cell %s needs its cache directory" % cell)
        handle = fusebox.torch.register(ddp, cache_dir=cache, seed=seed)
    return model, ddp, handle


def one_step(model, ddp, opt, rank, step):
    opt.zero_grad(set_to_none=True)
    loss = model.loss(ddp(model.make_batch(rank, step)))
    loss.backward()   # DDP waits here for its buckets' allreduces
    opt.step()
    return loss


def tuning_done(handle):
    """Whether every rank's hook has left the tuning phases (one MIN allreduce)."""
    done = handle.snapshot().get("phase") not in TUNING_PHASES
    flag = torch.tensor([1.0 if done else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return flag.item() > 0.5


def run_cell(cell, args, rank, step0):
    """Runs one cell; returns (this rank's record, steps used)."""
    seed = args.seed + FUSEBOX_CELLS.index(cell) if cell in FUSEBOX_CELLS else args.seed
    t_setup = time.perf_counter()
    model, ddp, handle = build(cell, args, seed)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    setup_s = time.perf_counter() - t_setup
    dist.barrier()
    step = step0
    tuning, finished = [], handle is None
    if handle is not None:
        while len(tuning) < args.tune_steps:
            t0 = time.perf_counter()
            one_step(model, ddp, opt, rank, step)
            tuning.append(time.perf_counter() - t0)
            step += 1
            if tuning_done(handle):
                finished = True
                break
    if handle is None or cell in args.plans:  # a fixed plan's first steps pay for buffers
        for _ in range(args.warmup):
            one_step(model, ddp, opt, rank, step)
            step += 1
    dist.barrier()
    cpu0, proc0 = machine_cpu(), time.process_time()
    starts = []
    for _ in range(args.steps):
        starts.append(time.perf_counter())
        loss = one_step(model, ddp, opt, rank, step)
        step += 1
    end = time.perf_counter()
    cpu1, proc1 = machine_cpu(), time.process_time()
    rec = {"starts": starts, "end": end, "tuning": tuning, "finished": finished,
           "proc_s": proc1 - proc0, "setup_s": setup_s, "loss": loss.item(),
           "cpu": [cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]]}
    if handle is not None:
        snap = handle.snapshot()
        rec["fusebox"] = {k: snap.get(k) for k in SNAPSHOT_FIELDS}
        plan = snap.get("plan")
        rec["fusebox"]["plan"] = plan["name"] if plan else None
        rec["fusebox"]["buckets"] = len(plan["bucket_elements"]) if plan else None
        # The simulator beside the cells: every plan the tuner measured, with
        # its prediction under the cost model fitted in this launch (forward
        # start to the end of communication), and the step's tail after it
        # (optimizer, host work; plan-independent) over the timed steps.
        rec["fusebox"]["measured"] = [
            {k: m.get(k) for k in ("name", "predicted_ms", "measured_ms", "buckets")}
            for m in snap.get("measured") or []]
        stats = (snap.get("stats") or [])[-args.steps:]
        tails = sorted(s["iteration_ms"] - s["backward_ms"] - s["exposed_ms"] for s in stats
                       if s.get("iteration_ms") and s.get("backward_ms") is not None)
        rec["fusebox"]["tail_ms"] = tails[len(tails) // 2] if tails else None
    del ddp, handle, opt, model
    gc.collect()   # frees the hook's group and threads while the process group lives
    return rec, step


def merge(cell, recs, world):
    """One cell's figures from every rank's record (rank order)."""
    rank_step_ms = [[(b - a) * 1e3 for a, b in zip(r["starts"], r["starts"][1:] + [r["end"]])]
                    for r in recs]
    spans = [r["end"] - r["starts"][0] for r in recs]
    r0 = recs[0]
    tuning = [max(col) * 1e3 for col in zip(*[r["tuning"] for r in recs])]
    return {
        "step_ms": [max(col) for col in zip(*rank_step_ms)],
        "rank_step_ms": rank_step_ms,
        "tuning_step_ms": tuning,
        "tuning_finished": all(r["finished"] for r in recs),
        "cpu_busy": r0["cpu"][0] / r0["cpu"][1] if r0["cpu"][1] else None,
        "rank_cpu_cores": sum(r["proc_s"] for r in recs) / max(spans),
        "span_s": max(spans),
        "setup_s": max(r["setup_s"] for r in recs),
        "final_loss": r0["loss"],
        "fusebox": r0.get("fusebox"),
        "world_size": world,
    }


def main():
    args = parse_args()
    if any(c in FUSEBOX_CELLS or c in args.plans for c in args.cells):
        import fusebox.torch  # noqa: F401  (fail before joining the group)
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    out = {"world_size": world, "order": args.cells, "cells": {}, "torch": torch.__version__}
    step = 0
    for cell in args.cells:
        rec, step = run_cell(cell, args, rank, step)
        recs = [None] * world
        dist.all_gather_object(recs, rec)   # outside the timed span
        if rank == 0:
            out["cells"][cell] = merge(cell, recs, world)
            print("scaling_worker: %s done, median %.1f ms" % (
                cell, sorted(out["cells"][cell]["step_ms"])[args.steps // 2]),
                file=sys.stderr, flush=True)
    if rank == 0:
        out["model"] = DeviceTimeModel.from_profile(
            args.profile, compute_scale=args.compute_scale,
            param_scale=args.param_scale).profile_summary()
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, args.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
