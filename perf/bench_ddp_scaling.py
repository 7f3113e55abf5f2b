#!/usr/bin/env python3
"""Does the best fixed bucket_cap_mb change with cluster size, and does fusebox's plan keep up?

    COMPUTE IS EMULATED DEVICE TIME (perf/devtime.py: the host sleeps, as a GPU's
    host would while its kernels run); COMMUNICATION IS REAL (PyTorch DDP over
    gloo). Hosts are network namespaces on one bridge, each link tbf-shaped to
    --rate both ways (perf/cluster/emucluster.py), one rank per host; every rank
    shares this machine's cores. Label every number from it as such.

For each setting (a profile and how long one allreduce of all its gradients
takes against backward, over 2 hosts), each repeat and each host count of
--hosts, ONE launch (perf/scaling_worker.py) runs every cell in a random order
(seeded, logged): DDP's default (ddp25), caps of 1, 5 and 100 MiB, PyTorch's
pre-bucketing rule (pytorch, below), fusebox tuned from an empty policy cache
(fusebox), fusebox whose cache holds only other cluster sizes' entries
(fusebox_warm, below), and no allreduce at all (noallreduce). A cell's figure
in a launch is the median of its --steps timed steps (each the slowest rank's);
fusebox cells are timed after their tuning (the hook's phase has left
learning/profiling/screening/verifying), tuning steps reported apart; a fusebox
cell that did not finish tuning in --tune-steps steps is marked and not
compared. Repeats are interleaved blocks: repeat 1 of every setting and host
count, then repeat 2, ... Across repeats: the median of the per-launch figures
with an order-statistic interval (coverage stated; 95% needs 6 repeats). The
best fixed cap of a host count (among ddp25, cap1, cap5, cap100, pytorch) is
chosen on the odd repeats and reported on the even ones (held out), and
fusebox / best cap is the median over held-out repeats of the per-launch ratio.

Lower bound (computed here in Python from the device-time model's stated times,
not measured): forward + max(backward end + T(last-ready gradient), first
gradient ready + T(all gradient bytes)), T(b) = 2 (p-1)/p * b / (rate / 8): a
ring allreduce over p hosts at the raw tc rate, no latency, no headers.

PyTorch's rule (facts taken from PyTorch's sources, not its code):
torch/_inductor/fx_passes/fsdp.py, compute_pre_bucket_cap_mb (added by PyTorch
PR #179935, "[overlap] pre-bucketing of fsdp collectives", for the collectives
of FSDP groups; here it is DDP's bucket_cap_mb) sets the cap to the message that
saturates the group's bandwidth, from torch/_inductor/comm_analysis.py,
compute_min_saturation_bytes(group_size, ALL_GATHER, target_efficiency=0.9):
    min_bytes = e / (1 - e) * (base_latency + (p - 1) * hop_latency) * bus_bw
(e = 0.9, so 9x; p - 1 steps for an all-gather, 2 (p - 1) for an all-reduce;
the result is at least the interconnect profile's min_saturation_bytes), then
cap_mb = multiplier * min_bytes / 2^20, clamped to [50, 2000] (config
pre_bucketing_fsdp_collectives_{min,max}_bucket_cap_mb; the range as the PR
states it; multiplier 1: PyTorch PR #180463 removed the factor 3). Here:
bus_bw = the payload rate (--rate x 0.95 / 8), base and hop latency
--latency-us each (gloo over a veth; PyTorch's profiles are NCCL's), no
profile minimum. For every setting this script can run the clamp decides:
the rule gives 50 MiB (the report prints the unclamped figure), a large fixed
cap, the same buckets as cap100 wherever the gradients are under 50 MiB.

fusebox_warm: one policy cache directory per setting, fed only by the cold
fusebox cell: after each launch that cell's entries (its world size) are
copied in, replacing older ones of the same size. The warm cell of a launch
gets a copy without the entries of its own world size, so fusebox finds no
entry for its size and, as its tuner does for a size not yet cached, adds the
plan of the nearest cached size (nearest in ratio, ties to the larger) to its
candidates. Host counts run in ascending order within a repeat: with 2, 4, 8
the 2-host warm cell gets the 4-host plan (from repeat 2 on; in repeat 1 it has
none and is marked "no other size cached", not compared), the 4-host one the
2-host plan in repeat 1 and the 8-host plan later (a tie goes to the larger),
the 8-host one the 4-host plan.
Cross-size matrix (--no-cross leaves it out): the same shared cache also gives
each launch one more cell per other world size N cached, from<N>: the plan the
cold fusebox cell tuned at N hosts (its latest), written as a plan file
(plans/) and run untuned (fusebox.torch.register(plan=FILE)) at this launch's
size. Its figure over fusebox's in the same launch is the matrix entry (tuned
at N, run at M): above 1, the plan tuned at another size is slower here than
the one tuned here. With ascending host counts, repeat 1 fills the entries
below the diagonal, later repeats all of them.
The hook's own cost (--hook-cost): one more cell per launch, hooked: DDP's
default with fusebox registered on that same plan, untuned
(fusebox.torch.register(plan="ddp"): the hook, its side group and step marks,
nothing else); its step over ddp25's in the same launch, per host count.

CPU: /proc/stat (the whole machine, this run AND anything else on it) over each
timed span, and the ranks' own CPU seconds per wall second ("cores"). Output, in
--out (default build/bench-out/ddp-scaling/<timestamp>/): raw/*.json, logs/,
cache/, report.md, result.json (perf/results.py). Needs root; the namespaces
(<prefix>sw, <prefix>h<i>) go on exit, failure and SIGINT/SIGTERM/SIGHUP.

    sudo /usr/bin/python3 perf/bench_ddp_scaling.py --settings resnet50:1.5 --repeats 6
"""
import argparse
import json
import math
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "cluster"))
import netns  # noqa: E402  perf/netns.py: RankProcesses, PYTHON, RATE
import bench_trust  # noqa: E402  (choose_scales, rate_bits, PAYLOAD)
import emucluster  # noqa: E402  (setup, cleanup, host_ns, address)
import results as result_summary  # noqa: E402
from ddp_scaling_report import (  # noqa: E402,F401  the analysis and report (pure);
    # the tests reach them through this module
    CAP_MB, CELLS, FIXED, FUSEBOX, HOOKED, MIB, analyze_hosts, analyze_predictions, cross_cells,
    format_hook_cost, hook_cost,
    ddp_bucket_bytes, describe, fmt, format_cross, format_setting, format_sim, launch_figure,
    lower_bound_s, predicted_steps, pytorch_prebucket_cap_mb, ring_transfer_s, tuner_names)

