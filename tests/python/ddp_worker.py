"""One rank of the DDP hook tests: trains each scenario twice from the same
initial weights and data, once with plain DDP and once with the fusebox hook,
and writes what it saw to <out>/<scenario>.rank<r>.json.

Run with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set; argv[1] is a JSON
file: {"out": dir, "scenarios": [{...}, ...]}.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import fusebox.torch


class MLP(nn.Module):
    def __init__(self, hidden=64, unused=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, 10))
        # A parameter that never gets a gradient (find_unused_parameters).
        self.unused = nn.Linear(16, 16) if unused else None

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                                dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.layer(x).mean(dim=1))


def make_model(sc, rank):
    torch.manual_seed(1234)
    kind = sc["model"]
    if kind == "mlp":
        hidden = sc.get("hidden_by_rank", {}).get(str(rank), 64)
        return MLP(hidden=hidden, unused=sc.get("unused", False))
    if kind == "cnn":
        return CNN()
    if kind == "block":
        return Block()
    raise ValueError(kind)


def batch(sc, rank, step):
    g = torch.Generator().manual_seed(10007 * step + 101 * rank + 7)
    shape = {"mlp": (8, 32), "cnn": (4, 3, 8, 8), "block": (4, 6, 32)}[sc["model"]]
    return torch.randn(*shape, generator=g), torch.randint(0, 10, (shape[0],), generator=g)


def ddp_kwargs(sc, rank):
    cap = sc.get("cap_by_rank", {}).get(str(rank), sc.get("bucket_cap_mb", 25))
    # DDP's first bucket has its own cap (1 MiB by default; DDP's source
    # documents this attribute as the knob): small caps set both.
    dist._DEFAULT_FIRST_BUCKET_BYTES = min(1 << 20, int(cap * (1 << 20)))
    return dict(bucket_cap_mb=cap, gradient_as_bucket_view=sc.get("view", False),
                find_unused_parameters=sc.get("unused", False))


def train(sc, rank, hooked):
    model = DDP(make_model(sc, rank), **ddp_kwargs(sc, rank))
    handle = None
    if hooked:
        handle = fusebox.torch.register(model, cache_dir=sc["cache_dir"], candidates=1,
                                        communicator=sc.get("communicator", "ddp"),
                                        screening_blocks=1, verify_pairs=5, check_every=0,
                                        timeout_s=60)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    counts = []
    micro = sc.get("accumulate", 1)
    for step in range(sc["steps"]):
        opt.zero_grad(set_to_none=False)
        # Gradient accumulation: micro-batches under no_sync() (DDP reduces
        # nothing), then one that reduces the accumulated gradients.
        for m in range(micro - 1):
            x, y = batch(sc, rank, step * micro + m)
            with model.no_sync():
                loss_fn(model(x), y).backward()
        x, y = batch(sc, rank, step * micro + micro - 1)
        loss_fn(model(x), y).backward()
        opt.step()
        if handle is not None:
            if sc.get("communicator", "ddp") == "ddp":
                # DDP reduces: one allreduce per DDP bucket, in bucket order.
                counts.append([b.buffer().numel()
                               for b in model.reducer._get_zeros_like_grad_buckets()])
            else:
                counts.append(handle.last_allreduce_counts)
    params = [p.detach().clone() for p in model.parameters()]
    return params, handle, counts


def run(sc, rank, world, out):
    result = {"scenario": sc["name"], "rank": rank, "world": world}
    try:
        fused, handle, counts = train(sc, rank, hooked=True)
        snap = handle.snapshot()
        bitwise, rel = None, None
        if not sc.get("hook_only", False):
            plain, _, _ = train(sc, rank, hooked=False)
            bitwise = all(torch.equal(a, b) for a, b in zip(plain, fused))
            rel = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                      for a, b in zip(plain, fused))
        result.update(ok=True, bitwise=bitwise, max_rel=rel, phase=snap["phase"],
                      cache_hit=snap["cache_hit"], backend=snap["backend"], derived=snap["derived_from_cache"],
                      tuning_iterations=snap["tuning_iterations"],
                      passthrough=snap["passthrough_iterations"], layout=snap["layout"],
                      plan=snap["plan"], counts_per_step=counts,
                      fused_iterations=len(snap["stats"]), chosen=snap["chosen"],
                      measured=snap["measured"])
    except Exception as e:  # reported to the test, which asserts on it
        result.update(ok=False, error="%s: %s" % (type(e).__name__, e))
    with open(os.path.join(out, "%s.rank%d.json" % (sc["name"], rank)), "w") as f:
        json.dump(result, f)
    return result["ok"]


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ok = True
    for sc in cfg["scenarios"]:
        ok = run(sc, rank, world, cfg["out"]) and ok
        if not ok and sc.get("fatal_on_error", False):
            break
    # No destroy_process_group barrier: a failed scenario may have left the
    # group unusable; exiting is what a training script would do.
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
