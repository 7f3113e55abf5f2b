"""The analysis and report of perf/bench_trust.py (and perf/bench_rollback.py's decisions):
each run's whole-run and steady ratios, fusebox's decision in a few words, and the report's
markdown tables."""
import math
import os
import random
import re
import statistics

from toolkit import median_ci  # perf/toolkit.py: the shared statistics

TARGET = 1.02                # whole run, fusebox / plain
BEST_TARGET = 1.02           # the kept plan's judged median / the best plan's
PLAN_NAME = re.compile(r"^replaced .*? with (.+?): ")


def short_decision(fb):
    """fusebox's decision in a few words."""
    d = fb.get("decision") or ""
    if d.startswith("kept "):
        return "kept yours"
    m = PLAN_NAME.match(d)
    if m:
        return "replaced with %s" % m.group(1)
    if d.startswith("fell back"):
        return "fell back to yours"
    if not d:
        return "still tuning (%s)" % fb.get("phase")
    return d[:60]


def steady_ms(step_ms):
    """The median step over the last third of the steps."""
    tail = step_ms[len(step_ms) - max(1, len(step_ms) // 3):]
    return statistics.median(tail)


def step_noise(step_ms, first):
    """The spread of log(step_{i+1} / step_i) from step `first` on (1.4826 x
    their median absolute deviation): the size of the noise a check pair's
    log-ratio carries, which sets the detection delay (the table in Note
    [Catching small regressions], autotune/regression.h)."""
    tail = [t for t in step_ms[first:] if t > 0]
    logs = [math.log(b / a) for a, b in zip(tail, tail[1:])]
    if len(logs) < 2:
        return None
    med = statistics.median(logs)
    return 1.4826 * statistics.median(abs(v - med) for v in logs)


def signed_rank_k(pairs, alpha):
    """The rank of the tuner's bound (SignedRankRank in autotune/decision.h): the largest k with
    P(T+ <= k - 1) <= alpha for the Wilcoxon signed-rank statistic of `pairs` pairs under the
    null, exact; the bound is the k-th smallest Walsh average (0: none at that level)."""
    top = pairs * (pairs + 1) // 2
    p = [1.0] + [0.0] * top
    for r in range(1, pairs + 1):
        for s in range(r * (r + 1) // 2, -1, -1):
            p[s] = 0.5 * (p[s] + (p[s - r] if s >= r else 0.0))
    k, cdf = 0, 0.0
    for s in range(len(p) // 2):
        cdf += p[s]
        if cdf > alpha:
            break
        k = s + 1
    return k


def replace_power(gain, noise, max_pairs=36, look_every=6, alpha=0.025, early_share=0.2,
                  draws=2000, seed=1):
    """The chance that the tuner's verification (Note [Stopping verification early],
    autotune/decision.h) replaces your buckets with a challenger truly `gain` faster (a
    fraction), where a pair's log-ratio has spread `noise` (normal): up to `max_pairs` pairs;
    at a look every `look_every` a win (the signed-rank bound at 1 - early_share x alpha / looks
    above 0) ends it, as does a median gain not above 0; at the end the bound at
    1 - (1 - early_share) x alpha. alpha 0.025: each of two challengers. Seeded Monte Carlo."""
    rng = random.Random(seed)
    looks = list(range(look_every, max_pairs, look_every)) if look_every > 0 else []
    early = alpha * early_share / len(looks) if looks and early_share > 0 else 0.0
    final_k = max(signed_rank_k(max_pairs, alpha - early * len(looks)), 1)
    look_k = {m: signed_rank_k(m, early) for m in looks} if early > 0 else {}

    def bound(g, k):
        walsh = sorted((g[i] + g[j]) / 2 for i in range(len(g)) for j in range(i, len(g)))
        return walsh[k - 1]

    wins = 0
    for _ in range(draws):
        g = [1 - (1 - gain) * math.exp(rng.gauss(0, noise)) for _ in range(max_pairs)]
        for m in looks:
            if look_k.get(m, 0) >= 1 and bound(g[:m], look_k[m]) > 0:
                wins += 1
                break
            if statistics.median(g[:m]) <= 0:
                break
        else:
            wins += bound(g, final_k) > 0
    return wins / draws


def add_judge_arguments(ap):
    """The judge's measuring options, the same in perf/bench_trust.py and in its worker
    (which the driver passes them to); each adds its own --judge-blocks."""
    ap.add_argument("--judge-final-blocks", type=int, default=16, metavar="F",
                    help="then F blocks of the kept plan and the best other plan alone, ABBA: "
                         "the judged ratio (default: %(default)s)")
    ap.add_argument("--judge-steps", type=int, default=6, metavar="M",
                    help="timed steps per plan and selecting block (default: %(default)s)")
    ap.add_argument("--judge-final-steps", type=int, default=12, metavar="S",
                    help="timed steps per plan and measuring block (default: %(default)s)")


def check_judge_arguments(ap, args):
    if (args.judge_blocks < 0 or args.judge_steps < 1 or args.judge_final_blocks < 1
            or args.judge_final_steps < 1):
        ap.error("need --judge-blocks >= 0 and --judge-final-blocks, --judge-steps and "
                 "--judge-final-steps >= 1")


def judge_figures(judged):
    """The judging blocks (perf/trust_worker.py's judge()). Where the judge
    measured the kept plan against a challenger on steps of their own
    ("final_ms"), the judged ratio is the kept plan's median step over the
    challenger's on those steps; in runs before that, the kept plan's median
    over the lowest median of all plans on the same steps (which the winner's
    curse biases upwards). With per-block ratios' distribution-free interval.
    None without judging."""
    if not judged:
        return None
    kept, names = judged["kept"], judged["names"]
    medians = [statistics.median(ms) for ms in judged["step_ms"]]
    steps = judged.get("steps")
    if "final_ms" in judged:
        mine, theirs = judged["final_ms"]
        blocks, steps = judged["final_blocks"], judged.get("final_steps", steps)
        rival = judged["challenger"]
        ratio = statistics.median(mine) / statistics.median(theirs)
        best = kept if ratio <= 1 else rival
        split = (mine, theirs)
    else:
        best = min(range(len(medians)), key=medians.__getitem__)
        rival, blocks = best, judged.get("blocks")
        ratio = medians[kept] / medians[best] if kept is not None else None
        split = (judged["step_ms"][kept], judged["step_ms"][best]) if kept is not None else None
    out = {
        "names": names, "median_ms": medians, "best": names[best],
        "kept": names[kept] if kept is not None else None,
        "challenger": names[rival], "ratio": ratio,
        "samples": len(split[0]) if split else 0, "ratio_ci": None,
    }
    # The judge's own resolution: per block, the kept plan's median step over
    # the other's, and a distribution-free interval of their median.
    if split and steps and blocks and blocks > 1:
        per_block = [statistics.median(split[0][b * steps:(b + 1) * steps]) /
                     statistics.median(split[1][b * steps:(b + 1) * steps])
                     for b in range(blocks)]
        low, high, cov = median_ci(per_block)
        out["ratio_ci"] = [low, high, cov]
    return out


def t_quantile(p, df):
    """Student's t quantile (Cornish-Fisher expansion about the normal's;
    within 0.002 of the exact value at p = 0.975 from 5 degrees of freedom)."""
    z = statistics.NormalDist().inv_cdf(p)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def paired_ratio_ci(plain_ms, fused_ms, turn_steps, level=0.95):
    """The whole-run ratio sum(fused) / sum(plain) of two jobs that ran in
    turns of `turn_steps` steps, with a paired interval: per turn, d = fused's
    time minus plain's over the same steps; the sum of the d has the t
    interval n mean(d) +- t sqrt(n) sd(d); divided by plain's total, plus 1.
    None with fewer than 3 turns."""
    n = min(len(plain_ms), len(fused_ms)) // turn_steps
    if n < 3:
        return None
    d = [sum(fused_ms[b * turn_steps:(b + 1) * turn_steps]) -
         sum(plain_ms[b * turn_steps:(b + 1) * turn_steps]) for b in range(n)]
    total = sum(plain_ms[:n * turn_steps])
    half = t_quantile(0.5 + level / 2, n - 1) * math.sqrt(n) * statistics.stdev(d)
    return [1 + (sum(d) - half) / total, 1 + (sum(d) + half) / total]


def analyze_run(plain, fused):
    p_total, f_total = plain["total_s"], fused["total_s"]
    diff = max((abs(a - b) for a, b in zip(plain["losses"], fused["losses"])), default=0.0)
    fb = fused["fusebox"] or {}
    return {
        "plain_total_s": p_total, "fusebox_total_s": f_total,
        "ratio": f_total / p_total,
        "plain_steady_ms": steady_ms(plain["step_ms"]),
        "fusebox_steady_ms": steady_ms(fused["step_ms"]),
        "steady_ratio": steady_ms(fused["step_ms"]) / steady_ms(plain["step_ms"]),
        "decision": short_decision(fb), "decision_full": fb.get("decision"),
        "tuning_iterations": fb.get("tuning_iterations"), "fallbacks": fb.get("fallbacks"),
        "tuning_cost_ms": fb.get("tuning_cost_ms"), "phase": fb.get("phase"),
        "seed": fb.get("seed"), "plan": fb.get("plan"), "buckets": fb.get("buckets"),
        "loss_max_abs_diff": diff, "judged": judge_figures(fused.get("judge")),
        "plain_noise": step_noise(plain["step_ms"], len(plain["step_ms"]) // 3),
        "turn_steps": plain.get("turn_steps"),
        "ratio_ci": (paired_ratio_ci(plain["step_ms"], fused["step_ms"], plain["turn_steps"])
                     if plain.get("turn_steps") else None),
    }


def ci_text(values):
    low, high, cov = median_ci(values)
    if len(values) < 2:
        return "- (1 run)", cov
    return "[%.3f, %.3f]" % (low, high), cov


def caption(args, what):
    cores = os.cpu_count() or 0
    where = ("2 ranks on loopback (127.0.0.1, not shaped)" if args.link == "loopback" else
             "2 ranks in network namespaces on a %s tbf-shaped veth link" % args.link)
    return ("%s. Compute is EMULATED device time (host sleeps: %s profile, compute x%g, params "
            "x%g); %s, sharing a %d-core machine." % (what, args.profile, args.compute_scale,
                                                      args.param_scale, where, cores))


def tuning_cost(r):
    """The tuning's steps' time beyond your buckets' median (the hook's
    tuning_cost_ms), as a fraction of the plain run's total; None unknown."""
    cost = r.get("tuning_cost_ms")
    return cost / 1e3 / r["plain_total_s"] if cost is not None and r["plain_total_s"] else None


def cost_text(r):
    cost = tuning_cost(r)
    return "-" if cost is None else "%.1f%%" % (100 * cost)


def ratio_text(r):
    if r.get("ratio_ci"):
        return "%.3f [%.3f, %.3f]" % (r["ratio"], r["ratio_ci"][0], r["ratio_ci"][1])
    return "%.3f" % r["ratio"]


def whole_run_targets(runs):
    """The whole-run target rows: by the ratio, and where the jobs ran in
    turns, by its paired 95% interval both ways."""
    n = len(runs)
    within = sum(r["ratio"] <= TARGET for r in runs)
    rows = ["| whole run <= %.2fx plain DDP | %d | %d | %s |" % (
        TARGET, n, within, "PASS" if n and within == n else "FAIL")]
    paired = [r["ratio_ci"] for r in runs if r.get("ratio_ci")]
    if paired:
        not_over = sum(ci[0] <= TARGET for ci in paired)
        proven = sum(ci[1] <= TARGET for ci in paired)
        rows += [
            "| the same, counting only runs whose paired 95%% interval lies above %.2f as over "
            "| %d | %d | %s |" % (TARGET, len(paired), not_over,
                                  "PASS" if not_over == len(paired) else "FAIL"),
            "| the same, counting as within only runs whose paired 95%% interval lies at or "
            "below %.2f | %d | %d | %s |" % (TARGET, len(paired), proven,
                                            "PASS" if proven == len(paired) else "FAIL")]
    return rows


def judged_text(r):
    j = r.get("judged")
    if not j:
        return "-", "-"
    if j["ratio"] is None:
        return "not measured", j["best"]
    if j.get("ratio_ci"):
        return "%.3f [%.3f, %.3f]" % (j["ratio"], j["ratio_ci"][0], j["ratio_ci"][1]), j["best"]
    return "%.3f" % j["ratio"], j["best"]


def judge_target(runs):
    """The target row of the judged runs (none without judging blocks)."""
    judged = [r["judged"] for r in runs if r.get("judged")]
    if not judged:
        return []
    within = sum(j["ratio"] is not None and j["ratio"] <= BEST_TARGET for j in judged)
    rows = ["| kept plan <= %.2fx the best measured plan, judged in separate interleaved "
            "blocks | %d | %d | %s |" % (BEST_TARGET, len(judged), within,
                                         "PASS" if within >= 0.95 * len(judged) else "FAIL")]
    with_ci = [j for j in judged if j.get("ratio_ci")]
    if with_ci:
        clear = sum(j["ratio_ci"][0] <= BEST_TARGET for j in with_ci)
        rows.append("| the same, counting only runs whose interval over blocks lies above "
                    "%.2f as over | %d | %d | %s |" % (
                        BEST_TARGET, len(with_ci), clear,
                        "PASS" if clear >= 0.95 * len(with_ci) else "FAIL"))
    return rows


def format_report(args, runs_by_cap):
    """The report's tables (markdown) from {cap: [run analysis...]}."""
    lines = []
    all_runs = []
    summary_rows = []
    for cap in args.caps:
        runs = runs_by_cap.get(cap, [])
        if not runs:
            continue
        all_runs += runs
        lines += [
            "## cap %g MiB" % cap, "",
            caption(args, "Whole runs of %d steps, bucket_cap_mb=%g: plain DDP vs the same DDP "
                          "+ fusebox (tuning included); ratio = fusebox / plain, lower is faster; "
                          "steady = median step over the last %d steps"
                    % (args.steps, cap, max(1, args.steps // 3))),
            "",
            "| cap MiB | run | order | plain total s | fusebox total s | ratio | steady ratio "
            "| fusebox decision | tuning iterations | tuning cost | fallbacks "
            "| kept / best (judged) | best (judged) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in runs:
            lines.append("| %g | %d | %s | %.2f | %.2f | %s | %.3f | %s | %s | %s | %s | %s | %s |"
                         % ((cap, r["run"], r["order"], r["plain_total_s"], r["fusebox_total_s"],
                             ratio_text(r), r["steady_ratio"], r["decision"],
                             r["tuning_iterations"], cost_text(r), r["fallbacks"])
                            + judged_text(r)))
        lines.append("")
        ratios = [r["ratio"] for r in runs]
        ci, cov = ci_text(ratios)
        costs = [c for c in (tuning_cost(r) for r in runs) if c is not None]
        summary_rows.append("| %g | %d | %.3f | %s | %.1f%% | %d of %d | %.3f | %s |" % (
            cap, len(runs), statistics.median(ratios), ci, 100 * cov,
            sum(x <= TARGET for x in ratios), len(runs),
            statistics.median(r["steady_ratio"] for r in runs),
            "%.1f%%" % (100 * statistics.median(costs)) if costs else "-"))
    lines += [
        "## summary per cap", "",
        caption(args, "Median over runs of the whole-run ratio fusebox / plain, with a "
                      "distribution-free interval for the median (order statistics "
                      "[x(k), x(n+1-k)], the widest k whose coverage is at least 95%%; with "
                      "fewer than 6 runs that is [min, max], whose coverage is below 95%%: "
                      "5 runs 93.8%%, 4 runs 87.5%%, 3 runs 75%%); within = runs with ratio "
                      "<= %.2f; tuning cost = the tuning steps' time beyond your buckets' median, "
                      "as a share of the plain run" % TARGET),
        "",
        "| cap MiB | runs | median ratio | interval | coverage | within %.2f | steady median "
        "ratio | median tuning cost |" % TARGET,
        "|---|---|---|---|---|---|---|---|",
    ] + summary_rows + [""]
    lines += [
        "## targets", "",
        caption(args, "Targets over every run of every cap (caps %s MiB, %d runs each)"
                % (", ".join("%g" % c for c in args.caps), args.runs)),
        "",
        "| target | runs | within | result |",
        "|---|---|---|---|",
    ] + whole_run_targets(all_runs) + judge_target(all_runs) + [
        "",
    ]
    if all_runs:
        worst = max(all_runs, key=lambda r: r["ratio"])
        lines += [
            "worst whole-run ratio: %.3f (cap %g MiB, run %d, %s)"
            % (worst["ratio"], worst["cap"], worst["run"], worst["decision"]),
            "check: largest |loss(fusebox) - loss(plain)| over every step of every run: %g "
            "(fusebox changes when gradients are reduced, not what; 0 = bit for bit)"
            % max(r["loss_max_abs_diff"] for r in all_runs),
            "fusebox seeds (cap/run: seed): %s" % ", ".join(
                "%g/%d: %s" % (r["cap"], r["run"], r["seed"]) for r in all_runs),
        ]
        judged = [r for r in all_runs if r.get("judged") and r["judged"]["ratio"] is not None]
        if judged:
            worst = max(judged, key=lambda r: r["judged"]["ratio"])
            final = getattr(args, "judge_final_blocks", None)
            how = ("then the kept plan and the best other one alone in %d ABBA blocks of %d "
                   "timed steps each; kept / best = the kept plan's median step over the "
                   "other's on those blocks only (1 or less: the kept plan is the best)"
                   % (final, getattr(args, "judge_final_steps", None) or args.judge_steps)
                   if final
                   else "kept / best = the median step of the plan the tuner kept over the "
                   "lowest plan's median")
            lines.append(
                "judged: after each fusebox run's %d steps, every plan its tuner measured ran "
                "alone (no checks) in %d interleaved blocks of %d timed steps each, in a fresh "
                "random order per block; %s; worst %.3f (cap %g MiB, run %d: kept %s, best %s)"
                % (args.steps, args.judge_blocks, args.judge_steps, how,
                   worst["judged"]["ratio"], worst["cap"], worst["run"],
                   worst["judged"]["kept"], worst["judged"]["best"]))
        noises = [r["plain_noise"] for r in all_runs if r.get("plain_noise") is not None]
        if noises:
            noise = statistics.median(noises)
            lines += [
                "", "## the rule's power at this run's noise", "",
                "The step-to-step noise of plain DDP here (the spread of log(step i+1 / step i) "
                "over the last two thirds of each plain launch, 1.4826 x MAD; median over "
                "launches) is %.3f, and a verification pair carries about that much. The chance "
                "that fusebox's rule (up to 36 pairs; a look every 6 that ends it at a win, the "
                "signed-rank bound at 99.9%% above 0, or where the median gain is not above 0; "
                "then the bound at 98%% above 0; normal noise, 2000 seeded draws) replaces "
                "your buckets with a plan truly faster by:" % noise, "",
                "| faster by | P(replace) |", "|---|---|"] + [
                "| %g%% | %.3f |" % (100 * g, replace_power(g, noise))
                for g in (0.025, 0.03, 0.05, 0.10)] + [""]
    return "\n".join(lines) + "\n"
