#!/usr/bin/env python3
"""Side-by-side allreduce benchmark: fusebox UCX vs OpenMPI (its default and at its best) vs
PyTorch Gloo, idle and under load.

Runs, in one invocation, for every world size in --ranks (float32 sum, -b .. -e bytes):

  ucx     <build>/tools/fusebox-run -n N -- <build>/perf/fusebox-perf allreduce --backend ucx ...
          (non-blocking, nccl-tests' way: -n calls issued back to back, then waited)
  ucxz    the same with -z 1: each call is the communicator's blocking allreduce
          (AllReduceBlocking), finished before the next is issued, as MPI_Allreduce is; run
          whenever ucx is. The busbw targets compare it with OpenMPI's blocking MPI_Allreduce;
          the non-blocking sweep is reported beside it (ucx/mpibest) for reference.
  mpi     mpirun -n N --oversubscribe <build>/perf/baselines/fusebox-mpi-allreduce ...
          (plain MPI_Allreduce, OpenMPI's own default: ob1 + vader, coll/tuned's fixed decision)
          When N exceeds the CPUs, both are bound round-robin, two or more ranks per CPU
          (fusebox-run --bind core; mpirun --bind-to core:overload-allowed): unbound, both
          are bimodal from run to run.
  mpi-aK  mpirun -n N --oversubscribe --mca coll_tuned_use_dynamic_rules 1
                 --mca coll_tuned_allreduce_algorithm K <build>/perf/baselines/fusebox-mpi-allreduce
          for each K in --mpi-algorithms (default 1,2,3,4,5,6: basic_linear, nonoverlapping,
          recursive_doubling, ring, segmented_ring, rabenseifner; '' runs none); run whenever
          mpi is (with --mpi-cmd, the --mca flags go after its --oversubscribe, or else after
          its first word)
  ucxw    ucx with --ucx-wait-each's flags (default --wait_each: fusebox-perf's non-blocking
          calls each waited at once, launch-to-done per call); --ucx-wait-each='' skips it
  mpi-ucx..., mpi-<comp>, mpinb..., mpiwe...  OpenMPI's other variants, run whenever mpi is:
          the same over the UCX PML (--mpi-pmls), each coll component with an allreduce forced
          first (--mpi-components), and MPI_Iallreduce under libnbc and each of its algorithms
          (--mpi-nb-algorithms), issued -n at a time then waited (mpinb) or each waited at once
          (mpiwe). perf/mpi_tools.py, Note [Fair MPI peers], has the list and the flags; a
          variant that needs a PML or component runs only where a probe shows it selected.
  gloo    /usr/bin/python3 perf/baselines/gloo_allreduce.py --nranks N ...   (torch.distributed)
  fbmpi   mpirun -n N --oversubscribe <build>/perf/fusebox-perf allreduce --backend mpi ...
          (only with --with-fusebox-mpi; bound as mpi is)

and once per repeat <build>/perf/baselines/fusebox-memcpy-bw (single-thread memcpy, 64 MB).
Every tool gets the same "-b B -e E -f F -n N -w W -d float -o sum --json PATH" and writes
fusebox-perf's JSON schema. Each tool is run --repeats times (interleaved, in rotating order,
because the machine is noisy) and the median time per size is kept; algbw/busbw are recomputed
from that median (nccl-tests: algbw = bytes / time, GB = 1e9; busbw = algbw * 2(p-1)/p).

The target sizes (8 B and 64 MiB) are always measured when they lie in [-b, -e], even when the
geometric sweep skips them (-f 4 from 8 B reaches 32 MiB, not 64 MiB): an extra run with
"-b S -e S" covers each missing one (every tool, the mpi-aK included).

A dedicated 8 B run per tool with -n --latency-iters (default 1000) -w --latency-warmup feeds the
latency targets (20 iterations of a ~1 us call are mostly noise); it is the "8 (lat)" row. It is
run for ucx (with -z 1: every call waited before the next, as MPI_Allreduce blocks), mpi, every
mpi-aK and fbmpi; not for Gloo, whose 8 B time is in its sweep.

"mpibest" is not run: per world size and size it is the fastest of mpi and the other MPI_Allreduce
variants (highest busbw; for the 8 B latency run the lowest time), with correct results, so
fusebox is compared with OpenMPI at its best and not only at its default; it exists at the sizes
all of them run (not at the idle 4 MiB extra run of the loaded pass). summary.json names
the winner per size ("best_of", e.g. "mpi-a4 (ring)" or "mpi (default)") and keeps every
algorithm's own numbers. "mpinbbest" and "mpiwebest" are the same for the MPI_Iallreduce
variants of each shape; "Fair comparisons" per world size set ucxz against mpibest, ucx against
mpinbbest and ucxw against mpiwebest: ratios with intervals from the interleaved repeats, a
tie where the interval (Bonferroni-corrected for the sizes of the table) contains 1.0.

Loaded pass (--load, the default; --no-load skips it), at 2 ranks only: in each repeat, after
the idle runs at 2 ranks, ucx and mpi (default decision) are run again for the dedicated 8 B
latency run (same flags as the idle one) and a 4 MiB run (-b 4M -e 4M), each while the script
keeps one busy-looping Python process per CPU (os.cpu_count()) running; they are started just
before that run and killed and reaped right after it, also on failure or Ctrl-C. The idle 4 MiB
figure comes from the sweep when it has 4 MiB, else from an extra idle 4 MiB run of ucx and mpi.

Prints, per world size, one table with ucx (and fusebox-perf's launch-to-start of non-blocking
calls, "ucx launch p50/p99 us", when its JSON has it), mpibest (and which algorithm it is), mpi,
gloo (fbmpi), and the busbw ratios ucx/mpibest, ucx/mpi, ucx/gloo; then a compact table of the
OpenMPI algorithm sweep (busbw of mpi and every mpi-aK per size, the best marked); then
"Idle vs loaded (2 ranks)": 8 B latency and 4 MiB busbw of ucx and mpi, idle and loaded, with
their ratios; then the "Targets" section (PASS, FAIL, or N/A when not measured):
  2 ranks:  busbw ucx/mpibest >= 1.0x at every size measured (reports the worst size)
  2 ranks:  8 B latency (the dedicated run) ucx/mpibest <= 1.0x
  2 ranks:  64 MiB busbw ucx/mpibest >= 2.0x, and ucx / memcpy >= 50%
  4 ranks:  busbw ucx/mpibest >= 0.8x at every size measured (reports the worst size)
  loaded, 2 ranks:  8 B latency ucx/mpi <= 1.5x; 4 MiB busbw ucx/mpi >= 0.67x (ucx >= mpi/1.5)
("every size": the sweep's sizes and the extra target-size runs, not the 8 B latency run.)
Writes <out>/report.md, <out>/summary.json (per-tool results, the loaded ones marked "loaded",
mpibest with "best_of", idle_vs_loaded, targets), every tool's JSON and every run's log.

Command templates (--ucx-cmd, --mpi-cmd, --gloo-cmd, --fbmpi-cmd, --memcpy-cmd) replace the
default command prefix of a tool; they are split like a shell line and may use {n} (world
size), {build}, {repo}, {mpirun}, {python}. The common arguments are appended. E.g. to try the
runner before fusebox-perf exists:
  --ucx-cmd '{mpirun} -n {n} --oversubscribe {build}/perf/baselines/fusebox-mpi-allreduce'

Emulated hosts (--emulate RATE; needs root): each world size N of --ranks becomes N emulated
hosts with one rank each, on perf/cluster/emucluster.py's network namespaces with every host's
link shaped to RATE (e.g. 1gbit):
  ucx     emucluster.py run --hosts N --rate RATE -- <build>/perf/fusebox-perf allreduce ...
          (UCX over TCP on the shaped links: UCX_TLS=tcp)
  mpi     emucluster.py mpirun --hosts N --rate RATE -- --oversubscribe
                 <build>/perf/baselines/fusebox-mpi-allreduce ...
          (OpenMPI over its tcp btl on the same links, one orted per host; where the hosts
          outnumber the CPUs, with --mca mpi_yield_when_idle 1, as OpenMPI sets itself on a
          node it knows is oversubscribed: polling ranks that share a core otherwise wait out
          scheduler ticks, 4 ms per 8 B allreduce at 4 hosts on 2 CPUs)
  mpi-aK  as mpi, with the algorithm forced.
Gloo, the memcpy reference and the loaded pass are not run; the targets are "N hosts: busbw
ucx/mpibest >= 1.0x at every size" for each N. The namespaces' names are fixed (prefix fbbnch):
run one emulated benchmark at a time.

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

from allreduce_report import (  # perf/allreduce_report.py: formatting, targets
    FORMAT, LAT_KEY, LOAD_NRANKS, LOAD_SIZE, LOAD_SIZE_NAME, MIB, TARGET_LARGE, TARGET_SMALL,
    evaluate_targets, fmt_bw, fmt_ratio, fmt_size, fmt_time, idle_vs_loaded_section, md_table,
    ratio)
import mpi_tools  # perf/mpi_tools.py: OpenMPI's variants, best-of families, ratio intervals
import results as result_summary  # perf/results.py: the results convention
from toolkit import median, parse_size, run  # perf/toolkit.py: the shared helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# OpenMPI's coll/tuned allreduce algorithms (coll_tuned_allreduce_algorithm; 0 = its fixed
# decision, which the plain "mpi" tool measures).
MPI_ALGORITHMS = mpi_tools.TUNED_ALGORITHMS
LOAD_TOOLS = ("ucx", "mpi")                 # run again under load
UCX_TOOLS = ("ucxz", "ucx", "ucxw")         # fusebox's blocking, non-blocking, each-waited
# MPI families: the best per size of the variants of each shape (mpi_tools.FAMILIES).
MPI_BEST = tuple(mpi_tools.FAMILIES.values())

# Tools with a dedicated 8 B latency run, besides every blocking MPI variant. Gloo's 8 B time
# (~0.3-2 ms) is in its sweep already.
LAT_TOOLS = ("ucx", "fbmpi")

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

TOOL_LABELS = {
    "ucx": "fusebox UCX, non-blocking (issue -n calls, then wait)",
    "ucxz": "fusebox UCX, blocking calls (-z 1, AllReduceBlocking, as MPI_Allreduce)",
    "mpi": "MPI_Allreduce (OpenMPI default decision)",
    "ucxw": "fusebox UCX, non-blocking, each call waited at once (--wait_each)",
    "gloo": "PyTorch Gloo",
    "fbmpi": "fusebox MPI backend",
}
TOOL_LABELS.update(mpi_tools.FAMILY_LABELS)


# ----------------------------------------------------------------------------- sizes

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

    # Ranks that outnumber the CPUs are bound round-robin, fusebox's and OpenMPI's alike:
    # left to the scheduler, both go bimodal (OpenMPI's 8 B allreduce at 4 ranks on 2 CPUs
    # measured 13 or 25 us from run to run, fusebox's 23 or 75 us); bound, both are steady.
    cpus = os.cpu_count() or 1

    def ucx_bind(n):
        return ["--bind", "core"] if n > cpus else []

    def mpi_bind(n):
        return ["--bind-to", "core:overload-allowed"] if n > cpus else []

    emucluster = os.path.join(REPO, "perf", "cluster", "emucluster.py")

    def emulated(what, n):
        # Its own prefix, subnet and port: never another emucluster run's namespaces.
        # --grace 2: its teardown ends within kill_group's 5 s after a --timeout.
        return [args.python, emucluster, what, "--hosts", str(n), "--rate", args.emulate,
                "--prefix", "fbbnch", "--subnet", "97", "--grace", "2"] + (
                    ["--port", "29671", "--fusebox_run", launcher] if what == "run"
                    else ["--mpirun", args.mpirun]) + ["--"]

    defaults = {
        "ucx": (lambda n: [launcher, "-n", str(n)] + ucx_bind(n) +
                ["--", perf, "allreduce", "--backend", "ucx"],
                [launcher, perf], False),
        "mpi": (lambda n: [args.mpirun, "-n", str(n), "--oversubscribe"] + mpi_bind(n) +
                [mpi_bin],
                [args.mpirun, mpi_bin], True),
        "gloo": (lambda n: [args.python, gloo_py, "--nranks", str(n)],
                 [args.python, gloo_py], False),
        "fbmpi": (lambda n: [args.mpirun, "-n", str(n), "--oversubscribe"] + mpi_bind(n) +
                  [perf, "allreduce", "--backend", "mpi"],
                  [args.mpirun, perf], True),
        "memcpy": (lambda n: [memcpy_bin], [memcpy_bin], False),
    }
    if args.emulate:
        defaults["ucx"] = (lambda n: emulated("run", n) + [perf, "allreduce", "--backend", "ucx"],
                           [launcher, perf, emucluster], False)
        defaults["mpi"] = (lambda n: emulated("mpirun", n) + (
            ["--mca", "mpi_yield_when_idle", "1"] if n > cpus else []) +
            ["--oversubscribe", mpi_bin], [args.mpirun, mpi_bin, emucluster], True)
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
    # "ucxz", "ucxw": the "ucx" command; their runs add -z 1 or --ucx-wait-each's flags.
    for k in ("ucxz", "ucxw"):
        tools[k] = Tool(k, tools["ucx"].prefix_fn, tools["ucx"].needs, tools["ucx"].mpi)
    # OpenMPI's variants ("mpi-a4", "mpinb-ucx", ...): the "mpi" command with their --mca
    # flags after its --oversubscribe (or after its first word, mpirun, in a --mpi-cmd lacking
    # it); the runs add the shape's flags (mpi_tools.SHAPE_ARGS).
    for k, v in getattr(args, "mpi_variants", {}).items():
        if k != "mpi":
            tools[k] = Tool(k, (lambda v: lambda n: mpi_tools.with_mca(
                tools["mpi"].prefix_fn(n), v.mca))(v), tools["mpi"].needs, True)
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
            kill_group(p)
            log.write("\n[bench_allreduce] timed out after %d s\n" % timeout)
            rc = 124
        except BaseException:  # Ctrl-C: the run is in its own session, end it too
            kill_group(p)
            raise
    return rc, time.monotonic() - t0


def kill_group(p):
    """SIGTERM, then SIGKILL, to the process group that p leads; waits for p."""
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


def start_loopers(count, procs):
    """Starts `count` busy-looping Python processes, appending each to procs as it starts (so
    that the caller's finally can end those already started if a later one fails)."""
    for _ in range(count):
        procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    time.sleep(0.2)  # let them get past interpreter start-up and onto the CPUs


def stop_loopers(procs):
    """Kills and reaps every process in procs (only those this script started)."""
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    del procs[:]


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def run_text(cmd, timeout=60):
    """(exit status, output) of a short command; 127 and "" when it cannot start."""
    try:
        return run(cmd, timeout)
    except (OSError, subprocess.SubprocessError):
        return 127, ""


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------------------- statistics

def bw_from_time(nbytes, time_us, nranks):
    if not time_us or time_us <= 0:
        return 0.0, 0.0
    algbw = nbytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * 2.0 * (nranks - 1) / nranks


def summarize(samples, nbytes, nranks, prefer):
    """samples: list of result entries for one (tool, N, size), each with its repeat under
    "_rep" when known. Returns the chosen mode's median or None. Uses `prefer` ('oop'/'ip')
    when every sample has it, else the other mode."""
    for mode in (prefer, "ip" if prefer == "oop" else "oop"):
        ms = [dict(s.get(mode), _rep=s.get("_rep", i)) for i, s in enumerate(samples)
              if isinstance(s.get(mode), dict)]
        ms = [m for m in ms if m.get("time_us") is not None]
        if not ms:
            continue
        t = median([float(m["time_us"]) for m in ms])
        algbw, busbw = bw_from_time(nbytes, t, nranks)
        st = {"mode": mode, "time_us": t, "algbw": algbw, "busbw": busbw,
              "wrong": max(int(m.get("wrong", 0) or 0) for m in ms),
              "samples_time_us": [float(m["time_us"]) for m in ms],
              "samples_rep": [m["_rep"] for m in ms],
              "samples_busbw": [bw_from_time(nbytes, float(m["time_us"]), nranks)[1]
                                for m in ms]}
        # fusebox-perf's launch-to-start of non-blocking calls (absent for other tools).
        ls = [s.get("launch_us") for s in samples]
        ls = [x for x in ls if isinstance(x, dict) and x.get("p50") is not None
              and float(x["p50"]) >= 0]
        if ls:
            st["launch_p50_us"] = median([float(x["p50"]) for x in ls])
            st["launch_p99_us"] = median([float(x.get("p99", x["p50"])) for x in ls])
            st["launch_samples"] = [x.get("samples") for x in ls]
        return st
    return None


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
    p.add_argument("-w", "--warmup_iters", type=int, default=None,
                   help="warm-up calls per size (default 5; with --emulate 300, so that the "
                        "UCX backend's measured choice of algorithm, a trial of up to 135 calls "
                        "per size class, and a first switch where rank 0 finds the choice dear "
                        "in use, come before the timed calls; later switches can still come "
                        "among them)")
    p.add_argument("--latency-iters", type=int, default=1000,
                   help="iterations of the dedicated 8 B latency run that the latency targets "
                        "use (default 1000; 0: use the sweep's 8 B numbers)")
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
    p.add_argument("--tools", default=None,
                   help="subset of ucx,mpi,gloo to run (default all three; ucx,mpi with "
                        "--emulate; mpi brings the mpi-aK of --mpi-algorithms along)")
    p.add_argument("--emulate", default=None, metavar="RATE",
                   help="emulated hosts (needs root): each world size of --ranks is that many "
                        "hosts, one rank each, with links shaped to RATE (e.g. 1gbit); see below")
    p.add_argument("--with-fusebox-mpi", action="store_true",
                   help="also run fusebox-perf --backend mpi under mpirun (column 'fbmpi')")
    p.add_argument("--mpi-algorithms", default=",".join(str(k) for k in sorted(MPI_ALGORITHMS)),
                   metavar="K,K,...",
                   help="OpenMPI allreduce algorithms run as tools mpi-aK next to 'mpi' "
                        "(coll_tuned_allreduce_algorithm; 1 basic_linear, 2 nonoverlapping, "
                        "3 recursive_doubling, 4 ring, 5 segmented_ring, 6 rabenseifner; "
                        "default all; '' none); 'mpibest' is the best of these and 'mpi'")
    p.add_argument("--load", dest="load", action="store_true", default=True,
                   help="loaded pass (default on): at %d ranks, ucx and mpi again for the 8 B "
                        "latency and %s busbw while one busy loop per CPU runs"
                        % (LOAD_NRANKS, LOAD_SIZE_NAME))
    p.add_argument("--no-load", dest="load", action="store_false", help="skip the loaded pass")
    p.add_argument("--memcpy-size", type=parse_size, default=64 * MIB)
    p.add_argument("--python", default="/usr/bin/python3",
                   help="Python that imports torch (default /usr/bin/python3)")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run (default 900)")
    p.add_argument("--allow-missing", action="store_true",
                   help="skip a tool whose binary is missing instead of stopping")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target FAILs")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--reuse", action="store_true",
                   help="keep the results of runs whose JSON is already in --out (run the "
                        "others): to rebuild the report of an earlier run with the same flags")
    mpi_tools.add_arguments(p)
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
    if args.warmup_iters is None:
        args.warmup_iters = 300 if args.emulate else 5
    if args.repeats < 1 or args.iters < 1 or args.warmup_iters < 0:
        p.error("bad --repeats / -n / -w")
    if args.tools is None:
        args.tools = "ucx,mpi" if args.emulate else "ucx,mpi,gloo"
    args.tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    for t in args.tools:
        if t not in ("ucx", "mpi", "gloo"):
            p.error("--tools: unknown tool %r" % t)
    if args.emulate:
        if not args.emulate.replace(".", "").isalnum():
            p.error("--emulate wants a tc rate such as 1gbit or 500mbit, not %r" % args.emulate)
        if "gloo" in args.tools:
            p.error("--emulate runs ucx and mpi only (gloo has no emulated-host launcher here)")
        if args.with_fusebox_mpi:
            p.error("--emulate and --with-fusebox-mpi do not go together")
        if not args.dry_run and os.geteuid() != 0:
            p.error("--emulate needs root (network namespaces and tc)")
        args.load = False
    try:
        args.mpi_algorithms = sorted({int(x) for x in args.mpi_algorithms.split(",")
                                      if x.strip()})
    except ValueError:
        p.error("--mpi-algorithms wants integers, e.g. 3,4")
    for k in args.mpi_algorithms:
        if k not in MPI_ALGORITHMS:
            p.error("--mpi-algorithms: %d is not one of %s (0, OpenMPI's default decision, is "
                    "the 'mpi' tool)" % (k, ",".join(str(a) for a in sorted(MPI_ALGORITHMS))))
    mpi_tools.finish_arguments(p, args, lambda cmd: run_text(cmd))
    args.tools += [k for k in args.mpi_variants if k != "mpi"]
    if "ucx" in args.tools:
        args.tools.insert(args.tools.index("ucx"), "ucxz")
        if args.ucx_wait_each:
            args.tools.insert(args.tools.index("ucx") + 1, "ucxw")
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


