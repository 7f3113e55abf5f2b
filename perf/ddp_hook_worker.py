"""One rank of perf/bench_ddp_hook.py: one round, all six cells side by side.

Started by the benchmark (inside a network namespace for a shaped link), with
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and GLOO_SOCKET_IFNAME set. It joins
one gloo process group and runs two phases:

1. Tuning, as a user would see it: DistributedDataParallel(model) +
   fusebox.torch.register(model) with an empty policy cache trains step after
   step until the hook reports that tuning is over (phase 'tuned' or 'fixed'),
   at most --tune_steps steps. Its steps, decision and cost are recorded.
2. Side by side: six DDP models live at once, every one starting from the
   fusebox model's weights and optimizer state at the end of phase 1:

       ddp25                 DistributedDataParallel(model), DDP's default 25 MiB buckets
       ddp1, ddp5, ddp100    DistributedDataParallel(model, bucket_cap_mb=1 / 5 / 100)
       fusebox               the tuned model of phase 1, its hook in place
       nocomm                DDP with torch's noop_hook: no allreduce, the compute
                             alone (the floor no bucketing can beat; its ranks'
                             weights diverge, so its losses are not compared)

   --steps blocks, each running one step of every cell in a fresh random
   order (the same on every rank) on the same batch; the first
   --steps - --measure blocks are warm-up (DDP's own first iterations, when it
   rebuilds its buckets). Interleaving step by step puts the machine's slow
   spells (minutes long on these shared machines) on every cell alike, and
   each block gives a paired comparison. Because every reducing cell starts
   from the same state and sees the same batches, their losses must agree: 2 ranks
   give bit-identical averages whatever the bucketing.

A step is timed from before zero_grad (forward start) to the end of
optimizer.step (time.perf_counter), in three phases (forward with zero_grad,
backward with DDP's wait for its buckets, optimizer). The figures kept are the
slowest rank's (per-step maximum over ranks). In phase 2 the fusebox hook's
own step timing spans the other cells' steps, so its periodic check (one step
of DDP's default every 25) may run in a measured step: that is its real cost.

Rank 0 writes one JSON object to --out:
    {"meta": {...}, "cells": {cell: {"median_ms", "q1_ms", "q3_ms", "measured_ms",
     "paired_ratio_vs_ddp25", "phases_ms", "final_loss", "loss_finite",
     "loss_max_abs_diff_vs_ddp25" (not for nocomm), ... and for fusebox: "tuning_finished",
     "steps_to_tuned", "tuning_steps_ms", "tuning_iterations", "tuning_cost_ms",
     "decision", "plan", "buckets", "cache_hit", "measured_plans"}}}
"""
import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import time
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

CELLS = {"ddp25": None, "ddp1": 1, "ddp5": 5, "ddp100": 100, "fusebox": None, "nocomm": None}
# Cells whose gradients are reduced: every one of them must see the same losses.
# "nocomm" is DDP with torch's noop_hook (no allreduce at all): the step's
# compute alone, which no bucketing can beat (its ranks' weights diverge).
REDUCING = ("ddp25", "ddp1", "ddp5", "ddp100", "fusebox")
MODELS = ("transformer", "transformer7m", "gpt2small", "cnn", "resnet50")
TORCHVISION_HINT = ("the cnn model needs torchvision: apt-get install python3-torchvision "
                    "(Debian's package, for /usr/bin/python3)")

# (d_model, heads, feed-forward, layers) of the causal LMs. "transformer":
# 2.45 M parameters (9.8 MB of fp32 gradients), about 0.4 s per step on one
# thread of these machines at batch 4. "transformer7m": 7.26 M parameters
# (29 MB), the first user report's model, where DDP's default leaves most of
# the layers' gradients to the last bucket.
# "gpt2small": GPT-2 small's layers (d 768, 12 heads, ff 3072, 12 layers) on
# this vocabulary, 97 M parameters, for the GPU benchmark (perf/gpu/).
LM_SHAPES = {"transformer": (128, 4, 512, 2), "transformer7m": (256, 4, 1024, 4),
             "gpt2small": (768, 12, 3072, 12)}
VOCAB, SEQ = 8000, 64
CLASSES = 10
# torchvision models: "cnn" is ResNet-18, "resnet50" ResNet-50 (10 classes).
CNNS = {"cnn": "resnet18", "resnet50": "resnet50"}


class SmallLM(nn.Module):
    """A small causal language model: embedding, transformer encoder layers
    under a causal mask, and a projection back onto the vocabulary."""

    def __init__(self, d_model, heads, ff, layers):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model=d_model, nhead=heads, dim_feedforward=ff,
                                       dropout=0.0, batch_first=True) for _ in range(layers))
        self.head = nn.Linear(d_model, VOCAB)
        self.register_buffer(
            "mask", torch.triu(torch.full((SEQ, SEQ), float("-inf")), diagonal=1),
            persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, src_mask=self.mask)
        return self.head(x)


