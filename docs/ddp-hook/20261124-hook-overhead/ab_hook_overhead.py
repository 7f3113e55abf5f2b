"""A/B: is DDP + fusebox (plan fixed to DDP's default) slower than plain DDP, and is it the hook
or the model's history (created first, trained alone for 40 steps)? ResNet-18, batch 128, gloo
on loopback, 2 ranks of one thread each; argument: blocks (the first 4 are warm-up). Every rank:

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 RANK=r WORLD_SIZE=2 OMP_NUM_THREADS=1 \
        PYTHONPATH=build/python python3 docs/ddp-hook/20261124-hook-overhead/ab_hook_overhead.py 64

Rank 0 prints each cell's median step (slowest rank) and its paired ratio to `plain` (median
over blocks, with quartiles)."""
import os, random, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "perf"))
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import ddp_hook_worker as w

class A: model = "cnn"; batch = 128
rank = int(os.environ["RANK"])
torch.set_num_threads(1)
dist.init_process_group("gloo")
import fusebox.torch

def mk(hook, pretrain):
    d = DDP(w.make_model("cnn"))
    h = fusebox.torch.register(d, plan="ddp", cache_dir=False) if hook else None
    o = w.make_optimizer(d)
    for s in range(pretrain):
        x, y = w.make_batch("cnn", rank, s, 128)
        w.timed_step(d, o, A, x, y)
    return d, o, h

cells = {}
cells["fusebox_old"] = mk(True, 40)
cells["plain_old"] = mk(False, 40)
cells["plain"] = mk(False, 0)
cells["fusebox_new"] = mk(True, 0)
times = {c: [] for c in cells}
for block in range(int(sys.argv[1])):
    x, y = w.make_batch("cnn", rank, 10**6 + block, 128)
    for c in random.Random(block).sample(list(cells), len(cells)):
        d, o, _ = cells[c]
        ph, _ = w.timed_step(d, o, A, x, y)
        t = torch.tensor([sum(ph)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if block >= 4: times[c].append(t.item())
if rank == 0:
    for c in cells:
        r = [a / b for a, b in zip(times[c], times["plain"])]
        print(f"{c:12s} median {statistics.median(times[c]):7.1f} ms  paired x plain {statistics.median(r):.3f}  (q1 {sorted(r)[len(r)//4]:.3f} q3 {sorted(r)[3*len(r)//4]:.3f})")