class Bench:
    """One invocation's state, filled in stage by stage by main()'s helpers (prepare, execute,
    aggregate, ...): the arguments, tools, sizes, runs and their statistics."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def table_sizes(self, n):
        """The sizes of world size n's table: the sweep, the extra runs, the loaded pass's."""
        return sorted(set(self.all_sizes) |
                      (set(self.load_extra) if n == LOAD_NRANKS else set()))


def common_args(args, lo, hi, json_path, iters=None, warmup=None):
    """The arguments every tool gets (nccl-tests' flags and --json)."""
    return ["-b", str(lo), "-e", str(hi), "-f", "%g" % args.stepfactor,
            "-n", str(iters or args.iters),
            "-w", str(args.warmup_iters if warmup is None else warmup),
            "-d", "float", "-o", "sum", "--json", json_path]


def rotate(ks, rep):
    return ks[rep % len(ks):] + ks[:rep % len(ks)] if ks else []


def table_cols(s):
    """The side-by-side table's tools: fusebox's, MPI_Allreduce at its best and by default,
    Gloo and fusebox's MPI backend, those that ran."""
    has_mpi = any(k[0] == "mpibest" for k in s.best_keys)
    return [k for k in ("ucxz", "ucx", "ucxw", "mpibest", "mpi", "gloo", "fbmpi")
            if k in s.coll_tools or (k == "mpibest" and has_mpi)]


def tool_label(args, k):
    """What a tool measures, for the report's tools line."""
    v = args.mpi_variants.get(k)
    if k in TOOL_LABELS or not v:
        return TOOL_LABELS.get(k, k)
    return "%s, %s" % ({mpi_tools.BLOCKING: "MPI_Allreduce",
                        mpi_tools.THROUGHPUT: "MPI_Iallreduce x -n, then MPI_Waitall",
                        mpi_tools.WAIT_EACH: "MPI_Iallreduce + MPI_Wait per call"}[v.shape],
                       v.label)


def is_shape(args, k, shape):
    """Whether tool k is an OpenMPI variant of that shape (mpi_tools.BLOCKING, ...)."""
    v = args.mpi_variants.get(k)
    return v is not None and v.shape == shape


def main(argv=None):
    args = parse_args(argv)
    s = prepare(args, build_tools(args))
    if s is None:
        return 2
    if not execute(s, make_plan(s)):
        return 0
    aggregate(s)
    lines = report_head(s)
    rank_tables(s, lines)
    s.idle_vs_loaded = idle_vs_loaded_section(s, lines)
    s.targets, s.reference = evaluate_targets(s)
    return finish(s, lines, argv)


def prepare(args, tools):
    """The tools to run (None when a binary is missing without --allow-missing), the sizes and
    the loaded pass's set-up, which OpenMPI variants run (a probe each): main()'s state."""
    # Binaries first: fail before spending minutes on the others.
    wanted = list(args.tools) + ([] if args.emulate else ["memcpy"])
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
            return None
        wanted = [k for k in wanted if k not in missing]
        print("bench_allreduce: --allow-missing: skipping %s" % ", ".join(sorted(missing)),
              file=sys.stderr)
    coll_tools = [k for k in wanted if k != "memcpy"]

    sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor)
    extra = [x for x in (TARGET_SMALL, TARGET_LARGE)
             if args.minbytes <= x <= args.maxbytes and x not in sizes]
    all_sizes = sorted(set(sizes) | set(extra))

    # The loaded pass: ucx and mpi (default decision) at LOAD_NRANKS, with one busy loop per
    # CPU. Its idle 4 MiB counterpart comes from the sweep, or from an extra run of those tools.
    load_tools = [k for k in LOAD_TOOLS if k in coll_tools] \
        if args.load and LOAD_NRANKS in args.ranks else []
    load_extra = [LOAD_SIZE] if load_tools and LOAD_SIZE not in all_sizes else []
    nloopers = os.cpu_count() or 1

    if not args.dry_run:
        os.makedirs(os.path.join(args.out, "json"), exist_ok=True)
        os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    env = dict(os.environ)
    env.update(MPI_ENV)

    lat_run = args.latency_iters > 0 and args.minbytes <= TARGET_SMALL <= args.maxbytes
    # Stats keys of the 8 B latency, idle and loaded: the dedicated run, or the sweep's 8 B
    # with --latency-iters 0 (the loaded latency run then uses the sweep's flags, like idle).
    idle_small = LAT_KEY if lat_run else TARGET_SMALL
    load_small = LAT_KEY if args.latency_iters > 0 else TARGET_SMALL

    def probe_run(argv, name):
        log = os.path.join(args.out, "logs", name + ".log")
        return run_cmd(argv, log, 120, env)[0], tail(log, 1 << 20)

    # OpenMPI variants that need a PML or a component run where a probe shows it selected.
    skip, probes = mpi_tools.probe(args.mpi_variants, [] if args.dry_run else coll_tools,
                                   args.ranks, lambda k, n: tools[k].prefix_fn(n), probe_run)
    for (k, n), why in sorted(skip.items()):
        print("bench_allreduce: %s not run at %d ranks: %s" % (k, n, why), file=sys.stderr)
    return Bench(args=args, tools=tools, wanted=wanted, coll_tools=coll_tools, sizes=sizes,
                 extra=extra, all_sizes=all_sizes, load_tools=load_tools, load_extra=load_extra,
                 nloopers=nloopers, env=env, lat_run=lat_run, idle_small=idle_small,
                 load_small=load_small, skip=skip, probes=probes)


