"""The analysis and report of perf/bench_ddp_hook.py: per setting (model, link), each cell's
median step over its rounds with a distribution-free interval, the ratios to DDP's default and
to the best hand-set cap of each round, where the step's time goes, and the printed section."""
import statistics

from toolkit import median_ci  # perf/toolkit.py: the shared statistics

CELLS = ("ddp25", "ddp1", "ddp5", "ddp100", "fusebox", "nocomm")
CAPS = ("ddp1", "ddp5", "ddp25", "ddp100")
REDUCING = CAPS + ("fusebox",)  # nocomm reduces nothing: its losses are its own
NOISE_RULE = ("fusebox's median > ddp25's median and fusebox's first quartile > ddp25's "
              "third quartile (over the measured steps of that round)")
PHASES = ("forward", "backward", "optimizer")


def describe(values):
    """{'median', 'ci': [low, high], 'coverage'} of a list of per-round figures."""
    low, high, cov = median_ci(values)
    return {"median": statistics.median(values), "ci": [low, high], "coverage": cov}


def analyze(rounds):
    """The across-round figures of one setting from its rounds' worker results."""
    cells = {}
    cells_here = [c for c in CELLS if all(c in r["cells"] for r in rounds)]  # older runs: no nocomm
    per_round = {c: [r["cells"][c]["median_ms"] for r in rounds] for c in cells_here}
    best_cap = [min(r["cells"][c]["median_ms"] for c in CAPS) for r in rounds]
    for c in cells_here:
        ms = per_round[c]
        cells[c] = {
            "per_round_ms": ms,
            "ms": describe(ms),
            # Paired within each round: the median over blocks of this cell's
            # step / ddp25's step of the same block.
            "ratio_vs_ddp25": describe([r["cells"][c]["paired_ratio_vs_ddp25"] for r in rounds]),
            "ratio_vs_best_cap": describe([a / b for a, b in zip(ms, best_cap)]),
            # Where the step's time goes: medians over rounds of each phase.
            "phases_ms": {ph: statistics.median(r["cells"][c]["phases_ms"][ph] for r in rounds)
                          for ph in PHASES},
        }
    fb = [r["cells"]["fusebox"] for r in rounds]
    d25 = [r["cells"]["ddp25"] for r in rounds]
    slower = [i + 1 for i, (f, d) in enumerate(zip(fb, d25))
              if f["median_ms"] > d["median_ms"] and f["q1_ms"] > d["q3_ms"]]
    fusebox = {
        "speedup_vs_ddp25": describe([1 / r["cells"]["fusebox"]["paired_ratio_vs_ddp25"]
                                      for r in rounds]),
        "speedup_vs_best_cap": describe([b / f for b, f in zip(best_cap, per_round["fusebox"])]),
        "best_cap_per_round": [min(CAPS, key=lambda c: r["cells"][c]["median_ms"])
                               for r in rounds],
        "tuning_iterations": [f["tuning_iterations"] for f in fb],
        "tuning_cost_ms": [f["tuning_cost_ms"] for f in fb],
        "steps_to_tuned": [f["steps_to_tuned"] for f in fb],
        "chosen": [{"plan": f["plan"], "buckets": f["buckets"], "cache_hit": f["cache_hit"],
                    "decision": f["decision"]} for f in fb],
        "rounds_not_tuned_within_budget": [i + 1 for i, f in enumerate(fb)
                                           if not f["tuning_finished"]],
        "rounds_slower_than_ddp25_beyond_noise": slower,
        "noise_rule": NOISE_RULE,
    }
    checks = {
        "all_final_losses_finite": all(r["cells"][c]["loss_finite"] for r in rounds
                                       for c in cells_here),
        "max_loss_diff_vs_ddp25": max(r["cells"][c]["loss_max_abs_diff_vs_ddp25"]
                                      for r in rounds for c in REDUCING),
    }
    if all("nocomm" in r["cells"] for r in rounds):
        # The headroom, per round: what no bucketing can beat, and how much of
        # ddp25's exposed communication (its step minus nocomm's) a cell removed.
        # Rounds where ddp25 exposed nothing (nocomm as slow) have no share to give.
        def ms(r, c):
            return r["cells"][c]["median_ms"]
        exposing = [r for r in rounds if ms(r, "ddp25") > ms(r, "nocomm")]
        fusebox["headroom_vs_ddp25"] = describe([ms(r, "ddp25") / ms(r, "nocomm")
                                                 for r in rounds])
        fusebox["rounds_with_exposed_communication"] = len(exposing)
        if exposing:
            fusebox["exposed_removed"] = describe(
                [(ms(r, "ddp25") - ms(r, "fusebox")) / (ms(r, "ddp25") - ms(r, "nocomm"))
                 for r in exposing])
            fusebox["exposed_removed_by_best_cap"] = describe(
                [(ms(r, "ddp25") - min(ms(r, c) for c in CAPS)) /
                 (ms(r, "ddp25") - ms(r, "nocomm")) for r in exposing])
    return {"rounds": len(rounds), "cells": cells, "fusebox": fusebox, "checks": checks}


