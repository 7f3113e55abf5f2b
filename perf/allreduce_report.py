"""The allreduce benchmark's report: formatting (sizes, times, bandwidths, ratios, markdown
tables), the loaded pass's table and the targets, for perf/bench_allreduce.py (whose docstring
lists the targets). Every function takes the benchmark's state (bench_allreduce.Bench) or
plain values."""

import types


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