def make_plan(s):
    """(rep, tool, n, lo, hi, tag) for every run."""
    args, wanted, coll_tools, extra, load_extra, load_tools, lat_run = (
        s.args, s.wanted, s.coll_tools, s.extra, s.load_extra, s.load_tools, s.lat_run)
    # The plan: (rep, tool, n, lo, hi, tag). Repeats interleaved, tool order rotated; the loaded
    # runs of a repeat follow its idle runs at LOAD_NRANKS.
    load_tag = "%s-load" % fmt_size(LOAD_SIZE)
    plan = []
    for rep in range(args.repeats):
        if "memcpy" in wanted:
            plan.append((rep, "memcpy", 1, None, None, "memcpy"))
        for n in args.ranks:
            for k in rotate(coll_tools, rep):
                if (k, n) in s.skip:
                    continue
                plan.append((rep, k, n, args.minbytes, args.maxbytes, "sweep"))
                more = load_extra if n == LOAD_NRANKS and k in load_tools else []
                for x in extra + more:
                    plan.append((rep, k, n, x, x, fmt_size(x)))
                if lat_run and (k in LAT_TOOLS or is_shape(args, k, mpi_tools.BLOCKING)):
                    plan.append((rep, k, n, TARGET_SMALL, TARGET_SMALL, "lat"))
            if n == LOAD_NRANKS:
                for k in rotate(load_tools, rep):
                    plan.append((rep, k, n, TARGET_SMALL, TARGET_SMALL, "lat-load"))
                    plan.append((rep, k, n, LOAD_SIZE, LOAD_SIZE, load_tag))

    return plan


