"""The analysis and report of perf/bench_ddp_scaling.py, pure Python (no launches): the lower
bound and PyTorch's pre-bucketing rule, DDP's bucket assignment, the per-cell statistics with
the best fixed cap chosen on held-out repeats, the cross-size matrix, the simulator beside every
cell, and the report's markdown tables. The driver's docstring says what each figure means."""
import math
import re
import statistics

from toolkit import median_ci  # perf/toolkit.py: the shared statistics

MIB = 2.0 ** 20
FIXED = ("ddp25", "cap1", "cap5", "cap100", "pytorch")
CAP_MB = {"ddp25": 25.0, "cap1": 1.0, "cap5": 5.0, "cap100": 100.0}
FUSEBOX = ("fusebox", "fusebox_warm")
CELLS = FIXED + FUSEBOX + ("noallreduce",)
CROSS = re.compile(r"^from([0-9]+)$")   # from<N>: the plan fusebox tuned at N hosts
FIRST_BUCKET = 1 << 20   # torch 1.x's dist._DEFAULT_FIRST_BUCKET_BYTES
PT_EFFICIENCY, PT_FLOOR_MB, PT_CEIL_MB, PT_MULTIPLIER = 0.9, 50.0, 2000.0, 1.0


# ------------------------------------------------------------------ models (pure)

def ring_transfer_s(nbytes, hosts, rate_bps):
    """A ring allreduce's time on the wire: 2 (p-1)/p * bytes at rate_bps bits/s."""
    return 0.0 if hosts <= 1 else 2.0 * (hosts - 1) / hosts * nbytes * 8.0 / rate_bps


def lower_bound_s(forward_s, backward_s, first_ready_s, last_bytes, total_bytes, hosts,
                  rate_bps):
    """forward + max(backward + T(last-ready gradient), first ready + T(all bytes))."""
    return forward_s + max(backward_s + ring_transfer_s(last_bytes, hosts, rate_bps),
                           first_ready_s + ring_transfer_s(total_bytes, hosts, rate_bps))


def pytorch_prebucket_cap_mb(world, bus_bytes_per_s, hop_latency_s, base_latency_s=None,
                             efficiency=PT_EFFICIENCY, multiplier=PT_MULTIPLIER,
                             floor_mb=PT_FLOOR_MB, ceil_mb=PT_CEIL_MB):
    """PyTorch's pre-bucketing cap (module docstring): (clamped MiB, unclamped MiB)."""
    base = hop_latency_s if base_latency_s is None else base_latency_s
    if world <= 1:
        min_bytes = 0
    else:
        min_bytes = int(efficiency / (1.0 - efficiency) * (base + (world - 1) * hop_latency_s)
                        * bus_bytes_per_s)
    raw = multiplier * min_bytes / MIB
    return max(floor_mb, min(ceil_mb, raw)), raw


def ddp_bucket_bytes(sizes, dtypes, cap_bytes, first_bytes=FIRST_BUCKET):
    """DDP's buckets (bytes each) for gradients of `sizes` in ready order: per dtype, a
    tensor joins the open bucket, which closes once it reaches its limit (the first
    bucket's first_bytes, then cap_bytes); tensors are never split."""
    done, open_ = [], {}
    for size, dtype in zip(sizes, dtypes):
        b = open_.setdefault(dtype, {"bytes": 0, "limit": min(first_bytes, cap_bytes)})
        b["bytes"] += size
        if b["bytes"] >= b["limit"]:
            done.append(b["bytes"])
            open_[dtype] = {"bytes": 0, "limit": cap_bytes}
    return done + [b["bytes"] for b in open_.values() if b["bytes"]]


# The names the online tuner gives DDP's plans among its candidates, in the order it adds
# them (a plan equal to one added before is measured once, under the first name).
TUNER_NAMES = (("ddp", 25.0), ("ddp-cap1mb", 1.0), ("ddp-cap5mb", 5.0), ("ddp-cap100mb", 100.0))
PREDICTED = FIXED + ("fusebox",)


def tuner_names(fig, pt_mb):
    """{fixed cell: the tuner's name of the candidate with the same DDP buckets}."""
    def buckets(mb):
        return ddp_bucket_bytes(fig["sizes"], fig["dtypes"], int(mb * MIB))
    caps = dict(CAP_MB, pytorch=pt_mb)
    return {c: next((n for n, mb in TUNER_NAMES if buckets(mb) == buckets(caps[c])), None)
            for c in FIXED}


