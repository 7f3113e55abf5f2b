#!/usr/bin/python3
"""torch.distributed Gloo allreduce sweep: the PyTorch baseline of the allreduce benchmark.

Run with Debian's Python (the one that sees torch):

    /usr/bin/python3 perf/baselines/gloo_allreduce.py --nranks 2 -b 8 -e 64M -f 2 -n 20 -w 5 \
        --json out.json

Spawns its own world of --nranks processes (torch.multiprocessing, "spawn"), rendezvous over
TCP on a free port of 127.0.0.1, OMP_NUM_THREADS=1 in every worker. Per size: w warm-up
in-place dist.all_reduce calls on a float32 tensor, a barrier, n timed calls; the per-call time
of each rank is averaged across ranks. Then one checked call on fresh inputs (element i of rank r
is (i + 3r) % 8, so the sum is exact). Only in-place is measured ("oop" is null in the JSON);
the JSON schema is fusebox-perf's, with backend "gloo". Exit status 1 if any element was wrong.
"""

import argparse
import json
import os
import socket
import sys
import time


def parse_size(text):
    t = text.strip()
    mult = 1
    if t[-1:] in ("B", "b") and len(t) > 1 and t[-2:-1].isalpha():
        t = t[:-1]
    suffix = t[-1:].upper()
    if suffix in ("K", "M", "G"):
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[suffix]
        t = t[:-1]
    value = float(t)
    if value < 0:
        raise argparse.ArgumentTypeError("negative size: " + text)
    return int(value * mult)


def sweep(min_bytes, max_bytes, factor):
    """Same sizes as fusebox-perf / fusebox-mpi-allreduce (nccl-tests -b/-e/-f)."""
    out = []
    s = float(max(min_bytes, 1))
    while s <= max_bytes * (1 + 1e-12):
        b = int(s + 0.5)
        if b // 4 > 0 and (not out or out[-1] != b):
            out.append(b)
        s *= factor
    return out


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, port):
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    world = args.nranks
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=world)
    sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor)
    max_count = sizes[-1] // 4 if sizes else 0
    buf = torch.zeros(max_count, dtype=torch.float32)
    buf.fill_(1.0)  # touch every page before anything is timed
    idx = torch.arange(max_count, dtype=torch.int64)
    expected_by_mod = torch.tensor(
        [float(sum((k + 3 * r) % 8 for r in range(world))) for k in range(8)],
        dtype=torch.float32)

    def fill(t, count):
        t.copy_(((idx[:count] + 3 * rank) % 8).to(torch.float32))

    if rank == 0:
        print("# gloo_allreduce.py: torch %s torch.distributed gloo, %d ranks, OMP_NUM_THREADS=%d"
              % (torch.__version__, world, args.threads))
        print("# minBytes %d maxBytes %d step: %g(factor) warmup iters: %d iters: %d "
              "validation: 1\n#" % (args.minbytes, args.maxbytes, args.stepfactor,
                                    args.warmup_iters, args.iters))
        print("#%55s%32s" % ("", "in-place"))
        print("#%11s%14s%10s%8s%7s%11s%8s%8s%8s" % ("size", "count", "type", "redop", "root",
                                                    "time", "algbw", "busbw", "#wrong"))
        print("#%11s%14s%10s%8s%7s%11s%8s%8s%8s" % ("(B)", "(elements)", "", "", "", "(us)",
                                                    "(GB/s)", "(GB/s)", ""))
        sys.stdout.flush()

    results = []
    total_wrong = 0
    bus_sum = 0.0
    for nbytes in sizes:
        count = nbytes // 4
        nbytes = count * 4
        t = buf[:count]
        fill(t, count)
        for _ in range(args.warmup_iters):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        per_call = (time.perf_counter() - t0) / args.iters
        agg = torch.tensor([per_call], dtype=torch.float64)
        dist.all_reduce(agg, op=dist.ReduceOp.SUM)
        sec = agg.item() / world

        fill(t, count)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        exp = expected_by_mod[idx[:count] % 8]
        wrong = torch.tensor([int((t != exp).sum().item())], dtype=torch.int64)
        dist.all_reduce(wrong, op=dist.ReduceOp.SUM)
        wrong = int(wrong.item())

        algbw = nbytes / sec / 1e9 if sec > 0 else 0.0
        busbw = algbw * 2.0 * (world - 1) / world
        total_wrong += wrong
        bus_sum += busbw
        results.append({"bytes": nbytes, "count": count, "type": "float", "redop": "sum",
                        "oop": None,
                        "ip": {"time_us": sec * 1e6, "algbw": algbw, "busbw": busbw,
                               "wrong": wrong}})
        if rank == 0:
            print(" %11d%14d%10s%8s%7d%11.2f%8.2f%8.2f%8d" % (nbytes, count, "float", "sum", -1,
                                                             sec * 1e6, algbw, busbw, wrong))
            sys.stdout.flush()

    avg = bus_sum / len(results) if results else 0.0
    if rank == 0:
        print("# Out of bounds values : %d %s" % (total_wrong, "FAILED" if total_wrong else "OK"))
        print("# Avg bus bandwidth    : %g\n#" % avg)
        if args.json:
            doc = {"tool": "gloo_allreduce.py", "collective": "allreduce", "backend": "gloo",
                   "nranks": world, "iters": args.iters, "warmup": args.warmup_iters,
                   "torch": torch.__version__, "omp_num_threads": args.threads,
                   "results": results, "avg_busbw": avg}
            with open(args.json, "w") as f:
                json.dump(doc, f)
                f.write("\n")
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    if total_wrong:
        sys.exit(1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nranks", "--world-size", type=int, default=2, help="world size (default 2)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", "--stepfactor", type=float, default=2.0)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-d", "--datatype", default="float", choices=["float"])
    p.add_argument("-o", "--op", default="sum", choices=["sum"])
    p.add_argument("-J", "--json", default=None, help="write results as JSON (rank 0)")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per worker (default 1)")
    args = p.parse_args(argv)
    if args.nranks < 1:
        p.error("--nranks must be >= 1")
    if args.stepfactor <= 1.0:
        p.error("-f must be > 1")
    if args.iters < 1 or args.warmup_iters < 0:
        p.error("bad -n / -w")
    if args.minbytes > args.maxbytes:
        p.error("-b is larger than -e")
    if not sweep(args.minbytes, args.maxbytes, args.stepfactor):
        p.error("no size in the sweep holds a float")

    # Workers read these at import time; set them before spawning.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    try:
        import torch.multiprocessing as mp
    except ImportError as e:
        sys.exit("gloo_allreduce.py: cannot import torch (%s); run it with /usr/bin/python3" % e)
    port = free_port()
    try:
        mp.spawn(worker, args=(args, port), nprocs=args.nranks, join=True)
    except mp.ProcessExitedException as e:
        print("gloo_allreduce.py: %s" % e, file=sys.stderr)
        return e.exit_code if e.exit_code and e.exit_code > 0 else 1
    except mp.ProcessRaisedException as e:
        print("gloo_allreduce.py: a worker failed:\n%s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