def execute(s, plan):
    """Runs the plan (prints it with --dry-run); fills s.runs, s.commands_seen, s.wall and the
    load averages. Returns False for a dry run."""
    args, tools, env, nloopers = s.args, s.tools, s.env, s.nloopers
    commands_seen = {}
    runs = []  # dicts: rep, tool, n, tag, loaded, rc, secs, json, log
    t_start = time.monotonic()
    load_start = os.getloadavg()
    for i, (rep, k, n, lo, hi, tag) in enumerate(plan):
        loaded = tag.endswith("-load")
        base = "%s-np%d-r%d-%s" % (k, n, rep, tag) if k != "memcpy" else "memcpy-r%d" % rep
        json_path = os.path.join(args.out, "json", base + ".json")
        log_path = os.path.join(args.out, "logs", base + ".log")
        if k == "memcpy":
            argv = tools[k].prefix_fn(1) + ["--size", str(args.memcpy_size), "--json", json_path]
        else:
            lat = tag == "lat" or (tag == "lat-load" and args.latency_iters > 0)
            argv = tools[k].prefix_fn(n) + (
                common_args(args, lo, hi, json_path, args.latency_iters, args.latency_warmup) if lat
                else common_args(args, lo, hi, json_path))
            if k == "ucxz" or (lat and k in ("ucx", "fbmpi")):
                # Blocking, like MPI_Allreduce: each call is waited before the
                # next is issued, so the times compare like with like.
                argv += ["-z", "1"]
            elif k == "ucxw":
                argv += shlex.split(args.ucx_wait_each)
            elif k in args.mpi_variants:
                argv += mpi_tools.SHAPE_ARGS[args.mpi_variants[k].shape]
        commands_seen.setdefault((k, n, tag), argv)
        note = "  # while %d busy loops run" % nloopers if loaded else ""
        if args.dry_run:
            print(" ".join(shlex.quote(a) for a in argv) + note)
            continue
        doc = load_json(json_path) if args.reuse else None
        if doc is not None:
            print("[%d/%d] %-6s np=%d rep %d %-8s reused %s" % (
                i + 1, len(plan), k, n, rep + 1, tag, json_path), flush=True)
            runs.append({"rep": rep, "tool": k, "n": n, "tag": tag, "loaded": loaded, "rc": 0,
                         "secs": 0.0, "json": json_path, "log": log_path, "doc": doc,
                         "reused": True})
            continue
        if os.path.exists(json_path):
            os.remove(json_path)
        print("[%d/%d] %-6s np=%d rep %d %-8s%s ..." % (
            i + 1, len(plan), k, n, rep + 1, tag,
            " (%d busy loops)" % nloopers if loaded else ""), end="", flush=True)
        loopers = []
        try:
            if loaded:
                start_loopers(nloopers, loopers)
            rc, secs = run_cmd(argv, log_path, args.timeout, env)
        finally:
            stop_loopers(loopers)  # also on Ctrl-C or a failed start: none may outlive the run
        doc = load_json(json_path)
        status = "ok" if rc == 0 and doc is not None else (
            "rc=%d" % rc if rc != 0 else "no JSON")
        print(" %5.1f s %s" % (secs, status), flush=True)
        if status != "ok":
            print("  command: %s\n  log: %s\n%s" % (" ".join(shlex.quote(a) for a in argv),
                                                    log_path, tail(log_path)), file=sys.stderr)
        runs.append({"rep": rep, "tool": k, "n": n, "tag": tag, "loaded": loaded, "rc": rc,
                     "secs": secs, "json": json_path, "log": log_path, "doc": doc})
    if args.dry_run:
        return False
    wall = time.monotonic() - t_start
    load_end = os.getloadavg()

    s.runs, s.commands_seen, s.wall = runs, commands_seen, wall
    s.load_start, s.load_end = load_start, load_end
    return True


