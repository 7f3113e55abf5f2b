#!/usr/bin/env python3
"""Never slower than what the user had: whole runs of plain DDP against DDP + fusebox.

    COMPUTE IS EMULATED DEVICE TIME (perf/devtime.py: the host sleeps, as a
    GPU's host would while its kernels run); COMMUNICATION IS REAL (DDP's gloo
    allreduce between 2 ranks). With a shaped link the ranks are 2 network
    namespaces joined by a veth pair with a tbf qdisc; both share this machine's
    cores. Label every number from it as such.

The question: a user who adds fusebox.torch.register(model) to the DDP they
built (their bucket_cap_mb) pays for fusebox's tuning (its first ~50 steps:
profiling, screening, verification) and for its later checks. Is the WHOLE run,
tuning included, ever slower than the same run without fusebox?

For every user cap in --caps (DDP's bucket_cap_mb, MiB) and each of --runs
runs, two jobs of 2 ranks each (perf/trust_worker.py) train the device-time
model (--profile) for --steps steps from the same weights on the same batches:

    plain    DistributedDataParallel(model, bucket_cap_mb=cap)
    fusebox  the same + fusebox.torch.register(ddp, cache_dir=False, seed=SEED)
             (no policy cache: every run tunes from scratch; SEED is drawn
             from --seed, logged and stored so a run can be replayed)

This machine is shared: two launches of one plan minutes apart differ by up to
10% here, more than the 2% in question. So the two jobs of a run are started
together and take turns of --turn-steps steps (perf/trust_launch.py's
TurnTaker): one runs a turn while the other waits between two steps, in ABBA
order (the run's first job alternates from run to run and cap to cap), and
each job's steps see the machine's spells alike. A wait is outside every
step's time, and fusebox's own step timing leaves it out (handle.paused()), so
that its tuning sees the steps it would see alone. Runs go run by run over all
caps (run 1 of every cap, then run 2, ...). Each rank stamps
time.perf_counter() at every step's start and end; per step the slowest rank
counts, and a job's total is the sum of its steps (process start, process
group and DDP construction are outside it).

Report, per cap, one row per run: the whole-run ratio fusebox / plain (tuning
included) with its paired 95% interval over turns (trust_report.paired_ratio_ci),
the steady-state ratio (median step over the last third of the
steps), what fusebox decided ("kept yours", "replaced with <plan>", "fell back
to yours"), its tuning iterations and fallbacks, and the judged ratio. Then per cap: the median
whole-run ratio with a distribution-free 95% interval over runs (order
statistics; the coverage reached is stated: with 5 runs it is [min, max] at
93.8%, 95% needs 6 runs or more), how many runs are within the target
(whole-run ratio <= 1.02), and the steady-state median ratio. Last, the
target: "whole run <= 1.02x plain DDP", PASS only if every run is within.

Did fusebox keep the best plan it measured? Its own samples cannot say (they
chose the winner, so they favour it). After each fusebox job's timed run, the
same job judges apart (perf/trust_worker.py's judge()), alone on the machine:
every plan the tuner measured runs alone (no regression checks) in
--judge-blocks blocks of --judge-steps timed steps, each block in a fresh
random order, and the best plan other than the kept one is selected; then the
kept plan and that one run in --judge-final-blocks ABBA blocks of their own
(--judge-final-steps timed steps a visit).
"kept / best" is the kept plan's median step over the other's on those last
blocks only (a selection's minimum over many noisy medians is lower than the
best plan's true time; measured again on other steps, it is not). The target
"kept plan <= 1.02x the best" passes in 19 of 20 runs or more (95%).

A check: plain and fusebox runs see the same losses step for step (fusebox
changes when gradients are reduced, not what; on 2 ranks bit for bit).

Scales (defaults): --compute-scale makes the profile's forward + backward
device time about 80 ms (resnet50: x1.984, forward 26.7 ms, backward 53.3 ms);
--param-scale makes one allreduce of all gradients take about as long as
backward over the link (2 ranks: each sends about the gradient bytes each way;
payload about 95% of the tc rate): at 1gbit, about 6.0 MiB of gradients for
resnet50 (x0.0619; so caps of 25 and 100 MiB both give one bucket after DDP's
first, 1 MiB one). For --link loopback the 1gbit figure is used (loopback is
not shaped: its communication is bounded by the CPU). The chosen figures are
printed at the start.

How long it takes: runs x caps x 2 launches x (steps x step time + about 6 s
to start a launch). A step takes between forward + max(backward, allreduce) and
forward + backward + allreduce (about 80 to 133 ms with the defaults; a smoke
run measured 129 ms for plain DDP at 25 MiB over 1gbit), so the default
5 runs x 4 caps x 2 x (300 x 0.08-0.133 s + ~6 s) is about 20 to 31 minutes.
--dry-run prints the figures and the estimate for given settings; a run prints
them at its start.

Output, in --out (default build/bench-out/trust/<timestamp>/): raw/*.json
(each run's two launches, written as soon as the run is done: step times of
both ranks, losses, fusebox's snapshot fields, seed, order), logs/ (each rank's
stdout and stderr), report.md (the printed report) and result.json (the
compact summary for a results page, perf/results.py). Shaped links need root
(ip netns, tc); the namespaces (fbbenchA, fbbenchB, shared with
perf/bench_ddp_hook.py, so not both at once) are deleted on exit, on failure
and on SIGINT/SIGTERM/SIGHUP; only the rank processes it started are killed.

    sudo /usr/bin/python3 perf/bench_trust.py                     # the full run
    /usr/bin/python3 perf/bench_trust.py --link loopback --caps 5 --runs 1 --steps 60 \\
        --compute-scale 0.5                                       # a quick look
"""
import argparse
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

