"""The allreduce benchmark's plan (perf/bench_allreduce.py): which tools run, at which sizes and
world sizes, in which interleaved order, and running it. Bench is one invocation's state, filled
in stage by stage."""

import os
import shlex
import sys
import time

from allreduce_report import (  # perf/allreduce_report.py: formatting, targets
    LAT_KEY, LOAD_NRANKS, LOAD_SIZE, TARGET_LARGE, TARGET_SMALL, fmt_size)
from allreduce_tools import (  # perf/allreduce_tools.py: commands and processes
    is_shape, load_json, missing_paths, run_cmd, start_loopers, stop_loopers, sweep, tail)
import mpi_tools  # perf/mpi_tools.py: OpenMPI's variants, best-of families, ratio intervals

LOAD_TOOLS = ("ucx", "mpi")                 # run again under load
# Tools with a dedicated 8 B latency run, besides every blocking MPI variant. Gloo's 8 B time
# (~0.3-2 ms) is in its sweep already.
LAT_TOOLS = ("ucx", "fbmpi")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


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
