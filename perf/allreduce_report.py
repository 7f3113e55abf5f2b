"""The allreduce benchmark's report: formatting (sizes, times, bandwidths, ratios, markdown
tables), the loaded pass's table and the targets, for perf/bench_allreduce.py (whose docstring
lists the targets). Every function takes the benchmark's state (allreduce_plan.Bench) or
plain values."""

import datetime
import os
import platform
import shlex
import subprocess
import types

from allreduce_tools import REPO, is_shape  # perf/allreduce_tools.py: commands and processes
import mpi_tools  # perf/mpi_tools.py: OpenMPI's variants, best-of families, ratio intervals


MIB = 1 << 20
TARGET_SMALL = 8
TARGET_LARGE = 64 * MIB
LOAD_SIZE = 4 * MIB      # busbw size of the loaded pass
LOAD_SIZE_NAME = "4 MiB"
LOAD_NRANKS = 2          # world size of the loaded pass
LAT_KEY = -TARGET_SMALL  # stats key of the dedicated 8 B latency run


# ----------------------------------------------------------------------------- formatting

def fmt_size(b):
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d%s" % (b // m, unit)
    return str(b)


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


def fmt_row_size(b):
    return fmt_size(b) if b != LAT_KEY else "8 (lat)"


def md_table(header, rows, align):
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join((" ---: " if a == "r" else " --- ") for a in align) + "|"]
    for r in rows:
        out.append("| " + " | ".join(r) + " |")
    return "\n".join(out)


FORMAT = types.SimpleNamespace(size=fmt_row_size, time=fmt_time, bw=fmt_bw, table=md_table)


def ratio(u, o):
    return (u["busbw"] / o["busbw"]) if u and o and o["busbw"] > 0 else None


# ----------------------------------------------------------------------------- loaded pass and targets

def idle_vs_loaded_section(s, lines):
    """The loaded pass's table; returns its figures."""
    load_tools, stats, load_stats, nloopers = s.load_tools, s.stats, s.load_stats, s.nloopers
    idle_small, load_small = s.idle_small, s.load_small
    # Idle vs loaded, LOAD_NRANKS ranks.
    idle_vs_loaded = {}
    if load_tools:
        n = LOAD_NRANKS
        lines.append("")
        lines.append("## Idle vs loaded (%d ranks)" % n)
        lines.append("")
        header = ["", "ucx idle", "ucx loaded", "mpi idle", "mpi loaded", "ucx/mpi idle",
                  "ucx/mpi loaded"]
        trows = []
        for name, bi, bl, field in (("8 B latency (us)", idle_small, load_small, "time_us"),
                                    ("%s busbw (GB/s)" % LOAD_SIZE_NAME, LOAD_SIZE,
                                     LOAD_SIZE, "busbw")):
            ui, ul = stats.get(("ucx", n, bi)), load_stats.get(("ucx", n, bl))
            mi, ml = stats.get(("mpi", n, bi)), load_stats.get(("mpi", n, bl))
            fmt = fmt_time if field == "time_us" else fmt_bw

            def rat(u, m, field=field):
                return u[field] / m[field] if u and m and m[field] > 0 else None

            vals = {"ucx_idle": ui and ui[field], "ucx_loaded": ul and ul[field],
                    "mpi_idle": mi and mi[field], "mpi_loaded": ml and ml[field],
                    "ucx_over_mpi_idle": rat(ui, mi), "ucx_over_mpi_loaded": rat(ul, ml)}
            idle_vs_loaded["latency_us" if field == "time_us" else "busbw_%s" %
                           fmt_size(LOAD_SIZE)] = vals
            trows.append([name, fmt(vals["ucx_idle"]), fmt(vals["ucx_loaded"]),
                          fmt(vals["mpi_idle"]), fmt(vals["mpi_loaded"]),
                          fmt_ratio(vals["ucx_over_mpi_idle"]),
                          fmt_ratio(vals["ucx_over_mpi_loaded"])])
        lines.append(md_table(header, trows, ["l"] + ["r"] * 6))
        lines.append("")
        lines.append("loaded: each run with %d busy-loop processes (one per CPU) running beside "
                     "it; mpi = OpenMPI's default decision. Latency ratio: time (lower favours "
                     "ucx); busbw ratio: busbw (higher favours ucx)." % nloopers)

    return idle_vs_loaded


