"""The allreduce benchmark's statistics (perf/bench_allreduce.py): the median time per tool,
world size and size over the interleaved repeats, the bandwidths recomputed from it
(nccl-tests' algbw and busbw), the problems, and each OpenMPI family's best."""

from allreduce_report import LAT_KEY, TARGET_SMALL  # perf/allreduce_report.py
import mpi_tools  # perf/mpi_tools.py: OpenMPI's variants, best-of families, ratio intervals
from toolkit import median  # perf/toolkit.py: the shared helpers


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