REPO = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "scaling_worker.py")


# ---------------------------------------------------------------------- scales

def setting_figures(profile, ratio, args):
    """Scales of one setting: compute as given (default bench_trust's), params so that one
    allreduce of all gradients over 2 hosts takes `ratio` x backward at the payload rate."""
    import devtime
    ns = types.SimpleNamespace(profile=profile, compute_scale=args.compute_scale,
                               param_scale=None, link=args.rate, runs=1, caps=[25.0], steps=1)
    base = bench_trust.choose_scales(ns)
    param_scale = args.param_scale or float("%.3g" % (ratio * base["param_scale"]))
    model = devtime.DeviceTimeModel.from_profile(profile, compute_scale=ns.compute_scale,
                                                 param_scale=param_scale)
    pairs = model.named_parameters_in_ready_order()
    sizes = [p.numel() * p.element_size() for _, p in pairs]
    dtypes = [str(p.dtype) for _, p in pairs]
    ready = model.device_ready_s()
    rate = bench_trust.rate_bits(args.rate)
    payload = rate / 8 * bench_trust.PAYLOAD
    fig = {"profile": profile, "ratio": ratio, "compute_scale": ns.compute_scale,
           "param_scale": param_scale, "forward_s": model.device_forward_s(),
           "backward_s": model.device_backward_s(), "first_ready_s": ready[0],
           "last_bytes": sizes[-1], "total_bytes": sum(sizes), "rate_bps": rate,
           "payload_Bps": payload}
    fig["label"] = ("EMULATED device time: %s profile, compute x%g (forward %.1f ms, backward "
                    "%.1f ms), params x%g (%.2f MiB of gradients); %s tbf per host; one "
                    "allreduce of all gradients over 2 hosts is %.2fx backward at the payload "
                    "rate" % (profile, ns.compute_scale, fig["forward_s"] * 1e3,
                              fig["backward_s"] * 1e3, param_scale, fig["total_bytes"] / MIB,
                              args.rate, fig["total_bytes"] / payload / fig["backward_s"]))
    fig["sizes"], fig["dtypes"] = sizes, dtypes
    return fig


