"""The allreduce benchmark's tools (perf/bench_allreduce.py): the sizes they visit, their
command lines (defaults, --*-cmd templates, emulated hosts, OpenMPI's variants) and how one run
of a command is started, timed out and ended."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import mpi_tools  # perf/mpi_tools.py: OpenMPI's variants, best-of families, ratio intervals
from toolkit import run  # perf/toolkit.py: the shared helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def is_shape(args, k, shape):
    """Whether tool k is an OpenMPI variant of that shape (mpi_tools.BLOCKING, ...)."""
    v = args.mpi_variants.get(k)
    return v is not None and v.shape == shape


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
