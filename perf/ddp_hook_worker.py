"""One rank of perf/bench_ddp_hook.py (run inside its network namespace).

Measures, on this rank: the model's iteration time without communication;
then plain DDP (default 25 MiB buckets) and DDP with the fusebox hook
(0.25 MiB DDP buckets, fusebox decides), each for the same number of steps
from the same weights and data; and compares the parameters at the end.
Writes one JSON line (rank 0: the slowest rank's figures) to argv[1].

argv: out steps measure batch cache_dir bucket_view(0|1)
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP

import fusebox.torch


def make_model():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)


def batch(rank, step, size):
    g = torch.Generator().manual_seed(7919 * step + 31 * rank + 1)
    return torch.randn(size, 3, 32, 32, generator=g), torch.randint(0, 10, (size,), generator=g)


def run(model, rank, steps, size):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    times, phases = [], []
    for step in range(steps):
        x, y = batch(rank, step, size)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        times.append((t3 - t0) * 1e3)
        phases.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))
    run.phases = phases
    return times


def slowest(values):
    """Per-step maximum over ranks."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def main():
    out, steps, measure, size, cache = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(
        sys.argv[4]), sys.argv[5]
    view = sys.argv[6] == "1"  # DDP's gradient_as_bucket_view, for both models
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    compute = run(make_model(), rank, measure + 2, size)[2:]
    phases = {"compute": run.phases[2:]}
    dist.init_process_group("gloo")
    compute = slowest(compute)
    # One allreduce of every gradient at once, on the link: the communication
    # there is to hide.
    flat = torch.zeros(sum(p.numel() for p in make_model().parameters()))
    allreduce = []
    for _ in range(4):
        t0 = time.perf_counter()
        dist.all_reduce(flat)
        allreduce.append((time.perf_counter() - t0) * 1e3)
    allreduce = slowest(allreduce[1:])

    plain_model = DDP(make_model(), gradient_as_bucket_view=view)
    plain = slowest(run(plain_model, rank, steps, size))
    phases["ddp"] = run.phases[-measure:]

    fused_model = DDP(make_model(), bucket_cap_mb=0.25, gradient_as_bucket_view=view)
    handle = fusebox.torch.register(fused_model, cache_dir=cache, drift_window=0)
    fused = slowest(run(fused_model, rank, steps, size))
    phases["fusebox"] = run.phases[-measure:]
    snap = handle.snapshot()

    same = all(torch.equal(a, b) for a, b in zip(plain_model.parameters(), fused_model.parameters()))
    same_t = torch.tensor([1 if same else 0])
    dist.all_reduce(same_t, op=dist.ReduceOp.MIN)
    tuning = snap["passthrough_iterations"] + snap["tuning_iterations"]
    if rank == 0:
        with open(out, "w") as f:
            json.dump({
                "compute_ms": statistics.median(compute),
                "allreduce_all_ms": statistics.median(allreduce),
                "plain_ms": statistics.median(plain[-measure:]),
                "fused_ms": statistics.median(fused[-measure:]),
                "tuning_iterations": tuning,
                "tuning_mean_ms": statistics.mean(fused[:tuning]) if tuning else 0.0,
                "state": snap["phase"],
                "cache_hit": snap["cache_hit"],
                "plan": snap["plan"]["name"] if snap["plan"] else None,
                "buckets": len(snap["plan"]["bucket_elements"]) if snap["plan"] else 0,
                "ddp_buckets": len(snap["layout"]),
                "engine_ms": {k: statistics.median([s[k] for s in snap["stats"][-measure:]])
                              for k in ("iteration_ms", "backward_ms", "exposed_ms", "comm_ms",
                                        "copy_in_ms", "copy_back_ms")},
                "measured": snap["measured"],
                "params_equal": bool(same_t.item()),
                # rank 0's medians: forward, backward, optimizer step (ms)
                "phases_ms": {k: [round(statistics.median(p[i] for p in v), 1) for i in range(3)]
                              for k, v in phases.items()},
            }, f)
    dist.barrier()


if __name__ == "__main__":
    main()