def predicted_steps(launch, names):
    """{cell: predicted step ms} of one launch. The fusebox cell's tuner fitted a cost model
    to this emulated cluster and predicted each candidate plan from forward start to the
    end of its communication (the simulator, on the profile it recorded); the step's tail
    after that (optimizer, host work: the same for every plan) is not the cost model's to
    predict and is the fusebox cell's measured median. The fusebox cell's own prediction
    is that of the plan it kept."""
    fb = (launch["cells"].get("fusebox") or {}).get("fusebox") or {}
    tail = fb.get("tail_ms")
    by_name = {m["name"]: m["predicted_ms"] for m in fb.get("measured") or []
               if m.get("predicted_ms")}
    if tail is None or not by_name:
        return {}
    out = {c: by_name[n] + tail for c, n in names.items() if n in by_name}
    if fb.get("plan") in by_name:
        out["fusebox"] = by_name[fb["plan"]] + tail
    return out


def analyze_predictions(launches, names):
    """The simulator against the measurement at one (setting, host count): per cell the
    predicted step (describe) and the errors predicted / measured - 1 per launch; and
    every pair of cells whose measured intervals do not overlap (significant), with
    whether the predicted medians order it the same way."""
    pred = {c: [] for c in PREDICTED}
    errors = {c: [] for c in PREDICTED}
    for l in launches:
        for c, p in predicted_steps(l, names).items():
            m = launch_figure(l["cells"][c]) if c in l["cells"] else None
            if m is not None:
                pred[c].append(p)
                errors[c].append(p / m - 1)
    meas = {c: describe([f for f in (launch_figure(l["cells"][c]) for l in launches
                                     if c in l["cells"]) if f is not None])
            for c in PREDICTED}
    pairs = []
    cells = [c for c in PREDICTED if pred[c] and meas[c]["n"] > 1]
    for i, a in enumerate(cells):
        for b in cells[i + 1:]:
            (alo, ahi), (blo, bhi) = meas[a]["ci"], meas[b]["ci"]
            same = statistics.median(pred[a]) == statistics.median(pred[b])  # one plan
            if (ahi < blo or bhi < alo) and not same:
                measured_faster = meas[a]["median"] < meas[b]["median"]
                predicted_faster = statistics.median(pred[a]) < statistics.median(pred[b])
                pairs.append((a, b, measured_faster == predicted_faster))
    return {"predicted": {c: describe(v) for c, v in pred.items()}, "errors": errors,
            "pairs": pairs}


# -------------------------------------------------------------- statistics (pure)

def describe(values):
    """{'median', 'ci', 'coverage', 'n'} over independent values (order statistics)."""
    if not values:
        return {"median": None, "ci": [None, None], "coverage": 0.0, "n": 0}
    low, high, cov = median_ci(values)
    return {"median": statistics.median(values), "ci": [low, high], "coverage": cov,
            "n": len(values)}


def launch_figure(cell):
    """A cell's figure in one launch: its median timed step; None if not comparable."""
    if cell.get("excluded") or (cell.get("fusebox") is not None and
                                not cell.get("tuning_finished")):
        return None
    return statistics.median(cell["step_ms"])


HOOKED = "hooked"   # DDP's default with fusebox registered on that same plan, untuned


def hook_cost(launches):
    """What fusebox's hook costs a step by itself: per launch that ran the hooked cell (DDP's
    default plan through fusebox.torch.register(plan="ddp"): the hook, its side group and its
    step marks, no tuning), its step over ddp25's in the same launch (describe); None if no
    launch ran it."""
    ratios = []
    for l in launches:
        if HOOKED in l["cells"] and "ddp25" in l["cells"]:
            a, b = launch_figure(l["cells"][HOOKED]), launch_figure(l["cells"]["ddp25"])
            if a is not None and b is not None:
                ratios.append(a / b)
    return describe(ratios) if ratios else None