def bucket_counts(fig, pt_mb):
    caps = dict(CAP_MB, pytorch=pt_mb)
    return ", ".join("%s %d" % (c, len(ddp_bucket_bytes(fig["sizes"], fig["dtypes"],
                                                         int(caps[c] * MIB)))) for c in FIXED)


# -------------------------------------------------------------------- launches

def prepare_caches(root, setting, tag, hosts):
    """(cold dir, warm dir, world sizes in the warm dir) for one launch."""
    shared = os.path.join(root, "cache", setting)
    cold = os.path.join(root, "cache", tag + "-cold")
    warm = os.path.join(root, "cache", tag + "-warm")
    for d in (shared, cold, warm):
        os.makedirs(d, exist_ok=True)
    worlds = []
    for f in sorted(os.listdir(shared)):
        if not f.endswith(".json"):
            continue
        with open(os.path.join(shared, f)) as fh:
            w = json.load(fh).get("key", {}).get("world_size")
        if w != hosts:
            shutil.copy(os.path.join(shared, f), warm)
            worlds.append(w)
    return cold, warm, sorted(worlds)


def cross_plans(root, setting, tag, hosts):
    """{"from<N>": plan file} for every other world size N whose entry is in the setting's
    shared cache (the cold fusebox cell's, latest launch at N): its plan written as a plan
    file under plans/, for a from<N> cell to run untuned at `hosts`."""
    shared = os.path.join(root, "cache", setting)
    out = {}
    for f in sorted(os.listdir(shared)) if os.path.isdir(shared) else ():
        if not f.endswith(".json"):
            continue
        with open(os.path.join(shared, f)) as fh:
            entry = json.load(fh)
        w = entry.get("key", {}).get("world_size")
        if not isinstance(w, int) or w == hosts or not isinstance(entry.get("plan"), dict):
            continue
        os.makedirs(os.path.join(root, "plans"), exist_ok=True)
        path = os.path.join(root, "plans", "%s-from%d.json" % (tag, w))
        with open(path, "w") as fh:
            json.dump(entry["plan"], fh)
        out["from%d" % w] = path
    return out


def nearest_world(worlds, hosts):   # PolicyCache::Nearest: nearest in ratio, ties: larger
    return min(worlds, key=lambda w: (abs(math.log(w / hosts)), -w)) if worlds else None


class Launcher(netns.RankProcesses):
    def __init__(self, args, outdir):
        super().__init__(args.timeout, 0.5)
        self.args, self.outdir, self.count = args, outdir, 0

    def run(self, fig, setting, hosts, repeat, order, seed, pt_mb, plans=None):
        args = self.args
        self.count += 1
        tag = "%s-h%d-r%d" % (setting, hosts, repeat)
        cold, warm, worlds = prepare_caches(self.outdir, setting, tag, hosts)
        partial = os.path.join(self.outdir, "raw", tag + ".worker.json")
        env = dict(os.environ, WORLD_SIZE=str(hosts), OMP_NUM_THREADS="1",
                   MASTER_ADDR=emucluster.address(args.subnet, 0),
                   MASTER_PORT=str(args.port + self.count % 200), LOCAL_WORLD_SIZE="1",
                   LOCAL_RANK="0", GLOO_SOCKET_IFNAME=emucluster.IFACE,
                   PYTHONPATH=os.path.join(os.path.abspath(args.build), "python"))
        env.pop("FUSEBOX_DISABLE", None)
        cmd = [args.python, WORKER, "--cells", ",".join(order), "--profile", fig["profile"],
               "--compute-scale", repr(fig["compute_scale"]),
               "--param-scale", repr(fig["param_scale"]), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--tune-steps", str(args.tune_steps),
               "--pytorch-cap", repr(pt_mb), "--cold-cache", cold, "--warm-cache", warm,
               "--seed", str(seed), "--out", partial]
        if plans:
            cmd += ["--plans", ",".join("%s=%s" % kv for kv in sorted(plans.items()))]
        logs = []
        t0, cpu0 = time.monotonic(), read_cpu()
        try:
            for rank in range(hosts):
                logs.append(os.path.join(self.outdir, "logs", "%s-rank%d.log" % (tag, rank)))
                with open(logs[-1], "w") as log:
                    log.write("# %s\n" % shlex.join(cmd))
                    log.flush()
                    self.start(["ip", "netns", "exec", emucluster.host_ns(args.prefix, rank)]
                               + cmd, dict(env, RANK=str(rank)), log, log)
            self.wait(tag, logs)
        finally:
            self.kill()
        cpu1 = read_cpu()
        with open(partial) as f:
            res = json.load(f)
        os.remove(partial)
        for f in os.listdir(cold):   # the cold cell's entry feeds the setting's cache
            if f.endswith(".json"):
                shutil.copy(os.path.join(cold, f), os.path.join(self.outdir, "cache", setting))
        res.update(setting=setting, hosts=hosts, repeat=repeat, seed=seed, tag=tag,
                   launch_s=time.monotonic() - t0, warm_worlds=worlds,
                   warm_from=nearest_world(worlds, hosts),
                   launch_cpu_busy=(cpu1[0] - cpu0[0]) / max(1, cpu1[1] - cpu0[1]))
        if "fusebox_warm" in res["cells"] and res["warm_from"] is None:
            res["cells"]["fusebox_warm"]["excluded"] = "no other size cached"
        with open(os.path.join(self.outdir, "raw", tag + ".json"), "w") as f:
            json.dump(res, f)
        return res