import netns  # perf/netns.py: namespaces, shaping, ports, rank processes
from trust_launch import WORKER, Launcher  # noqa: F401  perf/trust_launch.py (and bench_rollback)
from trust_report import (  # noqa: F401  perf/trust_report.py; bench_rollback uses them here
    TARGET, add_judge_arguments, analyze_run, caption, check_judge_arguments, format_report,
    short_decision, steady_ms)
import results as result_summary  # perf/results.py: the results convention

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPUTE_TARGET_MS = 80.0     # forward + backward device time the default compute scale gives
PAYLOAD = 0.95               # TCP payload per byte of the tc rate (headers)
LOOPBACK_NOMINAL = "1gbit"   # the rate the default param scale assumes on loopback
LAUNCH_OVERHEAD_S = 6.0      # starting a launch: interpreters, torch, process group, DDP
JUDGED_PLANS = 6             # plans a tuner measures, for the estimate (caps, planner's)


def rate_bits(rate):
    """A tc rate ("300mbit", "1gbit", "500kbit", "2.5gbit") in bits per second
    (tc's units here are decimal)."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kmg]?)bit", rate)
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


# ---------------------------------------------------------------- scales

def choose_scales(args):
    """Fills args.compute_scale and args.param_scale where left to the default;
    returns the figures to print (and to store)."""
    import devtime  # imports torch: only here, after the argument checks
    profile = devtime.load_profile(args.profile)
    fwd_us, bwd_us = float(profile["forward_us"]), float(profile["backward_us"])
    auto_compute = args.compute_scale is None
    if auto_compute:
        args.compute_scale = round(COMPUTE_TARGET_MS * 1e3 / (fwd_us + bwd_us), 3)
    fwd_s, bwd_s = fwd_us * args.compute_scale * 1e-6, bwd_us * args.compute_scale * 1e-6
    nominal = LOOPBACK_NOMINAL if args.link == "loopback" else args.link
    payload_bps = rate_bits(nominal) / 8 * PAYLOAD
    full = devtime.DeviceTimeModel(profile, compute_scale=0.0, param_scale=1.0).profile_summary()
    auto_param = args.param_scale is None
    if auto_param:
        # 2 ranks: a ring allreduce sends (2 (n-1) / n) x bytes = bytes each way.
        args.param_scale = float("%.3g" % (bwd_s * payload_bps / full["param_bytes"]))
    model = devtime.DeviceTimeModel(profile, compute_scale=args.compute_scale,
                                    param_scale=args.param_scale)
    s = model.profile_summary()
    comm_s = s["scaled_param_bytes"] / payload_bps
    step_low = fwd_s + max(bwd_s, comm_s)
    step_high = fwd_s + bwd_s + comm_s
    launches = 2 * args.runs * len(args.caps)
    # Judging: about (JUDGED_PLANS plans x blocks + 2 x final blocks) x (steps + 2)
    # after each fusebox run. (Drivers that share these scales and judge
    # nothing have no judge_blocks.)
    blocks, steps = getattr(args, "judge_blocks", 0), getattr(args, "judge_steps", 0)
    final = (2 * args.judge_final_blocks * (args.judge_final_steps + 2)) if blocks else 0
    judged = args.runs * len(args.caps) * (JUDGED_PLANS * blocks * (steps + 2) + final)
    est = [launches * (args.steps * t + LAUNCH_OVERHEAD_S) + judged * t
           for t in (step_low, step_high)]
    return {
        "profile": s["model"], "tensors": s["tensors"],
        "compute_scale": args.compute_scale, "compute_scale_auto": auto_compute,
        "param_scale": args.param_scale, "param_scale_auto": auto_param,
        "forward_ms": fwd_s * 1e3, "backward_ms": bwd_s * 1e3,
        "gradient_bytes": s["scaled_param_bytes"], "profile_gradient_bytes": s["param_bytes"],
        "rate": nominal, "rate_nominal_only": args.link == "loopback",
        "payload_bytes_per_s": payload_bps, "allreduce_ms": comm_s * 1e3,
        "step_ms_range": [step_low * 1e3, step_high * 1e3],
        "launches": launches, "estimate_s": est,
    }


def duration(low_s, high_s):
    if high_s < 120:
        return "%.0f-%.0f s" % (low_s, high_s)
    return "%.0f-%.0f minutes" % (low_s / 60, high_s / 60)


def describe_scales(f, args):
    mib = 2.0 ** 20
    link = ("loopback (127.0.0.1, NOT shaped; the scales assume %s)" % f["rate"]
            if f["rate_nominal_only"] else
            "%s (tbf on a veth pair between 2 network namespaces)" % f["rate"])
    return [
        "model: %s profile, %d tensors; EMULATED device time (the host sleeps)"
        % (f["profile"], f["tensors"]),
        "compute scale x%g%s: forward %.1f ms, backward %.1f ms of device time per step"
        % (f["compute_scale"], " (default: forward + backward ~%g ms)" % COMPUTE_TARGET_MS
           if f["compute_scale_auto"] else "", f["forward_ms"], f["backward_ms"]),
        "param scale x%g%s: %.2f MiB of gradients (profile: %.1f MiB)"
        % (f["param_scale"], " (default: one allreduce ~ backward)" if f["param_scale_auto"]
           else "", f["gradient_bytes"] / mib, f["profile_gradient_bytes"] / mib),
        "link: %s; one allreduce of every gradient ~%.1f ms at %.1f MB/s of payload "
        "(%.0f%% of the rate), %.2fx backward"
        % (link, f["allreduce_ms"], f["payload_bytes_per_s"] / 1e6, PAYLOAD * 100,
           f["allreduce_ms"] / f["backward_ms"] if f["backward_ms"] else float("inf")),
        "estimated step %.0f-%.0f ms; %d launches of %d steps (+ ~%g s each to start), "
        "judging %d blocks x %d steps: about %s"
        % (f["step_ms_range"][0], f["step_ms_range"][1], f["launches"], args.steps,
           LAUNCH_OVERHEAD_S, getattr(args, "judge_blocks", 0), getattr(args, "judge_steps", 0),
           duration(*f["estimate_s"])),
    ]


# ---------------------------------------------------------------- command line

def parse_caps(text):
    caps = []
    for part in text.split(","):
        try:
            cap = float(part)
        except ValueError:
            raise ValueError("%r is not a number of MiB" % part) from None
        if not (cap > 0 and cap <= 4096) or cap != cap:
            raise ValueError("%r: a cap must be more than 0 and at most 4096 MiB" % part)
        if cap in caps:
            raise ValueError("%r appears twice" % part)
        caps.append(cap)
    return caps


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--caps", default="1,5,25,100",
                    help="the users' DDP bucket_cap_mb values, MiB, comma separated (default: "
                         "%(default)s)")
    ap.add_argument("--runs", type=int, default=5,
                    help="runs per cap, each one plain and one fusebox launch (default: "
                         "%(default)s)")
    ap.add_argument("--steps", type=int, default=300,
                    help="training steps per launch; fusebox tunes in about the first 50, so "
                         "fewer than ~60 leave it tuning (default: %(default)s)")
    ap.add_argument("--link", default="1gbit",
                    help="a tc rate such as 1gbit or 300mbit (2 network namespaces, needs "
                         "root), or loopback (default: %(default)s)")
    ap.add_argument("--profile", default="resnet50",
                    help="a profile name in autotune/profiles/ or a profile file (default: "
                         "%(default)s)")
    ap.add_argument("--compute-scale", type=float, default=None,
                    help="device-time scale; default: forward + backward about %g ms"
                         % COMPUTE_TARGET_MS)
    ap.add_argument("--param-scale", type=float, default=None,
                    help="parameter-size scale; default: one allreduce of every gradient about "
                         "as long as backward over --link (loopback: over %s)" % LOOPBACK_NOMINAL)
    ap.add_argument("--turn-steps", type=int, default=10, metavar="K",
                    help="the plain and the fusebox job of a run take turns of K steps "
                         "(default: %(default)s)")
    ap.add_argument("--judge-blocks", type=int, default=3, metavar="B",
                    help="after each fusebox run, B interleaved blocks that time every plan "
                         "its tuner measured alone and select the best other than the kept "
                         "one (0: no judging; default: %(default)s)")
    add_judge_arguments(ap)
    ap.add_argument("--seed", type=int, default=None,
                    help="draws fusebox's per-run tuner seeds (default: a fresh one, printed "
                         "and stored)")
    ap.add_argument("--out", default=None,
                    help="output directory (default: build/bench-out/trust/<timestamp>/)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"),
                    help="the build directory; its python/ holds fusebox.torch (default: the "
                         "repository's build/)")
    ap.add_argument("--python", default=netns.PYTHON,
                    help="the Python with torch that runs the ranks (default: %(default)s)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the chosen scales and the time estimate, then stop (no root "
                         "needed, nothing launched)")
    ap.add_argument("--report-from", metavar="DIR", default=None,
                    help="launch nothing: analyse a finished run's DIR/raw/*.json again with "
                         "this checkout's perf/trust_report.py and write DIR/report.md and "
                         "DIR/result.json anew (the run's command, commit and date kept)")
    ap.add_argument("--timeout", type=int, default=900,
                    help="seconds one launch may take before the run fails (default: "
                         "%(default)s)")
    args = ap.parse_args(argv)
    try:
        args.caps = parse_caps(args.caps)
    except ValueError as e:
        ap.error("--caps: %s (expected e.g. 1,5,25,100)" % e)
    if args.link != "loopback" and not netns.RATE.match(args.link):
        ap.error("--link %r is neither 'loopback' nor a tc rate like 300mbit or 1gbit"
                 % args.link)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    check_judge_arguments(ap, args)
    if not 1 <= args.turn_steps <= args.steps:
        ap.error("--turn-steps must be between 1 and --steps")
    if args.steps < 6:
        ap.error("--steps must be at least 6 (the steady state is the last third)")
    for name in ("compute_scale", "param_scale"):
        v = getattr(args, name)
        if v is not None and not (v > 0 and v < 1e6):
            ap.error("--%s must be a positive number" % name.replace("_", "-"))
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2 ** 31)
    return args


def preflight(args):
    """Fails at once, with what to do, when the run could not finish."""
    if args.link != "loopback":
        if os.geteuid() != 0:
            sys.exit("bench_trust: --link %s needs root (ip netns, tc): run it with sudo, or "
                     "use --link loopback" % args.link)
        present = netns.namespaces_present()
        if present:
            sys.exit("bench_trust: network namespace(s) %s exist already (another run of this "
                     "or perf/bench_ddp_hook.py, or one that was killed): delete them with "
                     "'ip netns del NAME' if they are not in use" % ", ".join(present))
    pydir = os.path.join(os.path.abspath(args.build), "python")
    if not os.path.isdir(pydir):
        sys.exit("bench_trust: %s does not exist: build fusebox first (bash scripts/build.sh) "
                 "or name the build directory with --build" % pydir)
    check = subprocess.run([args.python, "-c", "import fusebox.torch"], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=pydir))
    if check.returncode != 0:
        sys.exit("bench_trust: %s cannot import fusebox.torch from %s (build it: bash "
                 "scripts/build.sh):\n%s" % (args.python, pydir, check.stderr.strip()))


def exit_on_signal(signum, frame):
    """SIGTERM/SIGHUP: unwind, so that the ranks are killed and the namespaces deleted."""
    print("bench_trust: %s: stopping (finished runs are kept)" % signal.Signals(signum).name,
          file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def report_again(outdir):
    """--report-from: the report and summary of a finished run, from its raw files."""
    raws = []
    for name in sorted(os.listdir(os.path.join(outdir, "raw"))):
        if name.endswith(".json"):
            with open(os.path.join(outdir, "raw", name)) as f:
                raws.append(json.load(f))
    if not raws:
        sys.exit("bench_trust: %s/raw holds no run" % outdir)
    first = raws[0]
    plain, fused = first["launches"]["plain"], first["launches"]["fusebox"]
    judge = fused.get("judge") or {}
    args = argparse.Namespace(
        caps=sorted({r["cap_mb"] for r in raws}), runs=max(r["run"] for r in raws),
        steps=plain["steps"], link=first["link"], profile=first["scales"]["profile"],
        compute_scale=first["scales"]["compute_scale"],
        param_scale=first["scales"]["param_scale"],
        judge_blocks=judge.get("blocks", 0), judge_steps=judge.get("steps", 0),
        judge_final_blocks=judge.get("final_blocks"),
        judge_final_steps=judge.get("final_steps", judge.get("steps", 0)))
    runs_by_cap = {cap: [] for cap in args.caps}
    for r in sorted(raws, key=lambda r: (r["run"], r["cap_mb"])):
        result = analyze_run(r["launches"]["plain"], r["launches"]["fusebox"])
        result.update(cap=r["cap_mb"], run=r["run"], order=", ".join(r["order"]),
                      requested_seed=r["seed"])
        runs_by_cap[r["cap_mb"]].append(result)
    old = {}
    if os.path.exists(os.path.join(outdir, "result.json")):
        with open(os.path.join(outdir, "result.json")) as f:
            old = json.load(f)
    with open(os.path.join(outdir, "report.md")) as f:
        head = [line.rstrip("\n") for line in f if line.startswith("# ")]
    report = "\n".join(head) + "\n\n" + format_report(args, runs_by_cap)
    print(report, end="")
    with open(os.path.join(outdir, "report.md"), "w") as f:
        f.write(report)
    summary = result_summary.make_summary(
        report, "bench_trust", old.get("command") or head[0][2:],
        "whole runs: plain DDP vs DDP + fusebox", old.get("commit", "unknown"),
        old.get("date") or time.strftime("%Y-%m-%d"), old.get("machine") or
        result_summary.this_machine())
    result_summary.write_summary(os.path.join(outdir, "result.json"), summary)


def main(argv=None):
    args = parse_args(argv)
    if args.report_from:
        report_again(args.report_from)
        return
    if not args.dry_run:
        preflight(args)
    try:
        figures = choose_scales(args)
    except ValueError as e:
        sys.exit("bench_trust: --profile: %s" % e)
    if args.dry_run:
        print("\n".join(describe_scales(figures, args)))
        return
    command = shlex.join([sys.executable] + (sys.argv if argv is None else
                                             [sys.argv[0]] + list(argv)))
    outdir = args.out or os.path.join(REPO, "build", "bench-out", "trust",
                                      time.strftime("%Y%m%d-%H%M%S"))
    for sub in ("raw", "logs"):
        os.makedirs(os.path.join(outdir, sub), exist_ok=True)
    head = ["# %s" % command,
            "# started %s on %s (%d CPUs); ranks: %s %s; seed %d" % (
                time.strftime("%Y-%m-%d %H:%M:%S"), socket.gethostname(), os.cpu_count() or 0,
                args.python, os.path.relpath(WORKER, REPO), args.seed)]
    head += ["# " + line for line in describe_scales(figures, args)]
    print("\n".join(head), flush=True)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, exit_on_signal)
    seeds = random.Random(args.seed)
    launcher = Launcher(args, outdir)
    runs_by_cap = {cap: [] for cap in args.caps}
    shaped = args.link != "loopback"
    try:
        if shaped:
            netns.setup(args.link)
        for run in range(1, args.runs + 1):
            for index, cap in enumerate(args.caps):
                seed = seeds.randrange(1, 2 ** 63)
                order = (("plain", "fusebox") if (run + index) % 2 == 1
                         else ("fusebox", "plain"))
                tag = "cap%g-run%d" % (cap, run)
                launches, given = launcher.run_in_turns(tag, cap, seed, order)
                result = analyze_run(launches["plain"], launches["fusebox"])
                result.update(cap=cap, run=run, order=", ".join(order),
                              requested_seed=seed)
                with open(os.path.join(outdir, "raw", tag + ".json"), "w") as f:
                    json.dump({"cap_mb": cap, "run": run, "order": list(order),
                               "seed": seed, "link": args.link, "scales": figures,
                               "turns": given,
                               "analysis": result, "launches": launches}, f)
                runs_by_cap[cap].append(result)
                print("# cap %g MiB run %d (%s): plain %.2f s, fusebox %.2f s, ratio %.3f, "
                      "steady %.3f; %s" % (cap, run, ", ".join(order), result["plain_total_s"],
                                           result["fusebox_total_s"], result["ratio"],
                                           result["steady_ratio"], result["decision"]),
                      flush=True)
    except RuntimeError as e:
        sys.exit("bench_trust: %s" % e)
    except KeyboardInterrupt:
        sys.exit("bench_trust: interrupted (finished runs are in %s)" % outdir)
    finally:
        launcher.kill()
        if shaped:
            netns.teardown()
    report = "\n".join(head) + "\n\n" + format_report(args, runs_by_cap)
    print("\n" + format_report(args, runs_by_cap), end="", flush=True)
    with open(os.path.join(outdir, "report.md"), "w") as f:
        f.write(report)
    result_summary.write_run_summary(outdir, report, "bench_trust",
                                     command, "whole runs: plain DDP vs DDP + fusebox")
    print("# written to %s" % outdir)


if __name__ == "__main__":
    main()
