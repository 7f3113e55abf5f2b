"""One rank of perf/bench_ddp_hook.py: one round of interleaved DDP cells.

Started by the benchmark (inside a network namespace for a shaped link), with
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and GLOO_SOCKET_IFNAME set. It joins
one gloo process group and runs the cells in the order given, in this one
process, each from a fresh model with the same weights (torch.manual_seed(0))
and the same data per step:

    ddp25                 DistributedDataParallel(model), DDP's default 25 MiB buckets
    ddp1, ddp5, ddp100    DistributedDataParallel(model, bucket_cap_mb=1 / 5 / 100)
    fusebox               DistributedDataParallel(model) + fusebox.torch.register(model)

A step is timed from before zero_grad (forward start) to the end of
optimizer.step (time.perf_counter). The figures kept are the slowest rank's
(per-step maximum over ranks). A plain cell runs --steps steps and reports the
median of the last --measure; the first steps are warm-up. The fusebox cell
trains until the hook reports that tuning is over (phase 'tuned' or 'fixed'),
then --measure more steps, at most --tune_steps in all, and reports the median
of those steps.

After every step, outside the timed interval, the ranks agree on whether to go
on with one one-element allreduce. Every cell does it, so the cells stay
comparable, and ranks can never disagree on the number of steps.

Rank 0 writes one JSON object to --out:
    {"meta": {...}, "cells": {cell: {"median_ms", "steps_ms", "measured_ms",
     "q1_ms", "q3_ms", "final_loss", "loss_finite", "loss_max_abs_diff_vs_ddp25",
     ... and for fusebox: "tuning_finished", "steps_to_tuned", "tuning_iterations",
     "tuning_cost_ms", "decision", "plan", "buckets", "cache_hit", ...}}}
"""
import argparse
import gc
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

CELLS = {"ddp25": None, "ddp1": 1, "ddp5": 5, "ddp100": 100, "fusebox": None}
MODELS = ("transformer", "cnn")
TORCHVISION_HINT = ("the cnn model needs torchvision: apt-get install python3-torchvision "
                    "(Debian's package, for /usr/bin/python3)")

VOCAB, D_MODEL, HEADS, FF, LAYERS, SEQ = 8000, 192, 4, 768, 3, 64
CLASSES, IMAGE = 10, 32