def format_hook_cost(name, per_hosts):
    """The hook-cost table of a setting; per_hosts: {hosts: hook_cost(...)}; [] if none."""
    rows = [(h, d) for h, d in sorted(per_hosts.items()) if d is not None]
    if not rows:
        return []
    lines = ["", "%s: the hook's own cost, hooked / ddp25 in the same launch (the same plan, "
             "DDP's default, with and without fusebox registered on it); median over launches "
             "[order-statistic interval] (launches)." % name, "",
             "| hosts | hooked / ddp25 |", "|---|---|"]
    lines += ["| %d | %s (%d) |" % (h, fmt(d, "%.3f"), d["n"]) for h, d in rows]
    return lines


def cross_cells(launches):
    """The from<N> cells (plans tuned at N hosts) these launches ran, by N."""
    return sorted({c for l in launches for c in l["cells"] if CROSS.match(c)},
                  key=lambda c: int(c[4:]))


def analyze_hosts(launches):
    """Across-repeat figures of one (setting, host count) from its launches, in repeat
    order: per-cell stats, the best fixed cap chosen on the odd repeats and reported on
    the even ones (on all of them with a single repeat), fusebox / best cap there, and
    per from<N> cell its step / fusebox's in the same launch (the cross-size matrix)."""
    figs = [{c: launch_figure(l["cells"][c]) for c in l["cells"]} for l in launches]
    cross = cross_cells(launches)
    cells = {c: describe([f[c] for f in figs if f.get(c) is not None])
             for c in CELLS + tuple(cross)}
    out_cross = {c: describe([f[c] / f["fusebox"] for f in figs
                              if f.get(c) is not None and f.get("fusebox") is not None])
                 for c in cross}
    select = figs[0::2]
    held = figs[1::2] or figs
    fixed = [c for c in FIXED if all(f.get(c) is not None for f in figs)]
    best = min(fixed, key=lambda c: statistics.median(f[c] for f in select)) if fixed else None
    out = {"cells": cells, "best_cap": best, "held_out": len(figs[1::2]),
           "repeats": len(figs), "cross": out_cross}
    if best is not None:
        out["best_held_ms"] = describe([f[best] for f in held])
        for c in FUSEBOX:
            out["ratio_" + c] = describe([f[c] / f[best] for f in held
                                          if f.get(c) is not None])
    out["tuning_steps"] = [len(l["cells"]["fusebox"]["tuning_step_ms"]) for l in launches
                           if "fusebox" in l["cells"]]
    out["not_tuned"] = sum(1 for l in launches for c in FUSEBOX if c in l["cells"] and
                           not l["cells"][c].get("tuning_finished"))
    busy = [statistics.mean(c["cpu_busy"] for c in l["cells"].values()) for l in launches]
    out["cpu_busy"] = statistics.median(busy)
    out["rank_cores"] = statistics.median(
        statistics.mean(c["rank_cpu_cores"] for c in l["cells"].values()) for l in launches)
    out["launch_s"] = [l["launch_s"] for l in launches]
    return out


# ---------------------------------------------------------------------- report

def fmt(d, f="%.1f"):
    """median [low, high] (the median alone from a single value; - from none)."""
    if not d or d["median"] is None:
        return "-"
    return f % d["median"] if d["n"] < 2 else ("%s [%s, %s]" % (f, f, f)) % (
        d["median"], d["ci"][0], d["ci"][1])