def read_cpu():   # (busy, total) jiffies of the whole machine
    with open("/proc/stat") as f:
        x = [int(v) for v in f.readline().split()[1:]]
    return sum(x[:8]) - x[3] - x[4], sum(x[:8])


# ------------------------------------------------------------------------ main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default="resnet50:1.5",
                    help="profile:ratio,... (ratio: one allreduce of all gradients over 2 "
                         "hosts / backward; default %(default)s)")
    ap.add_argument("--hosts", default="2,4,8", help="host counts (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per cell")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps of a fixed plan")
    ap.add_argument("--tune-steps", type=int, default=90,
                    help="most steps a fusebox cell may tune (default %(default)s)")
    ap.add_argument("--rate", default="500mbit", help="tc rate of every host's link")
    ap.add_argument("--no-cross", dest="cross", action="store_false",
                    help="leave out the from<N> cells (the cross-size matrix)")
    ap.add_argument("--burst", default="256kb")
    ap.add_argument("--hook-cost", action="store_true",
                    help="also run a cell 'hooked' per launch: DDP's default plan with "
                         "fusebox registered on it untuned (plan=\"ddp\"), reported as "
                         "hooked / ddp25, the hook's own cost")
    ap.add_argument("--compute-scale", type=float, default=None,
                    help="default: bench_trust's (forward + backward about 80 ms)")
    ap.add_argument("--param-scale", type=float, default=None,
                    help="default: from the setting's ratio")
    ap.add_argument("--latency-us", type=float, default=100.0,
                    help="PyTorch rule's base and per-hop latency (default %(default)s)")
    for flag, default in (("--seed", None), ("--subnet", 98), ("--port", 29790)):
        ap.add_argument(flag, type=int, default=default)
    for flag, default in (("--prefix", "fbsc"), ("--out", None), ("--python", netns.PYTHON),
                          ("--build", os.path.join(REPO, "build"))):
        ap.add_argument(flag, default=default)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per launch")
    args = ap.parse_args(argv)
    try:
        args.hosts = sorted({int(h) for h in args.hosts.split(",")})
        args.settings = [(p, float(r)) for p, r in (s.split(":") for s in args.settings.split(","))]
    except ValueError:
        ap.error("--hosts is e.g. 2,4,8 and --settings e.g. resnet50:1.5,gpt2_small:0.5")
    if not args.hosts or args.hosts[0] < 2 or args.hosts[-1] > 64:
        ap.error("--hosts: each between 2 and 64")
    if args.repeats < 1 or args.steps < 1 or not netns.RATE.match(args.rate):
        ap.error("need --repeats >= 1, --steps >= 1 and a tc --rate such as 500mbit")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2 ** 31)
    return args


def exit_on_signal(signum, frame):  # unwind: kill the ranks, delete the namespaces
    raise SystemExit(128 + signum)


