#!/usr/bin/env python3
"""Benchmark: real PyTorch DDP (gloo, CPU) on 2 ranks in 2 network namespaces
joined by a veth link shaped with tc tbf: plain DDP (default buckets) vs DDP
with the fusebox hook (after tuning), on a ResNet-18 (torchvision) with
OMP_NUM_THREADS=1 per rank, at several link speeds.

Exposed communication = iteration time - the same model's iteration time
without communication (both medians of the slowest rank). Needs root (ip
netns, tc) and build/python (the fusebox.torch module). Everything it
creates (namespaces fbbenchA/B, their veth pair) is removed on exit, and it
kills only the processes it started.

    sudo python3 perf/bench_ddp_hook.py [--rates 2gbit,4gbit] [--views 0,1] [--steps 45]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS = ("fbbenchA", "fbbenchB")
DEV = ("fbvethA", "fbvethB")
ADDR = ("10.231.77.1", "10.231.77.2")


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def teardown():
    for ns in NS:
        sh("ip", "netns", "del", ns, check=False)


def setup(rate):
    teardown()
    for ns in NS:
        sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", DEV[0], "netns", NS[0], "type", "veth", "peer", "name", DEV[1],
       "netns", NS[1])
    for ns, dev, addr in zip(NS, DEV, ADDR):
        sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # Egress shaping on both ends: each direction runs at `rate`.
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
           rate, "burst", "256kb", "latency", "50ms")


def run_rate(rate, view, args, tmp):
    setup(rate)
    out = os.path.join(tmp, "result-%s-%d.json" % (rate, view))
    cache = os.path.join(tmp, "cache-%s-%d" % (rate, view))
    env = dict(os.environ, MASTER_ADDR=ADDR[0], MASTER_PORT="29731", WORLD_SIZE="2",
               OMP_NUM_THREADS="1", LOCAL_WORLD_SIZE="1",
               PYTHONPATH=os.path.join(args.build, "python"))
    procs = []
    try:
        for r in range(2):
            cmd = ["ip", "netns", "exec", NS[r], "env", "RANK=%d" % r,
                   "GLOO_SOCKET_IFNAME=%s" % DEV[r], "/usr/bin/python3",
                   os.path.join(REPO, "perf", "ddp_hook_worker.py"), out, str(args.steps),
                   str(args.measure), str(args.batch), cache, str(view)]
            procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
        for p in procs:
            if p.wait(timeout=args.timeout) != 0:
                raise RuntimeError("a rank exited with %d at %s" % (p.returncode, rate))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        teardown()
    with open(out) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--rates", default="2gbit,4gbit", help="tc tbf rates, comma separated")
    ap.add_argument("--steps", type=int, default=45, help="training steps per mode")
    ap.add_argument("--measure", type=int, default=10, help="last steps whose median is reported")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--views", default="0,1",
                    help="DDP gradient_as_bucket_view settings to run (both models), comma separated")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--table_from", metavar="LOG",
                    help="print the table from the '# ... done:' lines of an earlier run's output")
    args = ap.parse_args()
    if args.table_from:
        with open(args.table_from) as f:
            rows = [json.loads(line.split(" done: ", 1)[1]) for line in f if " done: " in line]
        print_table(rows, args)
        return
    if os.geteuid() != 0:
        sys.exit("bench_ddp_hook: needs root (ip netns, tc)")
    # The model comes from torchvision (Debian's python3-torchvision; not
    # needed by the build or the tests, so installed here when missing).
    if subprocess.run(["/usr/bin/python3", "-c", "import torchvision"],
                      capture_output=True).returncode != 0:
        print("# installing python3-torchvision", flush=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                        "python3-torchvision"], check=False, capture_output=True)
    if not os.path.exists(os.path.join(args.build, "python", "fusebox", "torch")):
        sys.exit("bench_ddp_hook: %s/python/fusebox/torch not built (bash scripts/build.sh)"
                 % args.build)
    tmp = tempfile.mkdtemp(prefix="fusebox-ddp-bench.")
    rows = []
    try:
        for rate in args.rates.split(","):
            for view in [int(v) for v in args.views.split(",")]:
                r = run_rate(rate, view, args, tmp)
                r["rate"], r["view"] = rate, view
                rows.append(r)
                print("# %s view %d done: %s" % (rate, view, json.dumps(r)), flush=True)
    finally:
        teardown()
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(rows, args)


def print_table(rows, args):
    print("## DDP communication hook: ResNet-18 (torchvision), batch %d of 3x32x32, 2 ranks, "
          "gloo over a tc tbf veth link, OMP_NUM_THREADS=1" % args.batch)
    print("# medians of the slowest rank over the last %d of %d steps; exposed = iter - compute"
          % (args.measure, args.steps))
    print("| link | bucket view | compute ms | DDP iter ms | DDP exposed ms | fusebox iter ms | fusebox exposed ms "
          "| exposed DDP/fusebox | iter DDP/fusebox | tuning iters | tuning mean ms | plan (buckets) "
          "| params equal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        de = r["plain_ms"] - r["compute_ms"]
        fe = r["fused_ms"] - r["compute_ms"]
        print("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %.3f | %d | %.1f | %s (%d of %d DDP) | %s |"
              % (r["rate"], "on" if r["view"] else "off", r["compute_ms"], r["plain_ms"], de, r["fused_ms"], fe,
                 ("%.2f" % (de / fe)) if fe > 0 else "inf", r["plain_ms"] / r["fused_ms"],
                 r["tuning_iterations"], r["tuning_mean_ms"], r["plan"], r["buckets"],
                 r["ddp_buckets"], "yes" if r["params_equal"] else "NO"))
    print("# one allreduce of all gradients on the link (ms): %s; backward without communication"
          " (ms): %s" % (", ".join("%s %.1f" % (r["rate"], r["allreduce_all_ms"]) for r in rows
                                   if r["view"] == rows[0]["view"]),
                         ", ".join("%.1f" % r["phases_ms"]["compute"][1] for r in rows)))
    print("# per phase, rank 0 medians (forward / backward / optimizer step, ms): what"
          " communication costs the computation on this machine")
    for r in rows:
        p = r["phases_ms"]
        print("#   %s view %s: no comm %s | DDP %s | fusebox %s | fusebox engine: last gradient"
              " to all reduced %.1f ms" % (r["rate"], "on" if r["view"] else "off",
                                          "/".join(map(str, p["compute"])),
                                          "/".join(map(str, p["ddp"])),
                                          "/".join(map(str, p["fusebox"])),
                                          r["engine_ms"]["exposed_ms"]))


if __name__ == "__main__":
    main()