def aggregate(s):
    """Medians per (tool, n, size), the memcpy figure, the problems, and each MPI family's best."""
    args, runs = s.args, s.runs
    # ------------------------------------------------------------------ aggregate
    memcpy_vals = [r["doc"].get("median_gbps") for r in runs
                   if r["tool"] == "memcpy" and r["doc"] and r["doc"].get("median_gbps")]
    memcpy_gbps = median(memcpy_vals) if memcpy_vals else None

    # (tool, n, bytes, loaded) -> [entry]; the 8 B latency runs under bytes LAT_KEY
    samples = {}
    for r in runs:
        if r["tool"] == "memcpy" or not r["doc"]:
            continue
        lat = r["tag"] == "lat" or (r["tag"] == "lat-load" and args.latency_iters > 0)
        for e in r["doc"].get("results", []):
            b = LAT_KEY if lat else int(e["bytes"])
            samples.setdefault((r["tool"], r["n"], b, r["loaded"]), []).append(
                dict(e, _rep=r["rep"]))
    stats = {}       # idle: (tool, n, bytes) -> summary
    load_stats = {}  # loaded pass: (tool, n, bytes) -> summary
    for (k, n, b, loaded), es in samples.items():
        st = summarize(es, TARGET_SMALL if b == LAT_KEY else b, n, args.mode)
        if st:
            (load_stats if loaded else stats)[(k, n, b)] = st

    problems = []
    for r in runs:
        if r["rc"] != 0 or r["doc"] is None:
            problems.append("%s np=%d rep %d (%s): %s; log %s" % (
                r["tool"], r["n"], r["rep"] + 1, r["tag"],
                "exit status %d" % r["rc"] if r["rc"] else "no JSON written", r["log"]))
    for where, d in (("", stats), (" under load", load_stats)):
        for (k, n, b), st in sorted(d.items()):
            if st["wrong"]:
                problems.append("%s np=%d %s B%s: %d wrong elements" % (
                    k, n, "8 (latency run)" if b == LAT_KEY else b, where, st["wrong"]))
    for r in runs:  # a build without -z would have run MPI_Allreduce for a non-blocking one
        v = args.mpi_variants.get(r["tool"])
        why = v and r["doc"] and mpi_tools.check_doc_shape(r["doc"], v.shape)
        if why:
            problems.append("%s np=%d rep %d (%s): %s; log %s" % (
                r["tool"], r["n"], r["rep"] + 1, r["tag"], why, r["log"]))
    # Each MPI family's best per (n, size), at the sizes every candidate runs: not at the
    # idle 4 MiB extra run of the loaded pass.
    keys = sorted({(n, b) for (k, n, b) in stats
                   if k in args.mpi_variants and (b in s.all_sizes or b == LAT_KEY)})
    s.best_keys = mpi_tools.add_best(stats, args.mpi_variants, s.coll_tools, keys)
    s.memcpy_gbps, s.memcpy_vals, s.problems = memcpy_gbps, memcpy_vals, problems
    s.stats, s.load_stats = stats, load_stats