def format_setting(name, fig, per_hosts):
    """One setting's report section; per_hosts: {hosts: (analysis, bound_ms, pt_cap)}."""
    cols = ("noallreduce",) + FIXED + FUSEBOX
    lines = ["## %s" % name, "",
             "Median step ms over repeats [order-statistic interval]; bound = the lower bound "
             "(computed, not measured). %s" % fig["label"], "",
             "| hosts | bound | " + " | ".join(cols) + " |",
             "|---|" + "---|" * (len(cols) + 1)]
    for h, (a, bound, _) in sorted(per_hosts.items()):
        lines.append("| %d | %.1f | " % (h, bound) +
                     " | ".join(fmt(a["cells"][c]) for c in cols) + " |")
    lines += ["", "Best fixed cap chosen on the odd repeats, reported on the even (held-out) "
              "ones; ratios: median over held-out repeats of fusebox / best cap (lower is "
              "faster); CPU busy: whole machine over the timed spans; cores: the ranks' own.",
              "", "| hosts | repeats | held out | best cap | best cap ms | fusebox / best "
              "| fusebox_warm / best | tuning steps | not tuned | CPU busy | rank cores "
              "| launch s | pytorch cap MiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for h, (a, _, pt) in sorted(per_hosts.items()):
        lines.append("| %d | %d | %d | %s | %s | %s | %s | %s | %d | %.0f%% | %.2f | %s | "
                     "%.0f (unclamped %.2f) |" % (
                         h, a["repeats"], a["held_out"], a["best_cap"] or "-",
                         fmt(a.get("best_held_ms")), fmt(a.get("ratio_fusebox"), "%.3f"),
                         fmt(a.get("ratio_fusebox_warm"), "%.3f"),
                         ", ".join(map(str, a["tuning_steps"])) or "-", a["not_tuned"],
                         100 * a["cpu_busy"], a["rank_cores"],
                         ", ".join("%.0f" % s for s in a["launch_s"]), pt[0], pt[1]))
    lines += format_cross(per_hosts)
    lines += format_sim(per_hosts)
    cov = {a["cells"]["ddp25"]["coverage"] for a, _, _ in per_hosts.values()}
    lines += ["", "interval coverage: %s" % ", ".join("%.1f%%" % (100 * c) for c in sorted(cov)),
              "DDP buckets per cell (computed from DDP's rule): %s" % fig["buckets"], ""]
    return lines


def format_sim(per_hosts):
    """The simulator beside every cell of one setting (none without predictions)."""
    sims = {h: a["sim"] for h, (a, _, _) in per_hosts.items() if a.get("sim")}
    errors = [e for sim in sims.values() for es in sim["errors"].values() for e in es]
    if not errors:
        return []
    lines = ["", "The simulator beside every cell: each plan's step predicted under the cost "
             "model the fusebox cell's tuner fitted in the same launch (to this emulated "
             "cluster), plus the step's measured tail after communication (optimizer, host); "
             "median over launches, and the median error predicted / measured - 1 per launch.",
             "", "| hosts | " + " | ".join(PREDICTED) + " |", "|---|" + "---|" * len(PREDICTED)]
    for h, sim in sorted(sims.items()):
        row = []
        for c in PREDICTED:
            d, es = sim["predicted"][c], sim["errors"][c]
            row.append("%.1f (%+.1f%%)" % (d["median"], 100 * statistics.median(es))
                       if es else "-")
        lines.append("| %d | %s |" % (h, " | ".join(row)))
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, math.ceil(0.9 * len(absolute)) - 1)]
    pairs = [ok for sim in sims.values() for _, _, ok in sim["pairs"]]
    lines += ["", "simulator error over %d cell-launches: median |error| %.1f%%, p90 %.1f%%, "
              "within 10%%: %d; pairs of different plans whose measured intervals do not "
              "overlap: %d, ordered as measured by the predictions: %d"
              % (len(absolute), 100 * statistics.median(absolute), 100 * p90,
                 sum(e <= 0.10 for e in absolute), len(pairs), sum(pairs))]
    return lines


def format_cross(per_hosts):
    """The cross-size matrix of one setting (none where no launch ran a from<N> cell)."""
    tuned_at = sorted({int(c[4:]) for a, _, _ in per_hosts.values() for c in a["cross"]}
                      | set(per_hosts))
    if not any(a["cross"] for a, _, _ in per_hosts.values()):
        return []
    hosts = sorted(per_hosts)
    lines = ["", "Cross-size matrix: the plan fusebox tuned at N hosts (its cold cell's "
             "policy-cache entry from the latest launch at N) run untuned at M hosts; median "
             "over launches of its step / the step of fusebox tuned at M in the same launch "
             "[order-statistic interval] (launches); above 1: the plan from N is slower at M "
             "than M's own. The diagonal is fusebox itself.", "",
             "| tuned at | " + " | ".join("run at %d" % h for h in hosts) + " |",
             "|---|" + "---|" * len(hosts)]
    for a_hosts in tuned_at:
        row = []
        for h in hosts:
            if a_hosts == h:
                row.append("1 (itself)")
                continue
            d = per_hosts[h][0]["cross"].get("from%d" % a_hosts)
            row.append("%s (%d)" % (fmt(d, "%.3f"), d["n"]) if d and d["n"] else "-")
        lines.append("| %d | %s |" % (a_hosts, " | ".join(row)))
    return lines