def evaluate_targets(s):
    """The targets, and the reference lines of the non-blocking sweep."""
    args, stats, load_stats, coll_tools, table_sizes = (
        s.args, s.stats, s.load_stats, s.coll_tools, s.table_sizes)
    idle_small, load_small, lat_run, memcpy_gbps, nloopers, load_tools = (
        s.idle_small, s.load_small, s.lat_run, s.memcpy_gbps, s.nloopers, s.load_tools)
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

    def best_detail(m):
        return " (%s)" % m["best_of"] if m and m.get("best_of") else ""

    def spread(u, m, lower_is_better):
        """The ratio repeat by repeat (repeat i of u against repeat i of m; mpibest's is the best
        algorithm of that repeat): how far one repeat moves the median ratio."""
        if not u or not m:
            return ""
        rs = [(ut / mt if lower_is_better else mt / ut)
              for ut, mt in zip(u["samples_time_us"], m["samples_time_us"]) if ut > 0 and mt > 0]
        if len(rs) < 2:
            return ""
        return "; per repeat %.2f-%.2fx" % (min(rs), max(rs))

    # fusebox vs mpibest at every size measured (the sweep and the extra runs; not the latency
    # run): the blocking calls (ucxz) against MPI_Allreduce, like with like; the non-blocking
    # sweep (ucx) follows as a line for reference.
    fb = "ucxz" if "ucxz" in coll_tools else "ucx"
    reference = []
    def busbw_ratios(k, n):
        """(k/mpibest busbw, size, k's stats, mpibest's) at every size both measured."""
        out = []
        for b in table_sizes(n):
            u, m = stat(k, n, b), stat("mpibest", n, b)
            if u and m and m["busbw"] > 0:
                out.append((u["busbw"] / m["busbw"], b, u, m))
        return out

    for n, need in ([(n, 1.0) for n in args.ranks] if args.emulate else ((2, 1.0), (4, 0.8))):
        pairs = busbw_ratios(fb, n)
        nb = busbw_ratios("ucx", n) if fb == "ucxz" else []
        if nb:
            w = min(nb, key=lambda p: p[0])
            reference.append("%d %s, non-blocking sweep: ucx/mpibest min %.2fx at %s; %d of "
                             "%d sizes below %.1fx" % (
                                 n, "hosts" if args.emulate else "ranks", w[0], fmt_size(w[1]),
                                 sum(1 for x in nb if x[0] < need), len(nb), need))
        name = "%d %s: busbw %s/mpibest >= %.1fx at every size" % (
            n, "hosts at %s" % args.emulate if args.emulate else "ranks", fb, need)
        if not pairs:
            add_target(name, None, None, "not measured (needs ucx and mpi at %d ranks)" % n)
            continue
        v, b, u, m = min(pairs, key=lambda p: p[0])
        below = [fmt_size(p[1]) for p in pairs if p[0] < need]
        add_target(name, v, lambda x, need=need: x >= need,
                   "min at %s: %s %s vs mpibest %s GB/s%s%s; %s of %d sizes" % (
                       fmt_size(b), fb, fmt_bw(u["busbw"]), fmt_bw(m["busbw"]), best_detail(m),
                       spread(u, m, False),
                       ("%d below (%s)" % (len(below), ", ".join(below))) if below
                       else "none below", len(pairs)),
                   [p[2] for p in pairs] + [p[3] for p in pairs])

    # The local targets (2-rank latency and 64 MiB, memcpy, the loaded pass) mean nothing
    # for emulated hosts.
    if not args.emulate:
        u, m = stat("ucx", 2, idle_small), stat("mpibest", 2, idle_small)
        v = u["time_us"] / m["time_us"] if u and m and m["time_us"] > 0 else None
        add_target("2 ranks: 8 B latency ucx/mpibest <= 1.0x", v, lambda x: x <= 1.0,
                   "ucx %s us vs mpibest %s us%s%s%s" % (
                       fmt_time(u["time_us"]), fmt_time(m["time_us"]), best_detail(m),
                       " (-n %d run)" % args.latency_iters if lat_run else "",
                       spread(u, m, True))
                   if u and m else "not measured", (u, m))

        u, m = stat("ucx", 2, TARGET_LARGE), stat("mpibest", 2, TARGET_LARGE)
        add_target("2 ranks: 64 MiB busbw ucx/mpibest >= 2.0x", ratio(u, m), lambda x: x >= 2.0,
                   "ucx %s GB/s vs mpibest %s GB/s%s%s" % (
                       fmt_bw(u["busbw"]), fmt_bw(m["busbw"]), best_detail(m),
                       spread(u, m, False))
                   if u and m else "not measured (needs ucx and mpi at 64 MiB, 2 ranks)", (u, m))
        v = u["busbw"] / memcpy_gbps if u and memcpy_gbps else None
        add_target("2 ranks: 64 MiB busbw ucx / memcpy >= 50%", v, lambda x: x >= 0.5,
                   "ucx %s GB/s vs memcpy %s GB/s" % (fmt_bw(u["busbw"]), fmt_bw(memcpy_gbps))
                   if u and memcpy_gbps else "not measured", (u,))

        why_no_load = "loaded pass not run" if not load_tools else "not measured"
        u, m = load_stats.get(("ucx", 2, load_small)), load_stats.get(("mpi", 2, load_small))
        v = u["time_us"] / m["time_us"] if u and m and m["time_us"] > 0 else None
        add_target("loaded, 2 ranks: 8 B latency ucx/mpi <= 1.5x", v, lambda x: x <= 1.5,
                   "ucx %s us vs mpi %s us, %d busy loops%s" % (
                       fmt_time(u["time_us"]), fmt_time(m["time_us"]), nloopers,
                       spread(u, m, True))
                   if u and m else why_no_load, (u, m))
        u, m = load_stats.get(("ucx", 2, LOAD_SIZE)), load_stats.get(("mpi", 2, LOAD_SIZE))
        add_target("loaded, 2 ranks: %s busbw ucx/mpi >= 0.67x (ucx >= mpi/1.5)"
                   % LOAD_SIZE_NAME, ratio(u, m), lambda x: x >= 1 / 1.5 - 1e-9,
                   "ucx %s GB/s vs mpi %s GB/s, %d busy loops%s" % (
                       fmt_bw(u["busbw"]), fmt_bw(m["busbw"]), nloopers, spread(u, m, False))
                   if u and m else why_no_load, (u, m))
    return targets, reference

# ----------------------------------------------------------------------------- the tables

UCX_TOOLS = ("ucxz", "ucx", "ucxw")         # fusebox's blocking, non-blocking, each-waited
# MPI families: the best per size of the variants of each shape (mpi_tools.FAMILIES).
MPI_BEST = tuple(mpi_tools.FAMILIES.values())
TOOL_LABELS = {
    "ucx": "fusebox UCX, non-blocking (issue -n calls, then wait)",
    "ucxz": "fusebox UCX, blocking calls (-z 1, AllReduceBlocking, as MPI_Allreduce)",
    "mpi": "MPI_Allreduce (OpenMPI default decision)",
    "ucxw": "fusebox UCX, non-blocking, each call waited at once (--wait_each)",
    "gloo": "PyTorch Gloo",
    "fbmpi": "fusebox MPI backend",
}
TOOL_LABELS.update(mpi_tools.FAMILY_LABELS)


def git_rev():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


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