def report_head(s):
    """The report's first lines: what ran, where, and the commands."""
    args, coll_tools, load_tools, load_extra, nloopers, extra = (
        s.args, s.coll_tools, s.load_tools, s.load_extra, s.nloopers, s.extra)
    memcpy_gbps, memcpy_vals, wall, load_start, load_end = (
        s.memcpy_gbps, s.memcpy_vals, s.wall, s.load_start, s.load_end)
    runs, commands_seen = s.runs, s.commands_seen
    cols = table_cols(s)
    variants = [k for k in coll_tools if k in args.mpi_variants and k != "mpi"]
    families = [k for k in MPI_BEST if any(key[0] == k for key in s.best_keys)]
    lines = []
    lines.append("# Allreduce side by side: float32 sum" + (
        ", emulated hosts (one rank each) on %s links" % args.emulate if args.emulate else ""))
    lines.append("")
    lines.append("- date: %s, host: %s (%s, %d CPUs), git: %s" % (
        datetime.datetime.now().isoformat(timespec="seconds"), platform.node(),
        platform.machine(), os.cpu_count() or 0, git_rev() or "?"))
    lines.append("- sweep: -b %s -e %s -f %g%s, -n %d -w %d, %d repeat(s) (median time per size), "
                 "%.0f s wall" % (
                     fmt_size(args.minbytes), fmt_size(args.maxbytes), args.stepfactor,
                     (" (+%s as extra runs)" % ", ".join(fmt_size(s) for s in extra))
                     if extra else "", args.iters, args.warmup_iters, args.repeats, wall))
    if args.emulate:
        lines.append("- emulated hosts: perf/cluster/emucluster.py, one network namespace per "
                     "host, each host's link shaped with tc tbf to %s both ways; ucx runs UCX "
                     "over TCP, mpi OpenMPI's tcp btl; all hosts share this machine's %d CPUs" % (
                         args.emulate, os.cpu_count() or 0))
    else:
        lines.append("- memcpy (single thread, %s): %s GB/s (median of %d run(s): %s)" % (
            fmt_size(args.memcpy_size), fmt_bw(memcpy_gbps), len(memcpy_vals),
            ", ".join("%.2f" % v for v in memcpy_vals) or "-"))
    lines.append("- tools: " + "; ".join("%s = %s" % (k, tool_label(args, k)) for k in
                                         cols + [f for f in families if f not in cols] +
                                         [k for k in variants if k not in cols]))
    if args.mpi_variants:
        comps = args.ompi_components
        lines.append("- this OpenMPI (ompi_info): coll %s; pml %s. Probed (one 8 B call with "
                     "OpenMPI's selection logged): %s" % (
                         ", ".join(comps.get("coll", ())) or "?",
                         ", ".join(comps.get("pml", ())) or "?",
                         "; ".join("%s at %d ranks: %s" % (
                             " + ".join(r["needs"]), r["nranks"],
                             "runs" if r["runs"] else "not run, " + r["why_not"])
                                   for r in s.probes) or "nothing needed a probe"))
        none = [c for c in comps.get("coll", ()) if mpi_tools.COLL_PROVIDES.get(c) == ()]
        if none:
            lines.append("- coll components with neither MPI_Allreduce nor MPI_Iallreduce (not "
                         "run): %s" % ", ".join(none))
    if load_tools:
        lines.append("- loaded pass (%d ranks): %s again for the 8 B latency and %s busbw, each "
                     "run while %d busy-loop processes (one per CPU) run%s" % (
                         LOAD_NRANKS, " and ".join(load_tools), LOAD_SIZE_NAME, nloopers,
                         " (+%s idle extra run for %s)" % (LOAD_SIZE_NAME,
                                                           " and ".join(load_tools))
                         if load_extra else ""))
    else:
        lines.append("- loaded pass: not run (%s)" % (
            "--no-load" if not args.load else "%d not in --ranks" % LOAD_NRANKS
            if LOAD_NRANKS not in args.ranks else "neither ucx nor mpi run"))
    lines.append("- time in us (average per op, averaged across ranks); busbw in GB/s (1e9)")
    ncpu = os.cpu_count() or 1
    lines.append("- load average (1 min): %.1f at start, %.1f at end, on %d CPUs%s" % (
        load_start[0], load_end[0], ncpu,
        " (the loaded pass raises it itself)" if load_tools else ""))
    reused = sum(1 for r in runs if r.get("reused"))
    if reused:
        lines.append("- %d of %d runs reused from an earlier invocation into this directory "
                     "(--reuse): the wall time and load averages above are this invocation's, "
                     "not theirs" % (reused, len(runs)))
    if max(load_start[0], load_end[0]) > 0.5 * ncpu + 0.5:
        lines.append("")
        lines.append("**WARNING: the machine was busy with other work (load %.1f on %d CPUs); "
                     "these numbers are not trustworthy, rerun on an idle machine.**" % (
                         max(load_start[0], load_end[0]), ncpu)
                     + (" (The loaded pass's own busy loops count in the end figure.)"
                        if load_tools else ""))
    lines.append("")
    lines.append("Commands (first repeat):")
    lines.append("")
    lines.append("```")
    for (k, n, tag), argv in commands_seen.items():
        lines.append(" ".join(shlex.quote(a) for a in argv) + (
            "  # while %d busy loops run" % nloopers if tag.endswith("-load") else ""))
    lines.append("```")

    return lines


