#!/usr/bin/env python3
"""Side-by-side allreduce benchmark: fusebox UCX vs OpenMPI MPI_Allreduce vs PyTorch Gloo.

Runs, in one invocation, for every world size in --ranks (float32 sum, -b .. -e bytes):

  ucx    <build>/tools/fusebox-run -n N -- <build>/perf/fusebox-perf allreduce --backend ucx ...
  mpi    mpirun -n N --oversubscribe <build>/perf/baselines/fusebox-mpi-allreduce ...
         (plain MPI_Allreduce, OpenMPI's own default transport: ob1 + vader)
  gloo   /usr/bin/python3 perf/baselines/gloo_allreduce.py --nranks N ...   (torch.distributed)
  fbmpi  mpirun -n N --oversubscribe <build>/perf/fusebox-perf allreduce --backend mpi ...
         (only with --with-fusebox-mpi)

and once per repeat <build>/perf/baselines/fusebox-memcpy-bw (single-thread memcpy, 64 MB).
Every tool gets the same "-b B -e E -f F -n N -w W -d float -o sum --json PATH" and writes
fusebox-perf's JSON schema. Each tool is run --repeats times (interleaved, in rotating order,
because the machine is noisy) and the median time per size is kept; algbw/busbw are recomputed
from that median (nccl-tests: algbw = bytes / time, GB = 1e9; busbw = algbw * 2(p-1)/p).

The target sizes (8 B and 64 MiB) are always measured when they lie in [-b, -e], even when the
geometric sweep skips them (-f 4 from 8 B reaches 32 MiB, not 64 MiB): an extra run with
"-b S -e S" covers each missing one.

A dedicated 8 B run per tool with -n --latency-iters (default 1000) -w --latency-warmup feeds the
latency target (20 iterations of a ~1 us call are mostly noise); it is the "8 (lat)" row (not run
for Gloo, whose 8 B time is in its sweep).

Prints one table per world size and a "Targets" section (the issue's acceptance criteria):
  64 MiB busbw  ucx/mpi >= 2.0 with 2 ranks,  >= 1.5 with 4 ranks
  64 MiB busbw  ucx / memcpy >= 0.35 with 2 ranks
  8 B latency   ucx/mpi <= 2.0 with 2 ranks
and writes <out>/report.md, <out>/summary.json, every tool's JSON and every run's log.

Command templates (--ucx-cmd, --mpi-cmd, --gloo-cmd, --fbmpi-cmd, --memcpy-cmd) replace the
default command prefix of a tool; they are split like a shell line and may use {n} (world
size), {build}, {repo}, {mpirun}, {python}. The common arguments are appended. E.g. to try the
runner before fusebox-perf exists:
  --ucx-cmd '{mpirun} -n {n} --oversubscribe {build}/perf/baselines/fusebox-mpi-allreduce'

Exit status: 0 when every run succeeded with no wrong element (targets FAIL too only with
--strict), 1 when a run failed or reported wrong results, 2 on a usage error or a missing binary.
Only the Python standard library is used.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MIB = 1 << 20
TARGET_SMALL = 8
TARGET_LARGE = 64 * MIB
LAT_KEY = -TARGET_SMALL  # stats key of the dedicated 8 B latency run
LAT_TOOLS = ("ucx", "mpi", "fbmpi")  # Gloo's 8 B time (~0.3-2 ms) is in its sweep already

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

TOOL_LABELS = {
    "ucx": "fusebox UCX",
    "mpi": "MPI_Allreduce (OpenMPI default)",
    "gloo": "PyTorch Gloo",
    "fbmpi": "fusebox MPI backend",
}


# ----------------------------------------------------------------------------- sizes

def parse_size(text):
    t = str(text).strip()
    if len(t) > 1 and t[-1] in "bB" and t[-2].isalpha():
        t = t[:-1]
    mult = 1
    if t and t[-1].upper() in "KMG":
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[t[-1].upper()]
        t = t[:-1]
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError("bad size: %r" % text)
    if v < 0:
        raise argparse.ArgumentTypeError("negative size: %r" % text)
    return int(v * mult)


def fmt_size(b):
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d%s" % (b // m, unit)
    return str(b)


def sweep(min_bytes, max_bytes, factor):
    """The sizes fusebox-perf and the baselines visit (nccl-tests -b/-e/-f), floats only."""
    out = []
    s = float(max(min_bytes, 1))
    while s <= max_bytes * (1 + 1e-12):
        b = int(s + 0.5)
        if b // 4 > 0 and (not out or out[-1] != b):
            out.append(b)
        s *= factor
    return [b // 4 * 4 for b in out]


# ----------------------------------------------------------------------------- commands

class Tool:
    def __init__(self, key, prefix_fn, needs, mpi):
        self.key = key
        self.prefix_fn = prefix_fn  # n -> argv prefix
        self.needs = needs          # paths / programs that must exist
        self.mpi = mpi


def expand_template(template, n, ctx):
    vals = dict(ctx, n=n)
    return [tok.format(**vals) for tok in shlex.split(template)]


def template_needs(template, ctx):
    toks = expand_template(template, 0, ctx)
    needs = [toks[0]] if toks else []
    needs += [t for t in toks[1:] if "/" in t and not t.startswith("-") and "=" not in t]
    return needs


def build_tools(args):
    b = args.build
    ctx = {"build": b, "repo": REPO, "mpirun": args.mpirun, "python": args.python}
    perf = os.path.join(b, "perf", "fusebox-perf")
    launcher = os.path.join(b, "tools", "fusebox-run")
    mpi_bin = os.path.join(b, "perf", "baselines", "fusebox-mpi-allreduce")
    gloo_py = os.path.join(REPO, "perf", "baselines", "gloo_allreduce.py")
    memcpy_bin = os.path.join(b, "perf", "baselines", "fusebox-memcpy-bw")

    defaults = {
        "ucx": (lambda n: [launcher, "-n", str(n), "--", perf, "allreduce", "--backend", "ucx"],
                [launcher, perf], False),
        "mpi": (lambda n: [args.mpirun, "-n", str(n), "--oversubscribe", mpi_bin],
                [args.mpirun, mpi_bin], True),
        "gloo": (lambda n: [args.python, gloo_py, "--nranks", str(n)],
                 [args.python, gloo_py], False),
        "fbmpi": (lambda n: [args.mpirun, "-n", str(n), "--oversubscribe", perf, "allreduce",
                             "--backend", "mpi"],
                  [args.mpirun, perf], True),
        "memcpy": (lambda n: [memcpy_bin], [memcpy_bin], False),
    }
    overrides = {"ucx": args.ucx_cmd, "mpi": args.mpi_cmd, "gloo": args.gloo_cmd,
                 "fbmpi": args.fbmpi_cmd, "memcpy": args.memcpy_cmd}
    tools = {}
    for key, (fn, needs, mpi) in defaults.items():
        tmpl = overrides.get(key)
        if tmpl:
            tools[key] = Tool(key, (lambda t: lambda n: expand_template(t, n, ctx))(tmpl),
                              template_needs(tmpl, ctx), True)
        else:
            tools[key] = Tool(key, fn, needs, mpi)
    return tools


def missing_paths(needs):
    out = []
    for p in needs:
        if os.sep in p:
            if not (os.path.isfile(p) and os.access(p, os.X_OK)) and not (
                    p.endswith(".py") and os.path.isfile(p)):
                out.append(p)
        elif shutil.which(p) is None:
            out.append(p)
    return out


# ----------------------------------------------------------------------------- running

def run_cmd(argv, log_path, timeout, env):
    """Runs argv in its own process group; returns (rc, seconds). Kills only that group."""
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ %s\n" % " ".join(shlex.quote(a) for a in argv))
        log.flush()
        try:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
        except OSError as e:
            log.write("cannot start: %s\n" % e)
            return 127, 0.0
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            log.write("\n[bench_allreduce] timed out after %d s\n" % timeout)
            rc = 124
    return rc, time.monotonic() - t0


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------------------- statistics

def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if n == 0:
        return None
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def bw_from_time(nbytes, time_us, nranks):
    if not time_us or time_us <= 0:
        return 0.0, 0.0
    algbw = nbytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * 2.0 * (nranks - 1) / nranks


def summarize(samples, nbytes, nranks, prefer):
    """samples: list of result entries for one (tool, N, size). Returns the chosen mode's median
    or None. Uses `prefer` ('oop'/'ip') when every sample has it, else the other mode."""
    for mode in (prefer, "ip" if prefer == "oop" else "oop"):
        ms = [s.get(mode) for s in samples]
        ms = [m for m in ms if isinstance(m, dict) and m.get("time_us") is not None]
        if not ms:
            continue
        t = median([float(m["time_us"]) for m in ms])
        algbw, busbw = bw_from_time(nbytes, t, nranks)
        return {"mode": mode, "time_us": t, "algbw": algbw, "busbw": busbw,
                "wrong": max(int(m.get("wrong", 0) or 0) for m in ms),
                "samples_time_us": [float(m["time_us"]) for m in ms],
                "samples_busbw": [bw_from_time(nbytes, float(m["time_us"]), nranks)[1]
                                  for m in ms]}
    return None


# ----------------------------------------------------------------------------- formatting

def fmt_time(t):
    if t is None:
        return "-"
    if t >= 1000:
        return "%.0f" % t
    if t >= 100:
        return "%.1f" % t
    return "%.2f" % t


def fmt_bw(x):
    if x is None:
        return "-"
    if x >= 0.1:
        return "%.2f" % x
    return "%.3g" % x


def fmt_ratio(x):
    return "-" if x is None else "%.2fx" % x


def md_table(header, rows, align):
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join((" ---: " if a == "r" else " --- ") for a in align) + "|"]
    for r in rows:
        out.append("| " + " | ".join(r) + " |")
    return "\n".join(out)


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(
        description="fusebox UCX vs MPI_Allreduce vs PyTorch Gloo, side by side.",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(REPO, "build"),
                   help="CMake build directory (default: <repo>/build)")
    p.add_argument("--ranks", default="2,4", help="world sizes, comma-separated (default 2,4)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=64 * MIB)
    p.add_argument("-f", "--stepfactor", type=float, default=4.0,
                   help="size factor (default 4; 8 B and 64 MiB are measured regardless)")
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("--latency-iters", type=int, default=1000,
                   help="iterations of the dedicated 8 B latency run that the latency target "
                        "uses (default 1000; 0: use the sweep's 8 B numbers)")
    p.add_argument("--latency-warmup", type=int, default=100,
                   help="warm-up iterations of the 8 B latency run (default 100)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of each tool; the median time per size is kept (default 3)")
    p.add_argument("--out", default=None,
                   help="directory for JSON, logs and report.md "
                        "(default <build>/bench-out/<timestamp>)")
    p.add_argument("--mode", choices=["oop", "ip"], default="oop",
                   help="numbers to compare: out-of-place (default) or in-place; a tool lacking "
                        "the mode (Gloo has in-place only) falls back to the other, as marked")
    p.add_argument("--tools", default="ucx,mpi,gloo",
                   help="subset of ucx,mpi,gloo to run (default all three)")
    p.add_argument("--with-fusebox-mpi", action="store_true",
                   help="also run fusebox-perf --backend mpi under mpirun (column 'fbmpi')")
    p.add_argument("--memcpy-size", type=parse_size, default=64 * MIB)
    p.add_argument("--python", default="/usr/bin/python3",
                   help="Python that imports torch (default /usr/bin/python3)")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run (default 900)")
    p.add_argument("--allow-missing", action="store_true",
                   help="skip a tool whose binary is missing instead of stopping")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target FAILs")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    for key in ("ucx", "mpi", "gloo", "fbmpi", "memcpy"):
        p.add_argument("--%s-cmd" % key, default=None, metavar="TEMPLATE",
                       help=argparse.SUPPRESS if key != "ucx" else
                       "replace the ucx command prefix (also --mpi-cmd, --gloo-cmd, "
                       "--fbmpi-cmd, --memcpy-cmd); see below")
    args = p.parse_args(argv)
    try:
        args.ranks = [int(x) for x in args.ranks.split(",") if x.strip()]
    except ValueError:
        p.error("--ranks wants integers, e.g. 2,4")
    if not args.ranks or min(args.ranks) < 1:
        p.error("--ranks wants positive integers")
    if args.stepfactor <= 1:
        p.error("-f must be > 1")
    if args.minbytes > args.maxbytes:
        p.error("-b is larger than -e")
    if args.repeats < 1 or args.iters < 1 or args.warmup_iters < 0:
        p.error("bad --repeats / -n / -w")
    args.tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    for t in args.tools:
        if t not in ("ucx", "mpi", "gloo"):
            p.error("--tools: unknown tool %r" % t)
    if args.with_fusebox_mpi:
        args.tools.append("fbmpi")
    args.build = os.path.abspath(args.build)
    if args.out is None:
        args.out = os.path.join(args.build, "bench-out",
                                datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    args.out = os.path.abspath(args.out)
    return args


def git_rev():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv=None):
    args = parse_args(argv)
    tools = build_tools(args)

    # Binaries first: fail before spending minutes on the others.
    wanted = list(args.tools) + ["memcpy"]
    missing = {k: missing_paths(tools[k].needs) for k in wanted}
    missing = {k: v for k, v in missing.items() if v}
    if missing:
        for k, paths in missing.items():
            print("bench_allreduce: %s: missing %s" % (k, ", ".join(paths)), file=sys.stderr)
        print("bench_allreduce: build with e.g. 'ninja -C %s fusebox-perf fusebox-run "
              "fusebox-mpi-allreduce fusebox-memcpy-bw' (build dir: --build)" % args.build,
              file=sys.stderr)
        if not args.allow_missing:
            print("bench_allreduce: stopping (use --allow-missing to skip those tools)",
                  file=sys.stderr)
            return 2
        wanted = [k for k in wanted if k not in missing]
        print("bench_allreduce: --allow-missing: skipping %s" % ", ".join(sorted(missing)),
              file=sys.stderr)
    coll_tools = [k for k in wanted if k != "memcpy"]

    sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor)
    extra = [s for s in (TARGET_SMALL, TARGET_LARGE)
             if args.minbytes <= s <= args.maxbytes and s not in sizes]
    all_sizes = sorted(set(sizes) | set(extra))

    if not args.dry_run:
        os.makedirs(os.path.join(args.out, "json"), exist_ok=True)
        os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    env = dict(os.environ)
    env.update(MPI_ENV)

    lat_run = args.latency_iters > 0 and args.minbytes <= TARGET_SMALL <= args.maxbytes

    def common(lo, hi, json_path, iters=None, warmup=None):
        return ["-b", str(lo), "-e", str(hi), "-f", "%g" % args.stepfactor,
                "-n", str(iters or args.iters),
                "-w", str(args.warmup_iters if warmup is None else warmup),
                "-d", "float", "-o", "sum", "--json", json_path]

    # The plan: (rep, tool, n, lo, hi, tag). Repeats interleaved, tool order rotated.
    plan = []
    for rep in range(args.repeats):
        if "memcpy" in wanted:
            plan.append((rep, "memcpy", 1, None, None, "memcpy"))
        for n in args.ranks:
            order = coll_tools[rep % len(coll_tools):] + coll_tools[:rep % len(coll_tools)] \
                if coll_tools else []
            for k in order:
                plan.append((rep, k, n, args.minbytes, args.maxbytes, "sweep"))
                for s in extra:
                    plan.append((rep, k, n, s, s, fmt_size(s)))
                if lat_run and k in LAT_TOOLS:
                    plan.append((rep, k, n, TARGET_SMALL, TARGET_SMALL, "lat"))

    commands_seen = {}
    runs = []  # dicts: rep, tool, n, tag, rc, secs, json, log
    t_start = time.monotonic()
    load_start = os.getloadavg()
    for i, (rep, k, n, lo, hi, tag) in enumerate(plan):
        base = "%s-np%d-r%d-%s" % (k, n, rep, tag) if k != "memcpy" else "memcpy-r%d" % rep
        json_path = os.path.join(args.out, "json", base + ".json")
        log_path = os.path.join(args.out, "logs", base + ".log")
        if k == "memcpy":
            argv = tools[k].prefix_fn(1) + ["--size", str(args.memcpy_size), "--json", json_path]
        elif tag == "lat":
            argv = tools[k].prefix_fn(n) + common(lo, hi, json_path, args.latency_iters,
                                                  args.latency_warmup)
            if k in ("ucx", "fbmpi"):
                # Blocking, like MPI_Allreduce: each call is waited before the
                # next is issued, so the latencies compare like with like.
                argv += ["-z", "1"]
        else:
            argv = tools[k].prefix_fn(n) + common(lo, hi, json_path)
        commands_seen.setdefault((k, n, tag), argv)
        if args.dry_run:
            print(" ".join(shlex.quote(a) for a in argv))
            continue
        if os.path.exists(json_path):
            os.remove(json_path)
        print("[%d/%d] %-6s np=%d rep %d %-6s ..." % (i + 1, len(plan), k, n, rep + 1, tag),
              end="", flush=True)
        rc, secs = run_cmd(argv, log_path, args.timeout, env)
        doc = load_json(json_path)
        status = "ok" if rc == 0 and doc is not None else (
            "rc=%d" % rc if rc != 0 else "no JSON")
        print(" %5.1f s %s" % (secs, status), flush=True)
        if status != "ok":
            print("  command: %s\n  log: %s\n%s" % (" ".join(shlex.quote(a) for a in argv),
                                                    log_path, tail(log_path)), file=sys.stderr)
        runs.append({"rep": rep, "tool": k, "n": n, "tag": tag, "rc": rc, "secs": secs,
                     "json": json_path, "log": log_path, "doc": doc})
    if args.dry_run:
        return 0
    wall = time.monotonic() - t_start
    load_end = os.getloadavg()

    # ------------------------------------------------------------------ aggregate
    memcpy_vals = [r["doc"].get("median_gbps") for r in runs
                   if r["tool"] == "memcpy" and r["doc"] and r["doc"].get("median_gbps")]
    memcpy_gbps = median(memcpy_vals) if memcpy_vals else None

    samples = {}  # (tool, n, bytes) -> [entry]; the 8 B latency runs under bytes LAT_KEY
    for r in runs:
        if r["tool"] == "memcpy" or not r["doc"]:
            continue
        for e in r["doc"].get("results", []):
            b = LAT_KEY if r["tag"] == "lat" else int(e["bytes"])
            samples.setdefault((r["tool"], r["n"], b), []).append(e)
    stats = {}
    for (k, n, b), es in samples.items():
        st = summarize(es, TARGET_SMALL if b == LAT_KEY else b, n, args.mode)
        if st:
            stats[(k, n, b)] = st

    problems = []
    for r in runs:
        if r["rc"] != 0 or r["doc"] is None:
            problems.append("%s np=%d rep %d (%s): %s; log %s" % (
                r["tool"], r["n"], r["rep"] + 1, r["tag"],
                "exit status %d" % r["rc"] if r["rc"] else "no JSON written", r["log"]))
    for (k, n, b), st in sorted(stats.items()):
        if st["wrong"]:
            problems.append("%s np=%d %s B: %d wrong elements" % (
                k, n, "8 (latency run)" if b == LAT_KEY else b, st["wrong"]))

    # ------------------------------------------------------------------ tables
    cols = [k for k in ("ucx", "mpi", "gloo", "fbmpi") if k in coll_tools]
    lines = []
    lines.append("# Allreduce side by side: float32 sum")
    lines.append("")
    lines.append("- date: %s, host: %s (%s, %d CPUs), git: %s" % (
        datetime.datetime.now().isoformat(timespec="seconds"), platform.node(),
        platform.machine(), os.cpu_count() or 0, git_rev() or "?"))
    lines.append("- sweep: -b %s -e %s -f %g%s, -n %d -w %d, %d repeat(s) (median time per size), "
                 "%.0f s wall" % (
                     fmt_size(args.minbytes), fmt_size(args.maxbytes), args.stepfactor,
                     (" (+%s as extra runs)" % ", ".join(fmt_size(s) for s in extra))
                     if extra else "", args.iters, args.warmup_iters, args.repeats, wall))
    lines.append("- memcpy (single thread, %s): %s GB/s (median of %d run(s): %s)" % (
        fmt_size(args.memcpy_size), fmt_bw(memcpy_gbps), len(memcpy_vals),
        ", ".join("%.2f" % v for v in memcpy_vals) or "-"))
    lines.append("- time in us (average per op, averaged across ranks); busbw in GB/s (1e9)")
    ncpu = os.cpu_count() or 1
    lines.append("- load average (1 min): %.1f at start, %.1f at end, on %d CPUs" % (
        load_start[0], load_end[0], ncpu))
    if max(load_start[0], load_end[0]) > 0.5 * ncpu + 0.5:
        lines.append("")
        lines.append("**WARNING: the machine was busy with other work (load %.1f on %d CPUs); "
                     "these numbers are not trustworthy, rerun on an idle machine.**" % (
                         max(load_start[0], load_end[0]), ncpu))
    lines.append("")
    lines.append("Commands (first repeat):")
    lines.append("")
    lines.append("```")
    for (k, n, tag), argv in commands_seen.items():
        lines.append(" ".join(shlex.quote(a) for a in argv))
    lines.append("```")

    for n in args.ranks:
        modes = {}
        for k in cols:
            ms = sorted({stats[(k, n, b)]["mode"] for b in all_sizes if (k, n, b) in stats})
            modes[k] = "/".join(ms) if ms else "-"
        lines.append("")
        lines.append("## %d ranks" % n)
        lines.append("")
        lines.append("Numbers: " + ", ".join("%s %s" % (k, {"oop": "out-of-place",
                                                            "ip": "in-place"}.get(modes[k],
                                                                                  modes[k]))
                                         for k in cols) + ".")
        lines.append("")
        header = ["size"]
        for k in cols:
            header += ["%s time us" % k, "%s busbw" % k]
        if "ucx" in cols:
            header += ["ucx/%s busbw" % k for k in cols if k != "ucx"]
        rows = []
        for b in all_sizes + ([LAT_KEY] if lat_run else []):
            row = [fmt_size(b) if b != LAT_KEY else "8 (lat)"]
            for k in cols:
                st = stats.get((k, n, b))
                mark = "" if not st or not st["wrong"] else " !%d wrong" % st["wrong"]
                row += [fmt_time(st["time_us"]) if st else "-",
                        (fmt_bw(st["busbw"]) + mark) if st else "-"]
            if "ucx" in cols:
                u = stats.get(("ucx", n, b))
                for k in cols:
                    if k == "ucx":
                        continue
                    o = stats.get((k, n, b))
                    ratio = (u["busbw"] / o["busbw"]) if u and o and o["busbw"] > 0 else None
                    row.append(fmt_ratio(ratio))
            rows.append(row)
        lines.append(md_table(header, rows, ["r"] * len(header)))
        if lat_run:
            lines.append("")
            lines.append("8 (lat): a dedicated 8 B run with -n %d -w %d, every call waited "
                         "before the next (fusebox-perf -z 1; MPI_Allreduce blocks anyway); the "
                         "latency target uses it." % (args.latency_iters, args.latency_warmup))

    # ------------------------------------------------------------------ targets
    def stat(k, n, b):
        return stats.get((k, n, b))

    targets = []

    def add_target(name, value, ok_fn, detail, involved=()):
        if value is None:
            targets.append({"target": name, "status": "N/A", "value": None, "detail": detail})
            return
        status = "PASS" if ok_fn(value) else "FAIL"
        if any(st and st["wrong"] for st in involved):
            status, detail = "FAIL", detail + "; WRONG RESULTS"
        targets.append({"target": name, "status": status, "value": value, "detail": detail})

    for n, need in ((2, 2.0), (4, 1.5)):
        u, m = stat("ucx", n, TARGET_LARGE), stat("mpi", n, TARGET_LARGE)
        v = u["busbw"] / m["busbw"] if u and m and m["busbw"] > 0 else None
        add_target("64 MiB busbw ucx/mpi, %d ranks >= %.1fx" % (n, need), v,
                   lambda x, need=need: x >= need,
                   "ucx %s GB/s vs mpi %s GB/s" % (fmt_bw(u and u["busbw"]),
                                                  fmt_bw(m and m["busbw"]))
                   if u and m else "not measured (needs ucx and mpi at 64 MiB, %d ranks)" % n,
                   (u, m))
    u = stat("ucx", 2, TARGET_LARGE)
    v = u["busbw"] / memcpy_gbps if u and memcpy_gbps else None
    add_target("64 MiB busbw ucx / memcpy, 2 ranks >= 35%", v, lambda x: x >= 0.35,
               "ucx %s GB/s vs memcpy %s GB/s" % (fmt_bw(u["busbw"]), fmt_bw(memcpy_gbps))
               if u and memcpy_gbps else "not measured", (u,))
    small = LAT_KEY if lat_run else TARGET_SMALL
    u, m = stat("ucx", 2, small), stat("mpi", 2, small)
    v = u["time_us"] / m["time_us"] if u and m and m["time_us"] > 0 else None
    add_target("8 B latency ucx/mpi, 2 ranks <= 2.0x", v, lambda x: x <= 2.0,
               "ucx %s us vs mpi %s us%s" % (fmt_time(u["time_us"]), fmt_time(m["time_us"]),
                                             " (-n %d run)" % args.latency_iters
                                             if lat_run else "")
               if u and m else "not measured", (u, m))

    lines.append("")
    lines.append("## Targets")
    lines.append("")
    trows = []
    for t in targets:
        val = "-" if t["value"] is None else (
            "%.0f%%" % (100 * t["value"]) if "memcpy" in t["target"] else "%.2fx" % t["value"])
        trows.append([t["status"], t["target"], val, t["detail"]])
    lines.append(md_table(["result", "target", "measured", "detail"], trows,
                          ["l", "l", "r", "l"]))
    lines.append("")
    lines.append("## Problems")
    lines.append("")
    lines.extend(["- " + p for p in problems] or ["none"])
    report = "\n".join(lines) + "\n"

    print()
    print(report)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report)
    summary = {
        "args": {k: v for k, v in vars(args).items()},
        "memcpy_gbps": memcpy_gbps, "memcpy_samples": memcpy_vals,
        "results": [dict(tool=k, nranks=n, bytes=abs(b), latency_run=(b == LAT_KEY), **st)
                    for (k, n, b), st in sorted(stats.items())],
        "targets": targets, "problems": problems,
        "loadavg_start": load_start, "loadavg_end": load_end,
        "runs": [{k: v for k, v in r.items() if k != "doc"} for r in runs],
        "wall_s": wall,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print("report: %s" % os.path.join(args.out, "report.md"))

    if problems:
        return 1
    if args.strict and any(t["status"] != "PASS" for t in targets):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
