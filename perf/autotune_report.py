"""The analysis and report of perf/bench_autotune.py: per cell (model, ranks, compute ratio), the
tuned plan against DDP's default, the hand-set caps and the other plans (by their 95% intervals
of the median), the summary over cells, and the simulator's predictions against the
measurements."""
import re
import statistics

PLANS = ["per-tensor", "ddp", "ddp-cap1mb", "ddp-cap5mb", "ddp-cap100mb", "horovod", "mg-wfbp",
         "tuned"]

def ms(us):
    return f"{us / 1e3:.2f}"


def ci_ms(r):
    low, high = r["iteration_ci95_us"]
    return f"[{low / 1e3:.2f}, {high / 1e3:.2f}]"


def cis_overlap(a, b):
    """Whether two plans' 95% CIs of the median overlap."""
    return a["iteration_ci95_us"][0] <= b["iteration_ci95_us"][1] and \
        b["iteration_ci95_us"][0] <= a["iteration_ci95_us"][1]


def compare(tuned, other):
    """'slower' / 'faster' when tuned's CI lies wholly above / below other's, else 'overlap'."""
    if tuned["iteration_ci95_us"][0] > other["iteration_ci95_us"][1]:
        return "slower"
    if tuned["iteration_ci95_us"][1] < other["iteration_ci95_us"][0]:
        return "faster"
    return "overlap"