def make_model(kind):
    """A fresh model of `kind`, with the same weights every time."""
    torch.manual_seed(0)
    if kind in LM_SHAPES:
        return SmallLM(*LM_SHAPES[kind])
    import torchvision  # checked in main()
    return getattr(torchvision.models, CNNS[kind])(num_classes=CLASSES)


def make_batch(args, rank, step):
    """This rank's input and target for `step`, on args.device: the same in
    every cell."""
    g = torch.Generator().manual_seed(1_000_003 * rank + step)
    if args.model in LM_SHAPES:
        tokens = torch.randint(0, VOCAB, (args.batch, SEQ + 1), generator=g)
        x, y = tokens[:, :-1], tokens[:, 1:]
    else:
        x = torch.randn(args.batch, 3, args.image, args.image, generator=g)
        y = torch.randint(0, CLASSES, (args.batch,), generator=g)
    return x.to(args.device), y.to(args.device)


def loss_of(kind, output, target):
    if kind in LM_SHAPES:
        return nn.functional.cross_entropy(output.reshape(-1, VOCAB), target.reshape(-1))
    return nn.functional.cross_entropy(output, target)


def all_agree(flag):
    """True when `flag` is true on every rank (one one-element allreduce)."""
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def slowest(values):
    """Per-element maximum over ranks of a list of floats."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def quartiles(values):
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def timed_step(ddp, opt, args, x, y):
    """One training step; returns ([forward, backward, optimizer] ms, loss).
    On a GPU each phase ends with a synchronise, so that the phases are the
    device's."""
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = loss_of(args.model, ddp(x), y)
    sync()
    t1 = time.perf_counter()
    loss.backward()  # DDP waits here for every bucket's allreduce
    sync()
    t2 = time.perf_counter()
    opt.step()
    sync()
    t3 = time.perf_counter()
    return [(t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3], loss.item()


def make_optimizer(ddp):
    return torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)


def tune(args, rank):
    """Phase 1: the fusebox model trains until its hook has tuned. Returns
    (ddp, optimizer, handle, this rank's step times, steps to tuned)."""
    import fusebox.torch  # checked in main()
    ddp = DDP(make_model(args.model).to(args.device))
    handle = fusebox.torch.register(ddp, cache_dir=args.cache, verbose=False)
    opt = make_optimizer(ddp)
    times, tuned_at = [], None
    for step in range(args.tune_steps):
        x, y = make_batch(args, rank, step)
        phases, _ = timed_step(ddp, opt, args, x, y)
        times.append(sum(phases))
        if tuned_at is None and handle.snapshot()["phase"] in ("tuned", "fixed"):
            tuned_at = step + 1
        if all_agree(tuned_at is not None):
            break
    agreed = slowest([math.inf if tuned_at is None else tuned_at])[0]
    return ddp, opt, handle, times, (None if math.isinf(agreed) else int(agreed))


def side_by_side(args, rank, fused, fused_opt):
    """Phase 2: every cell, one step each per block in a random order.
    Returns {cell: {"phases": [...], "losses": [...]}} of the measured blocks
    (this rank's figures)."""
    state = fused.module.state_dict()
    opt_state = fused_opt.state_dict()
    models = {}
    for cell, cap in CELLS.items():
        if cell == "fusebox":
            models[cell] = (fused, fused_opt)
            continue
        model = make_model(args.model).to(args.device)
        model.load_state_dict(state)
        ddp = DDP(model) if cap is None else DDP(model, bucket_cap_mb=cap)
        if cell == "nocomm":
            ddp.register_comm_hook(None, debugging_hooks.noop_hook)
        opt = make_optimizer(ddp)
        opt.load_state_dict(opt_state)
        models[cell] = (ddp, opt)
    seed = zlib.crc32(",".join(args.order).encode())
    warmup = args.steps - args.measure
    out = {cell: {"phases": [], "losses": []} for cell in CELLS}
    for block in range(args.steps):
        order = list(args.order) if block == 0 else random.Random(seed + block).sample(
            list(CELLS), len(CELLS))
        x, y = make_batch(args, rank, 1_000_000 + block)
        for cell in order:
            ddp, opt = models[cell]
            phases, loss = timed_step(ddp, opt, args, x, y)
            if block >= warmup:
                out[cell]["phases"].append(phases)
                out[cell]["losses"].append(loss)
    return out


def summarize(cell, raw, reference):
    """The slowest rank's figures for one cell in phase 2 (every rank calls
    this: it runs collectives). `reference` is ddp25's summary, or None."""
    per_phase = [slowest([p[i] for p in raw["phases"]]) for i in range(3)]
    steps_ms = slowest([sum(p) for p in raw["phases"]])
    q1, median, q3 = quartiles(steps_ms)
    final = raw["losses"][-1]
    out = {
        "median_ms": median, "q1_ms": q1, "q3_ms": q3, "measured_ms": steps_ms,
        "phases_ms": {name: statistics.median(v)
                      for name, v in zip(("forward", "backward", "optimizer"), per_phase)},
        "final_loss": final, "loss_finite": all_agree(math.isfinite(final)),
    }
    if reference is not None:
        out["paired_ratio_vs_ddp25"] = statistics.median(
            a / b for a, b in zip(steps_ms, reference["measured_ms"]))
    return out