def build_report(args, figs, runs, head):
    lines = list(head) + [""]
    for setting, fig in figs.items():
        per_hosts, hooks = {}, {}
        for h in args.hosts:
            ls = [l for l in runs if l["setting"] == setting and l["hosts"] == h]
            if ls:
                bound = 1e3 * lower_bound_s(fig["forward_s"], fig["backward_s"],
                                            fig["first_ready_s"], fig["last_bytes"],
                                            fig["total_bytes"], h, fig["rate_bps"])
                a = analyze_hosts(ls)
                a["sim"] = analyze_predictions(ls, tuner_names(fig, fig["pt"][h][0]))
                per_hosts[h] = (a, bound, fig["pt"][h])
                hooks[h] = hook_cost(ls)
        if per_hosts:
            lines += format_setting(setting, fig, per_hosts) + format_hook_cost(setting, hooks)
    for l in runs:
        fb, fw = ((l["cells"].get(c, {}).get("fusebox") or {}) for c in FUSEBOX)
        lines.append("launch %s: order %s; seed %d; %.0f s; CPU busy %.0f%%; fusebox: %s, %s "
                     "buckets; warm from world %s: %s, %s buckets" % (
                         l["tag"], ",".join(l["order"]), l["seed"], l["launch_s"],
                         100 * l["launch_cpu_busy"], fb.get("plan"), fb.get("buckets"),
                         l["warm_from"], fw.get("plan"), fw.get("buckets")))
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    if os.geteuid() != 0 or shutil.which("ip") is None:
        sys.exit("bench_ddp_scaling: needs root and iproute2 (ip netns, tc)")
    command = shlex.join([sys.executable] + (sys.argv if argv is None else
                                             [sys.argv[0]] + list(argv)))
    outdir = args.out or os.path.join(REPO, "build", "bench-out", "ddp-scaling",
                                      time.strftime("%Y%m%d-%H%M%S"))
    for sub in ("raw", "logs", "cache"):
        os.makedirs(os.path.join(outdir, sub), exist_ok=True)
    figs = {}
    for profile, ratio in args.settings:
        fig = setting_figures(profile, ratio, args)
        fig["pt"] = {h: pytorch_prebucket_cap_mb(h, fig["payload_Bps"], args.latency_us * 1e-6)
                     for h in args.hosts}
        fig["buckets"] = bucket_counts(fig, fig["pt"][args.hosts[0]][0])
        figs["%s-comm%gx" % (profile, ratio)] = fig
    head = ["# %s" % command,
            "# started %s on %s (%d CPUs), commit %s; seed %d; %d launches" % (
                time.strftime("%Y-%m-%d %H:%M:%S"), socket.gethostname(), os.cpu_count() or 0,
                result_summary.git_commit(), args.seed,
                args.repeats * len(figs) * len(args.hosts))]
    head += ["# %s: %s" % (s, f["label"]) for s, f in figs.items()]
    print("\n".join(head), flush=True)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, exit_on_signal)
    rng = random.Random(args.seed)
    launcher = Launcher(args, outdir)
    runs, failed = [], None
    cluster = types.SimpleNamespace(prefix=args.prefix, hosts=args.hosts[-1],
                                    subnet=args.subnet, rate=args.rate, burst=args.burst)
    try:
        emucluster.setup(cluster)
        for repeat in range(1, args.repeats + 1):
            for setting, fig in figs.items():
                for h in args.hosts:
                    plans = (cross_plans(outdir, setting, "%s-h%d-r%d" % (setting, h, repeat), h)
                             if args.cross else {})
                    if args.hook_cost:
                        plans[HOOKED] = "ddp"
                    order = list(CELLS) + sorted(plans)
                    rng.shuffle(order)
                    res = launcher.run(fig, setting, h, repeat, order,
                                       rng.randrange(1, 2 ** 62), fig["pt"][h][0], plans)
                    runs.append(res)
                    print("# %s: %.0f s, %s" % (res["tag"], res["launch_s"], ", ".join(
                        "%s %.1f" % (c, statistics.median(res["cells"][c]["step_ms"]))
                        for c in order)), flush=True)
    except (RuntimeError, emucluster.SetupError, OSError) as e:
        failed = str(e)
    except KeyboardInterrupt:
        failed = "interrupted"
    finally:
        launcher.kill()
        try:
            emucluster.cleanup(args.prefix)
        except emucluster.SetupError as e:
            print("bench_ddp_scaling: cleanup: %s" % e, file=sys.stderr)
    if failed:
        head.append("# STOPPED EARLY (%d launches done): %s" % (len(runs), failed.splitlines()[0]))
        print(failed, file=sys.stderr)
    report = build_report(args, figs, runs, head)
    print("\n" + report, end="", flush=True)
    with open(os.path.join(outdir, "report.md"), "w") as f:
        f.write(report)
    if runs:
        result_summary.write_run_summary(outdir, report, "bench_ddp_scaling", command,
                                         "DDP bucket caps and fusebox across cluster sizes")
    print("# written to %s" % outdir)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