class SmallLM(nn.Module):
    """A small causal language model: embedding, 3 transformer encoder layers
    under a causal mask, and a projection back onto the vocabulary."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model=D_MODEL, nhead=HEADS, dim_feedforward=FF,
                                       dropout=0.0, batch_first=True) for _ in range(LAYERS))
        self.head = nn.Linear(D_MODEL, VOCAB)
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
    if kind == "transformer":
        return SmallLM()
    import torchvision  # checked in main()
    return torchvision.models.resnet18(num_classes=CLASSES)


def make_batch(kind, rank, step, size):
    """This rank's input and target for `step`: the same in every cell."""
    g = torch.Generator().manual_seed(1_000_003 * rank + step)
    if kind == "transformer":
        tokens = torch.randint(0, VOCAB, (size, SEQ + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]
    return (torch.randn(size, 3, IMAGE, IMAGE, generator=g),
            torch.randint(0, CLASSES, (size,), generator=g))


def loss_of(kind, output, target):
    if kind == "transformer":
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


def run_cell(cell, args, rank):
    """Trains one cell from a fresh model; returns this rank's step times and
    losses, and for fusebox the hook's snapshot and when tuning ended."""
    model = make_model(args.model)
    if CELLS[cell] is None:
        ddp = DDP(model)
    else:
        ddp = DDP(model, bucket_cap_mb=CELLS[cell])
    handle = None
    if cell == "fusebox":
        import fusebox.torch  # checked in main()
        handle = fusebox.torch.register(ddp, cache_dir=args.cache, verbose=False)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    times, losses = [], []
    tuned_at = None  # steps run when this rank's hook first reported tuning over
    step = 0
    while True:
        x, y = make_batch(args.model, rank, step, args.batch)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_of(args.model, ddp(x), y)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
        step += 1
        if handle is None:
            done = step >= args.steps
        else:
            if tuned_at is None and handle.snapshot()["phase"] in ("tuned", "fixed"):
                tuned_at = step
            done = step >= args.tune_steps or (
                tuned_at is not None and step >= tuned_at + args.measure)
        if all_agree(done):
            break
    result = {"times": times, "losses": losses}
    if handle is not None:
        result["snapshot"] = handle.snapshot()
        # The step count at which every rank's hook had finished tuning.
        agreed = slowest([math.inf if tuned_at is None else tuned_at])[0]
        result["tuned_at"] = None if math.isinf(agreed) else int(agreed)
    return result


def summarize(cell, raw, args):
    """The slowest rank's figures for one cell (every rank calls this: it
    runs collectives)."""
    steps_ms = slowest(raw["times"])
    tuned_at = raw.get("tuned_at")
    # fusebox: the --measure steps after tuning; when --tune_steps cut them
    # short, the last --measure steps (flagged by "tuning_finished").
    finished = tuned_at is not None and tuned_at + args.measure <= len(steps_ms)
    if finished:
        measured = steps_ms[tuned_at:tuned_at + args.measure]
    else:
        measured = steps_ms[-args.measure:]
    q1, median, q3 = quartiles(measured)
    final = raw["losses"][-1]
    out = {
        "median_ms": median, "q1_ms": q1, "q3_ms": q3,
        "measured_ms": measured, "steps_ms": steps_ms, "steps": len(steps_ms),
        "final_loss": final, "loss_finite": all_agree(math.isfinite(final)),
    }
    if cell == "fusebox":
        snap = raw["snapshot"]
        plan = snap["plan"]
        out.update({
            "tuning_finished": finished,
            "steps_to_tuned": tuned_at,
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
    return out


def loss_diff(losses, reference):
    """Largest |loss - reference loss| over the steps both ran, maximum over
    ranks (0.0 means the same losses bit for bit)."""
    common = min(len(losses), len(reference))
    diff = max((abs(a - b) for a, b in zip(losses[:common], reference[:common])), default=0.0)
    return slowest([diff])[0]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file rank 0 writes")
    ap.add_argument("--model", choices=MODELS, required=True,
                    help="transformer: small causal LM, batch x %d tokens; cnn: torchvision "
                         "ResNet-18 (10 classes), batch x 3 x %d x %d" % (SEQ, IMAGE, IMAGE))
    ap.add_argument("--cells", default=",".join(CELLS),
                    help="cells to run, comma separated, from: %s" % ", ".join(CELLS))
    ap.add_argument("--order", default=None,
                    help="the order of the cells in this round (a permutation of --cells; "
                         "default: --cells as given)")
    ap.add_argument("--steps", type=int, default=14, help="steps per plain DDP cell")
    ap.add_argument("--tune_steps", type=int, default=70,
                    help="most steps of the fusebox cell (tuning plus --measure)")
    ap.add_argument("--measure", type=int, default=8,
                    help="steps whose median is reported: the last of a plain cell, the first "
                         "after tuning of the fusebox cell")
    ap.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    ap.add_argument("--cache", default=None,
                    help="fusebox's policy cache directory (give an empty one for an honest "
                         "first-run tuning); required with the fusebox cell")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    args = ap.parse_args(argv)
    cells = args.cells.split(",")
    order = args.order.split(",") if args.order else cells
    unknown = [c for c in cells if c not in CELLS]
    if unknown:
        ap.error("unknown cell(s): %s" % ", ".join(unknown))
    if sorted(order) != sorted(cells) or len(set(cells)) != len(cells):
        ap.error("--order must name each cell of --cells once")
    if not 2 <= args.measure <= args.steps:
        ap.error("need 2 <= --measure <= --steps")
    if "fusebox" in cells and (args.cache is None or args.tune_steps < args.measure):
        ap.error("the fusebox cell needs --cache and --tune_steps >= --measure")
    args.order = order
    return args


def main():
    args = parse_args()
    if args.model == "cnn":
        try:
            import torchvision  # noqa: F401
        except ImportError:
            sys.exit("ddp_hook_worker: " + TORCHVISION_HINT)
    if "fusebox" in args.order:
        import fusebox.torch  # noqa: F401  (fail before joining the group)
    torch.set_num_threads(args.threads)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    raw = {}
    for cell in args.order:
        raw[cell] = run_cell(cell, args, rank)
        # Free the cell's model now (fusebox's handle and its DDP model refer
        # to each other, so only the collector frees them): not during a later
        # cell's timed steps, and not at exit after the process group is gone.
        gc.collect()
    cells = {cell: summarize(cell, raw[cell], args) for cell in args.order}
    if "ddp25" in raw:
        for cell in args.order:
            cells[cell]["loss_max_abs_diff_vs_ddp25"] = loss_diff(raw[cell]["losses"],
                                                                  raw["ddp25"]["losses"])
    if rank == 0:
        meta = {
            "model": args.model, "order": args.order, "steps": args.steps,
            "tune_steps": args.tune_steps, "measure": args.measure, "batch": args.batch,
            "threads": args.threads, "world_size": dist.get_world_size(),
            "parameters": sum(p.numel() for p in make_model(args.model).parameters()),
            "torch": torch.__version__,
        }
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "cells": cells}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
