"""A/B over a shaped 1 Gbit link: is DDP + fusebox slower than plain DDP when fusebox runs DDP's
own plan? ResNet-18, batch 128, gloo, 2 ranks of one thread each, one per network namespace
(run.sh sets them up as perf/bench_ddp_hook.py does). Argument: blocks (the first 4 are warm-up).

Cells, every one stepped once per block in a fresh random order on the same batch:
  plain          DDP's defaults, fresh
  plain_old      DDP's defaults, trained 40 steps alone first (the history of the next two)
  fusebox_fixed  DDP + fusebox.torch.register(plan="ddp"), trained 40 steps first
  fusebox_tuned  DDP + fusebox.torch.register() from an empty cache, trained until its tuner is
                 done (as in the benchmark's fusebox cell); its decision is printed

Rank 0 prints each cell's median step (slowest rank) and its paired ratio to `plain` (median
over blocks, with quartiles), and the tuned cell's plan and decision."""
import os, random, statistics, sys, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "perf"))
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import ddp_hook_worker as w

class A: model = "cnn"; batch = 128
rank = int(os.environ["RANK"])
seed = int(os.environ.get("AB_SEED", "0"))
torch.set_num_threads(1)
dist.init_process_group("gloo")
import fusebox.torch

def mk(kind, pretrain):
    d = DDP(w.make_model("cnn"))
    h = None
    if kind == "fixed":
        h = fusebox.torch.register(d, plan="ddp", cache_dir=False)
    elif kind == "tuned":
        h = fusebox.torch.register(d, cache_dir=tempfile.mkdtemp(prefix="ab-cache-"))
    o = w.make_optimizer(d)
    s = 0
    while s < pretrain or (kind == "tuned" and h.state != "tuned" and s < 70):
        x, y = w.make_batch("cnn", rank, s, 128)
        w.timed_step(d, o, A, x, y)
        s += 1
    return d, o, h

cells = {}
cells["fusebox_tuned"] = mk("tuned", 40)
cells["fusebox_fixed"] = mk("fixed", 40)
cells["plain_old"] = mk(None, 40)
cells["plain"] = mk(None, 0)
times = {c: [] for c in cells}
for block in range(int(sys.argv[1])):
    x, y = w.make_batch("cnn", rank, 10**6 + block, 128)
    for c in random.Random(seed * 100003 + block).sample(list(cells), len(cells)):
        d, o, _ = cells[c]
        ph, _ = w.timed_step(d, o, A, x, y)
        t = torch.tensor([sum(ph)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if block >= 4: times[c].append(t.item())
if rank == 0:
    h = cells["fusebox_tuned"][2]
    print(f"seed {seed}; tuned cell: plan {h.plan['name']} ({len(h.plan['buckets'])} buckets), "
          f"{h.tuning_iterations} tuning iterations; {h.decision}")
    for c in cells:
        r = sorted(a / b for a, b in zip(times[c], times["plain"]))
        print(f"{c:14s} median {statistics.median(times[c]):7.1f} ms  paired x plain "
              f"{statistics.median(r):.3f}  (q1 {r[len(r)//4]:.3f} q3 {r[3*len(r)//4]:.3f}, "
              f"n {len(r)})")
    print("raw " + repr({c: [round(v, 2) for v in times[c]] for c in cells}))