def rank_tables(s, lines):
    """Per world size: the side-by-side table, the fair comparisons and the candidate tables."""
    args, stats, coll_tools, lat_run = s.args, s.stats, s.coll_tools, s.lat_run
    load_extra, table_sizes, cols = s.load_extra, s.table_sizes, table_cols(s)
    s.fair = []
    for n in args.ranks:
        rows_b = table_sizes(n) + ([LAT_KEY] if lat_run else [])
        modes = {}
        for k in cols:
            ms = sorted({stats[(k, n, b)]["mode"] for b in rows_b if (k, n, b) in stats})
            modes[k] = "/".join(ms) if ms else "-"
        launch = "ucx" in cols and any("launch_p50_us" in stats.get(("ucx", n, b), {})
                                       for b in rows_b)
        lines.append("")
        lines.append("## %d %s" % (n, "hosts" if args.emulate else "ranks"))
        lines.append("")
        lines.append("Numbers: " + ", ".join("%s %s" % (k, {"oop": "out-of-place",
                                                            "ip": "in-place"}.get(modes[k],
                                                                                  modes[k]))
                                         for k in cols) + ".")
        lines.append("")
        header = ["size"]
        for k in cols:
            header += ["%s time us" % k, "%s busbw" % k]
            if k == "ucx" and launch:
                header.append("ucx launch p50/p99 us")
            if k == "mpibest":
                header.append("mpibest is")
        # fusebox's figure per size: the blocking calls where run, else the sweep's.
        fb = "ucxz" if "ucxz" in cols else "ucx"
        if fb in cols:
            header += ["%s/%s busbw" % (fb, k) for k in cols if k not in UCX_TOOLS]
        if fb == "ucxz" and "mpibest" in cols:
            header.append("ucx/mpibest busbw")
        rows = []
        for b in rows_b:
            row = [fmt_size(b) if b != LAT_KEY else "8 (lat)"]
            for k in cols:
                st = stats.get((k, n, b))
                mark = "" if not st or not st["wrong"] else " !%d wrong" % st["wrong"]
                row += [fmt_time(st["time_us"]) if st else "-",
                        (fmt_bw(st["busbw"]) + mark) if st else "-"]
                if k == "ucx" and launch:
                    row.append("%s/%s" % (fmt_time(st["launch_p50_us"]),
                                          fmt_time(st["launch_p99_us"]))
                               if st and "launch_p50_us" in st else "-")
                if k == "mpibest":
                    row.append(st["best_of"] if st else "-")
            if fb in cols:
                u = stats.get((fb, n, b))
                row += [fmt_ratio(ratio(u, stats.get((k, n, b)))) for k in cols
                        if k not in UCX_TOOLS]
            if fb == "ucxz" and "mpibest" in cols:
                row.append(fmt_ratio(ratio(stats.get(("ucx", n, b)),
                                           stats.get(("mpibest", n, b)))))
            rows.append(row)
        lines.append(md_table(header, rows, ["r"] * len(header)))
        notes = []
        if lat_run:
            notes.append("8 (lat): a dedicated 8 B run with -n %d -w %d, every call waited "
                         "before the next (fusebox-perf -z 1; MPI_Allreduce blocks anyway); the "
                         "latency targets use it." % (args.latency_iters, args.latency_warmup))
        if "mpibest" in cols:
            others = [k for k in coll_tools if is_shape(args, k, mpi_tools.BLOCKING)
                      and k != "mpi" and (k, n) not in s.skip]
            notes.append("mpibest: per size, the fastest of mpi (OpenMPI's default decision)%s; "
                         "'mpibest is' names it.%s" % (
                             " and " + ", ".join(mpi_tools.label(args.mpi_variants, k)
                                                 for k in others)
                             if others else " (no other variant run)",
                             " Not at %s: only ucx and mpi run that size (for the loaded "
                             "pass's idle figure)." % LOAD_SIZE_NAME
                             if n == LOAD_NRANKS and load_extra else ""))
        if fb == "ucxz":
            notes.append("ucxz: fusebox's blocking allreduce, like with like with "
                         "MPI_Allreduce (the targets use it; its 8 (lat) row is ucx's, which "
                         "is blocking too). ucx: the non-blocking sweep, -n calls issued and "
                         "then waited, for reference.")
        if launch:
            notes.append("ucx launch p50/p99: fusebox-perf's launch-to-start of non-blocking "
                         "calls issued to an idle communicator (median over repeats).")
        for t in notes:
            lines.append("")
            lines.append(t)

        # The fair comparisons (Note [Fair MPI peers]), then every candidate per family.
        fair, summary = mpi_tools.comparison_section(stats, n, table_sizes(n), FORMAT)
        lines.extend(fair)
        s.fair += summary
        lines.extend(mpi_tools.candidates_tables(stats, args.mpi_variants, n, rows_b, FORMAT,
                                                 "hosts" if args.emulate else "ranks"))