def table(header, rows):
    """A markdown table, columns as wide as their widest cell; numbers right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells):
        out = []
        for c, w in zip(cells, widths):
            c = str(c)
            numeric = re.fullmatch(r"[-+\[\]0-9., %x]+", c) is not None
            out.append(c.rjust(w) if numeric else c.ljust(w))
        return "| " + " | ".join(out) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] +
                     [line(r) for r in rows])



def analyse(cell):
    """The comparisons the report prints for one cell."""
    by = cell["first"]["results_by_plan"]
    tuned, ddp = by["tuned"], by["ddp"]
    others = [by[p] for p in PLANS if p != "tuned"]
    best = min(others, key=lambda r: r["iteration_us"])
    rep = cell["first"]
    a = {
        "actual_ratio": rep["comm"]["t_total_us"] / rep["backward_us"],
        "tuned_over_ddp": tuned["iteration_us"] / ddp["iteration_us"],
        "vs_ddp": compare(tuned, ddp),
        "best": best["plan"],
        "tuned_over_best": tuned["iteration_us"] / best["iteration_us"],
        "best_overlap": cis_overlap(tuned, best),
        "within_best_ci": best["iteration_ci95_us"][0] <= tuned["iteration_us"]
                          <= best["iteration_ci95_us"][1],
        "tuned_over_bound": tuned["iteration_us"] / tuned["bound_us"],
        "tuning_iterations": tuned.get("tuning_iterations"),
        "tuning_cost_ms": tuned.get("tuning_cost_us", 0) / 1e3,
        "chosen": tuned.get("chosen", "?"),
        "decision": tuned.get("decision", ""),
        "cache_ok": False,
    }
    second = cell["second"]
    if second is not None:
        t2, d2 = second["results_by_plan"]["tuned"], second["results_by_plan"]["ddp"]
        a["cache_ok"] = bool(t2.get("cache_hit")) and t2.get("tuning_iterations") == 0
        a["second"] = {
            "cache_hit": bool(t2.get("cache_hit")),
            "tuning_iterations": t2.get("tuning_iterations"),
            "same_plan": t2.get("plan_hash") == tuned.get("plan_hash"),
            "tuned": t2, "ddp": d2,
            "tuned_over_ddp": t2["iteration_us"] / d2["iteration_us"],
            "vs_ddp": compare(t2, d2),
        }
    return a


def describe_vs(v):
    return {"slower": "tuned slower beyond the CIs", "faster": "tuned faster beyond the CIs",
            "overlap": "CIs overlap"}[v]


def report_cell(rpt, cell, a):
    rep = cell["first"]
    by = rep["results_by_plan"]
    rpt(f"\n### {cell['model']}, {cell['ranks']} ranks, r = t(all)/T_backward = {cell['ratio']:g}"
        f" (compute scale {cell['scale']:.4g}; measured in this run: r = "
        f"{a['actual_ratio']:.2f}, t(all) = {ms(rep['comm']['t_total_us'])} ms, backward "
        f"{ms(rep['backward_us'])} ms)")
    if abs(a["actual_ratio"] / cell["ratio"] - 1) > 0.25:
        rpt(f"# note: this run's t(all) puts r at {a['actual_ratio']:.2f}, not "
            f"{cell['ratio']:g}: t(all) measured here differs from the calibration run's by more "
            f"than 25%")
    rows = []
    for p in PLANS:
        r = by[p]
        rows.append([p, r["buckets"], ms(r["iteration_us"]), ci_ms(r),
                     f"{r['iteration_us'] / r['bound_us']:.3f}",
                     f"{r['iteration_us'] / by['ddp']['iteration_us']:.3f}"])
    rpt(table(["plan", "buckets", "median ms", "95% CI ms", "iter/bound", "iter/ddp"], rows))
    tuned = by["tuned"]
    rpt(f"- tuned / DDP default: {a['tuned_over_ddp']:.3f} ({describe_vs(a['vs_ddp'])})")
    rpt(f"- tuned / best non-tuned ({a['best']}, {ms(by[a['best']]['iteration_us'])} ms "
        f"{ci_ms(by[a['best']])}): {a['tuned_over_best']:.3f}; CIs overlap: "
        f"{'yes' if a['best_overlap'] else 'no'}; tuned median inside its CI: "
        f"{'yes' if a['within_best_ci'] else 'no'}")
    rpt(f"- tuned / lower bound: {a['tuned_over_bound']:.3f} (bound {ms(tuned['bound_us'])} ms)")
    rpt(f"- tuning: {a['tuning_iterations']} iterations, cost {a['tuning_cost_ms']:.1f} ms "
        f"(beyond DDP's default); kept: {a['chosen']}")
    rpt(f"- decision: {a['decision'] or '(none given)'}")
    s = a.get("second")
    if s is None:
        rpt("- cache-hit run (ddp,tuned): FAILED, see the log")
    else:
        verdict = "OK" if a["cache_ok"] else "CHECK FAILED (expected a hit with 0 iterations)"
        rpt(f"- cache-hit run (ddp,tuned): {'hit' if s['cache_hit'] else 'MISS'}, "
            f"{s['tuning_iterations']} tuning iterations, same plan as above: "
            f"{'yes' if s['same_plan'] else 'NO'} -> {verdict}; tuned "
            f"{ms(s['tuned']['iteration_us'])} {ci_ms(s['tuned'])} vs ddp "
            f"{ms(s['ddp']['iteration_us'])} {ci_ms(s['ddp'])} ms, "
            f"tuned/ddp {s['tuned_over_ddp']:.3f} ({describe_vs(s['vs_ddp'])})")


def report_summary(rpt, cells):
    rpt("\n## Summary over all cells (first runs; medians of the slowest rank)")
    rows = []
    for cell, a in cells:
        by = cell["first"]["results_by_plan"]
        s = a.get("second")
        rows.append([cell["model"], cell["ranks"], f"{cell['ratio']:g}",
                     ms(by["ddp"]["iteration_us"]),
                     f"{a['best']} {ms(by[a['best']]['iteration_us'])}",
                     ms(by["tuned"]["iteration_us"]), f"{a['tuned_over_ddp']:.3f}",
                     a["vs_ddp"], f"{a['tuned_over_best']:.3f}",
                     "yes" if a["best_overlap"] else "no", f"{a['tuned_over_bound']:.3f}",
                     a["tuning_iterations"], f"{a['tuning_cost_ms']:.1f}", a["chosen"],
                     "failed" if s is None else
                     f"{'hit' if s['cache_hit'] else 'MISS'}, {s['tuning_iterations']} its"])
    rpt(table(["model", "ranks", "r", "ddp ms", "best non-tuned ms", "tuned ms", "tuned/ddp",
               "vs ddp CI", "tuned/best", "CI overlap", "tuned/bound", "tune its",
               "tune cost ms", "kept", "cache-hit run"], rows))
    n = len(cells)
    slower = sum(a["vs_ddp"] == "slower" for _, a in cells)
    faster = sum(a["vs_ddp"] == "faster" for _, a in cells)
    within = sum(a["within_best_ci"] for _, a in cells)
    overl = sum(a["best_overlap"] for _, a in cells)
    cache_ok = sum(a["cache_ok"] for _, a in cells)
    rpt(f"- tuned vs DDP default: slower beyond the CIs (tuned CI low > ddp CI high) in "
        f"{slower}/{n} cells, faster beyond the CIs in {faster}/{n}, CIs overlap in "
        f"{n - slower - faster}/{n}; tuned/ddp median over cells "
        f"{statistics.median(a['tuned_over_ddp'] for _, a in cells):.3f}")
    rpt(f"- tuned vs best non-tuned plan of the same run: tuned median inside that plan's CI in "
        f"{within}/{n} cells, CIs overlap in {overl}/{n}; tuned/best median over cells "
        f"{statistics.median(a['tuned_over_best'] for _, a in cells):.3f}, max "
        f"{max(a['tuned_over_best'] for _, a in cells):.3f}")
    rpt(f"- tuned / lower bound: median over cells "
        f"{statistics.median(a['tuned_over_bound'] for _, a in cells):.3f}")
    its = statistics.median(a["tuning_iterations"] or 0 for _, a in cells)
    rpt(f"- tuning iterations: median {its:g}; cache-hit runs with a hit and 0 tuning "
        f"iterations: {cache_ok}/{n}")


def report_validation(rpt, cells):
    rpt("\n## Simulator validation: predicted vs measured, first runs")
    rpt("# iteration error = (pred - meas) / meas; exposed = iteration - compute (forward + "
        "backward of the replay),\n# exposed error = (exposed_pred - exposed_meas) / "
        "exposed_meas, shown only where exposed_meas > 0")
    rows, it_err, ex_err, ex_abs = [], [], [], []
    for cell, _ in cells:
        for r in cell["first"]["results"]:
            pred, meas, comp = r.get("predicted_us", 0), r["iteration_us"], r["compute_us"]
            if not pred > 0:
                continue
            e = (pred - meas) / meas
            it_err.append(abs(e))
            ex_meas, ex_pred = meas - comp, pred - comp
            ex_abs.append(abs(ex_pred - ex_meas))
            if ex_meas > 0:
                ee = (ex_pred - ex_meas) / ex_meas
                ex_err.append(abs(ee))
                ee_txt = f"{100 * ee:+.1f}%"
            else:
                ee_txt = "n/a"
            rows.append([cell["model"], cell["ranks"], f"{cell['ratio']:g}", r["plan"], ms(pred),
                         ms(meas), f"{100 * e:+.1f}%", ms(ex_pred), ms(ex_meas), ee_txt])
    if not rows:
        rpt("# no predictions (the cost-model fit failed in every run)")
        return
    rpt(table(["model", "ranks", "r", "plan", "pred ms", "meas ms", "iter error",
               "exp pred ms", "exp meas ms", "exp error"], rows))
    rpt(f"# |iteration error|: median {100 * statistics.median(it_err):.1f}%, max "
        f"{100 * max(it_err):.1f}% over {len(it_err)} plan runs")
    rpt(f"# |exposed_pred - exposed_meas|: median {ms(statistics.median(ex_abs))} ms, max "
        f"{ms(max(ex_abs))} ms over {len(ex_abs)} plan runs")
    if ex_err:
        rpt(f"# |exposed error|: median {100 * statistics.median(ex_err):.1f}%, max "
            f"{100 * max(ex_err):.1f}% over {len(ex_err)} plan runs with exposed_meas > 0")