def loss_diff(losses, reference):
    """Largest |loss - reference loss| over the measured blocks, maximum over
    ranks (0.0 means the same losses bit for bit)."""
    diff = max((abs(a - b) for a, b in zip(losses, reference)), default=0.0)
    return slowest([diff])[0]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file rank 0 writes")
    ap.add_argument("--model", choices=MODELS, required=True,
                    help="transformer, transformer7m, gpt2small: causal LMs (2.45 M, 7.26 M "
                         "and 97 M parameters), batch x %d tokens; cnn, resnet50: torchvision "
                         "ResNet-18 and ResNet-50 (10 classes), batch x 3 x IMAGE x IMAGE"
                         % SEQ)
    ap.add_argument("--order", default=",".join(CELLS),
                    help="the cells' order in the first block (a permutation of %s); it also "
                         "seeds the later blocks' orders" % ", ".join(CELLS))
    ap.add_argument("--steps", type=int, default=10,
                    help="blocks of phase 2 (one step of every cell each)")
    ap.add_argument("--tune_steps", type=int, default=70,
                    help="most steps of phase 1 (the fusebox model tuning)")
    ap.add_argument("--measure", type=int, default=8,
                    help="measured blocks: the last of --steps (the others are warm-up)")
    ap.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    ap.add_argument("--cache", default=None,
                    help="fusebox's policy cache directory (give an empty one for an honest "
                         "first-run tuning); required with the fusebox cell")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    ap.add_argument("--image", type=int, default=32, help="cnn, resnet50: image side in pixels")
    ap.add_argument("--device", default="cpu",
                    help="cpu, or cuda: every rank's model on the GPU of its LOCAL_RANK modulo "
                         "the GPUs visible (ranks may share one), reduced by DDP over gloo")
    args = ap.parse_args(argv)
    order = args.order.split(",")
    if sorted(order) != sorted(CELLS):
        ap.error("--order must name each of %s once" % ", ".join(CELLS))
    if not 2 <= args.measure <= args.steps:
        ap.error("need 2 <= --measure <= --steps")
    if args.cache is None or args.tune_steps < 1:
        ap.error("phase 1 needs --cache and --tune_steps >= 1")
    if args.device not in ("cpu", "cuda"):
        ap.error("--device must be cpu or cuda")
    if args.image < 8:
        ap.error("--image must be at least 8")
    args.order = order
    return args


def main():
    args = parse_args()
    if args.model in CNNS:
        try:
            import torchvision  # noqa: F401
        except ImportError:
            sys.exit("ddp_hook_worker: " + TORCHVISION_HINT)
    import fusebox.torch  # noqa: F401  (fail before joining the group)
    torch.set_num_threads(args.threads)
    rank = int(os.environ["RANK"])
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("ddp_hook_worker: --device cuda, but torch sees no GPU")
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        torch.cuda.set_device(index)
        args.device = "cuda:%d" % index
    dist.init_process_group("gloo")
    fused, fused_opt, handle, tune_times, tuned_at = tune(args, rank)
    snap = handle.snapshot()
    raw = side_by_side(args, rank, fused, fused_opt)
    cells = {"ddp25": summarize("ddp25", raw["ddp25"], None)}
    for cell in CELLS:
        if cell != "ddp25":
            cells[cell] = summarize(cell, raw[cell], cells["ddp25"])
    cells["ddp25"]["paired_ratio_vs_ddp25"] = 1.0
    for cell in REDUCING:
        cells[cell]["loss_max_abs_diff_vs_ddp25"] = loss_diff(raw[cell]["losses"],
                                                              raw["ddp25"]["losses"])
    plan = snap["plan"]
    cells["fusebox"].update({
        "tuning_finished": tuned_at is not None,
        "steps_to_tuned": tuned_at,
        "tuning_steps_ms": slowest(tune_times),
        "phase": snap["phase"],
        "tuning_iterations": snap["tuning_iterations"],
        "tuning_cost_ms": snap["tuning_cost_ms"],
        "passthrough_iterations": snap["passthrough_iterations"],
        "decision": snap["decision"],
        "plan": plan["name"] if plan else None,
        "buckets": len(plan["bucket_elements"]) if plan else None,
        "cache_hit": snap["cache_hit"],
        "measured_plans": snap["measured"],
    })
    if rank == 0:
        meta = {
            "model": args.model, "order": args.order, "blocks": args.steps,
            "measured_blocks": args.measure, "tune_steps": args.tune_steps,
            "batch": args.batch, "threads": args.threads, "world_size": dist.get_world_size(),
            "device": args.device, "image": args.image,
            "parameters": sum(p.numel() for p in make_model(args.model).parameters()),
            "torch": torch.__version__,
        }
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "cells": cells}, f)
    dist.barrier()
    # Free the models while the process group still exists (the hook's
    # process group and threads go with them), not at interpreter exit.
    del raw, fused, fused_opt, handle
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