def finish(s, lines, argv):
    """Writes report.md, summary.json and the run summary; returns the exit status."""
    args, stats, load_stats, problems, runs = s.args, s.stats, s.load_stats, s.problems, s.runs
    targets, reference, memcpy_gbps, memcpy_vals = s.targets, s.reference, s.memcpy_gbps, \
        s.memcpy_vals
    load_tools, nloopers, load_start, load_end, wall = s.load_tools, s.nloopers, \
        s.load_start, s.load_end, s.wall
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
    if reference:
        lines.append("")
        lines.append("For reference (not a target):")
        lines.append("")
        lines.extend("- " + r for r in reference)
    lines.append("")
    lines.append("## Problems")
    lines.append("")
    lines.extend(["- " + p for p in problems] or ["none"])
    report = "\n".join(lines) + "\n"

    print()
    print(report)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report)
    results = [dict(tool=k, nranks=n, bytes=abs(b), latency_run=(b == LAT_KEY), loaded=False,
                    **st) for (k, n, b), st in sorted(stats.items())]
    results += [dict(tool=k, nranks=n, bytes=abs(b), latency_run=(b == LAT_KEY), loaded=True,
                     **st) for (k, n, b), st in sorted(load_stats.items())]
    summary = {
        "args": {k: v for k, v in vars(args).items() if k != "mpi_variants"},
        "memcpy_gbps": memcpy_gbps, "memcpy_samples": memcpy_vals,
        "mpi_variants": {k: mpi_tools.label(args.mpi_variants, k) for k in s.coll_tools
                         if k in args.mpi_variants},
        "mpi_probes": s.probes,
        "mpi_not_run": [{"tool": k, "nranks": n, "why": why} for (k, n), why in s.skip.items()],
        "mpibest": [{"family": f, "nranks": n, "bytes": abs(b), "latency_run": b == LAT_KEY,
                     "best_of": stats[(f, n, b)]["best_of"]} for f, n, b in s.best_keys],
        "fair": s.fair,
        "load": {"enabled": bool(load_tools), "nranks": LOAD_NRANKS, "tools": load_tools,
                 "busy_loops": nloopers if load_tools else 0, "busbw_bytes": LOAD_SIZE},
        "idle_vs_loaded": s.idle_vs_loaded,
        "results": results,
        "targets": targets, "reference": reference, "problems": problems,
        "loadavg_start": load_start, "loadavg_end": load_end,
        "runs": [{k: v for k, v in r.items() if k != "doc"} for r in runs],
        "wall_s": wall,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    result_summary.write_run_summary(
        args.out, report, "bench_allreduce", shlex.join(["python3", "perf/bench_allreduce.py"] + (argv or sys.argv[1:])),
        "allreduce side by side: fusebox UCX, OpenMPI, Gloo, memcpy")
    print("report: %s" % os.path.join(args.out, "report.md"))
    print("summary for a results page: %s" % os.path.join(args.out, "result.json"))

    if problems:
        return 1
    if args.strict and any(t["status"] != "PASS" for t in targets):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