def format_setting(setting, result, args):
    """The report section of one setting (a markdown table and summary lines)."""
    def ci(d, fmt):
        return ("[" + fmt + ", " + fmt + "]") % tuple(d["ci"])

    n = result["rounds"]
    cov = result["cells"]["ddp25"]["ms"]["coverage"]
    lines = [
        "## %s" % setting,
        "%d rounds; per round: fusebox tunes from an empty cache (at most %d steps), then %d "
        "blocks of one step of every cell in a random order, the last %d measured; a cell's "
        "figure is the median of the slowest rank's measured steps" % (
            n, args.tune_steps, args.steps, args.measure),
        "intervals: order-statistic CI of the median over rounds, %.1f%% coverage" % (100 * cov),
        "x ddp25: the median over blocks of cell step / ddp25 step in the same block (paired; "
        "lower is faster); x best cap: cell ms / the fastest of %s in that round, chosen in "
        "hindsight" % "/".join(CAPS),
        "",
        "| cell | median ms | CI ms | x ddp25 | CI | x best cap | CI |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in result["cells"]:
        r = result["cells"][c]
        lines.append("| %s | %.1f | %s | %.3f | %s | %.3f | %s |" % (
            c, r["ms"]["median"], ci(r["ms"], "%.1f"),
            r["ratio_vs_ddp25"]["median"], ci(r["ratio_vs_ddp25"], "%.3f"),
            r["ratio_vs_best_cap"]["median"], ci(r["ratio_vs_best_cap"], "%.3f")))
    lines += [
        "",
        "where a step's time goes (ms; medians over rounds of each phase's median; forward "
        "includes zero_grad and the hook's step start, backward DDP's wait for its buckets):",
        "",
        "| cell | forward | backward | optimizer |",
        "|---|---|---|---|",
    ]
    for c in result["cells"]:
        ph = result["cells"][c]["phases_ms"]
        lines.append("| %s | %.1f | %.1f | %.1f |" % (c, ph["forward"], ph["backward"],
                                                    ph["optimizer"]))
    fb = result["fusebox"]
    tuning = fb["tuning_iterations"]
    cost = fb["tuning_cost_ms"]
    lines += [
        "",
        "fusebox speedup (reference ms / fusebox ms, higher is faster): vs ddp25 %.3fx %s, "
        "vs best cap %.3fx %s" % (
            fb["speedup_vs_ddp25"]["median"], ci(fb["speedup_vs_ddp25"], "%.3f"),
            fb["speedup_vs_best_cap"]["median"], ci(fb["speedup_vs_best_cap"], "%.3f")),
        "fusebox tuning: iterations median %g, max %d; cost ms median %.0f, max %.0f; "
        "rounds not tuned within %d steps: %s" % (
            statistics.median(tuning), max(tuning), statistics.median(cost), max(cost),
            args.tune_steps, ", ".join(map(str, fb["rounds_not_tuned_within_budget"])) or "none"),
        "best cap per round: %s" % ", ".join(fb["best_cap_per_round"]),
    ]
    if "headroom_vs_ddp25" in fb:
        def pct(d):
            return "%.0f%% [%.0f%%, %.0f%%]" % (100 * d["median"], 100 * d["ci"][0],
                                              100 * d["ci"][1])
        lines.append(
            "headroom (nocomm, no allreduce at all): ddp25 / nocomm %.3fx %s is the most any "
            "bucketing could gain here" % (fb["headroom_vs_ddp25"]["median"],
                                           ci(fb["headroom_vs_ddp25"], "%.3f")))
        if "exposed_removed" in fb:
            lines.append(
                "share of ddp25's exposed communication (ddp25 - nocomm) removed, over the %d "
                "rounds where ddp25 exposed any: fusebox %s, best cap %s" % (
                    fb["rounds_with_exposed_communication"], pct(fb["exposed_removed"]),
                    pct(fb["exposed_removed_by_best_cap"])))
    lines += [
        "rounds where fusebox kept a plan slower than ddp25 beyond that round's noise: "
        "%d of %d%s (rule: %s)" % (
            len(fb["rounds_slower_than_ddp25_beyond_noise"]), n,
            (" (rounds %s)" % ", ".join(map(str, fb["rounds_slower_than_ddp25_beyond_noise"]))
             if fb["rounds_slower_than_ddp25_beyond_noise"] else ""), fb["noise_rule"]),
        "checks: final losses finite in every cell: %s; largest |loss - ddp25 loss| over the "
        "measured blocks (every reducing cell starts from the same state and sees the same "
        "batches): "
        "%g" % (
            "yes" if result["checks"]["all_final_losses_finite"] else "NO",
            result["checks"]["max_loss_diff_vs_ddp25"]),
        "fusebox chose, per round:",
    ]
    for i, c in enumerate(fb["chosen"]):
        lines.append("  round %d: %s (%s buckets%s), %d tuning iterations, tuned after %s "
                     "steps: %s" % (
                         i + 1, c["plan"], c["buckets"], ", cache hit" if c["cache_hit"] else "",
                         tuning[i], fb["steps_to_tuned"][i], c["decision"]))
    return "\n".join(lines) + "\n"
