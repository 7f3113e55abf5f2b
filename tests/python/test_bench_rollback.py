"""perf/bench_rollback.py's analysis: each run's outcome from what the worker
reported, and the verdict over runs; and perf/trust_report.py, which it shares
with perf/bench_trust.py (no launch: the drivers' launches need root and
minutes; perf/trust_worker.py's injector runs in those)."""
import os
import sys
import types

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "perf"))

import bench_rollback as rb  # noqa: E402

STEPS = 500


def launch(decided_at=None, inject_at=None, fallback_at=None, base=100.0, kept=80.0):
    inj = {"fraction": 0.03, "after": 30, "decided_at": decided_at, "inject_at": inject_at,
           "fallback_at": fallback_at, "extra_ms": 23.0, "injected_steps": 10,
           "baseline_ms": base if decided_at is not None else None,
           "kept_ms": kept if decided_at is not None else None}
    decision = ("replaced your DDP buckets (100 MiB) with ddp-cap1mb: ..." if decided_at
                is not None else "kept your DDP buckets (100 MiB): ...")
    return {"fusebox": {"seed": 7, "decision": decision, "buckets": 5, "checks": 12,
                        "fallbacks": int(fallback_at is not None), "injection": inj}}


def test_each_run_gets_the_outcome_its_steps_say():
    r = rb.analyze(launch(40, 70, 250), STEPS)
    assert r["outcome"] == "rolled back" and r["delay_steps"] == 180
    assert abs(r["gain"] - 0.2) < 1e-12
    assert r["decision"] == "replaced with ddp-cap1mb"
    assert rb.analyze(launch(40, 70, None), STEPS)["outcome"] == "not rolled back in 430 steps"
    assert rb.analyze(launch(40, 70, 60), STEPS)["outcome"] == "fell back before the injection"
    assert rb.analyze(launch(480, 510, None), STEPS)["outcome"] == "kept late: no step injected"
    assert rb.analyze(launch(), STEPS)["outcome"] == "kept yours: nothing to regress"


def args(runs):
    return types.SimpleNamespace(inject=0.03, cap=100.0, steps=STEPS, inject_after=30,
                                 link="1gbit", profile="resnet50", compute_scale=1.0,
                                 param_scale=0.1, runs=runs)


def verdict_row(report):
    return report.strip().splitlines()[-1]


def test_the_verdict_counts_only_runs_that_kept_a_plan_and_needs_nine_in_ten():
    rolled = [rb.analyze(launch(40, 70, 200 + i), STEPS) for i in range(9)]
    missed = rb.analyze(launch(40, 70, None), STEPS)
    nothing = rb.analyze(launch(), STEPS)
    report = rb.format_report(args(11), rolled + [missed, nothing])
    row = verdict_row(report)
    assert row.startswith("| 11 | 10 | 9 |"), row
    assert ">= 9 of 10" in row and row.endswith("PASS |"), row
    # Two misses in ten: below 90%.
    report = rb.format_report(args(10), rolled[:8] + [missed, missed])
    assert verdict_row(report).endswith("FAIL |")
    # No run kept a plan: nothing was shown.
    assert verdict_row(rb.format_report(args(2), [nothing, nothing])).endswith("FAIL |")
    # The per-run table lists every run, the delay where it rolled back.
    assert sum(line.endswith("| rolled back |") for line in report.splitlines()) == 8


def test_step_noise_is_the_robust_spread_of_step_to_step_log_ratios():
    # Constant steps have no noise; a known cycle of three step times gives
    # 1.4826 x the median absolute deviation of its log-ratios.
    import math
    assert rb.step_noise([100.0] * 50, 0) == 0.0
    steps = [100.0, 110.0, 121.0] * 20
    ratios = [math.log(b / a) for a, b in zip(steps, steps[1:])]
    med = sorted(ratios)[len(ratios) // 2]
    want = 1.4826 * sorted(abs(v - med) for v in ratios)[len(ratios) // 2]
    assert abs(rb.step_noise(steps, 0) - want) < 1e-12
    # Only the steps from `first` on count.
    assert rb.step_noise([1000.0, 1.0] + [100.0] * 10, 2) == 0.0
    assert rb.step_noise([100.0], 0) is None


def test_trust_report_reads_decisions_and_judges_every_run_against_the_target():
    import argparse
    import trust_report
    assert trust_report.short_decision({"decision": "kept your DDP buckets (5 MiB): ..."}) == \
        "kept yours"
    assert trust_report.short_decision(
        {"decision": "replaced your DDP buckets (100 MiB) with ddp-cap5mb: median gain"}) == \
        "replaced with ddp-cap5mb"
    assert trust_report.short_decision({"phase": "screening"}) == "still tuning (screening)"
    plain = {"total_s": 50.0, "losses": [1.0, 0.5], "step_ms": [100.0] * 30}
    fused = {"total_s": 52.0, "losses": [1.0, 0.5], "step_ms": [100.0] * 20 + [90.0] * 10,
             "fusebox": {"decision": "kept your DDP buckets (5 MiB): x", "seed": 7}}
    r = trust_report.analyze_run(plain, fused)
    assert r["ratio"] == 52.0 / 50.0 and r["steady_ratio"] == 0.9
    assert r["loss_max_abs_diff"] == 0 and r["decision"] == "kept yours"
    args = argparse.Namespace(caps=[5.0], runs=2, steps=30, link="loopback", profile="resnet50",
                              compute_scale=1.0, param_scale=1.0)
    ok = dict(r, run=1, cap=5.0, order="plain, fusebox", ratio=1.01)
    over = dict(r, run=2, cap=5.0, order="fusebox, plain", ratio=1.03)
    report = trust_report.format_report(args, {5.0: [ok]})
    assert "| whole run <= 1.02x plain DDP | 1 | 1 | PASS |" in report
    report = trust_report.format_report(args, {5.0: [ok, over]})
    assert "| whole run <= 1.02x plain DDP | 2 | 1 | FAIL |" in report
    assert "worst whole-run ratio: 1.030 (cap 5 MiB, run 2, kept yours)" in report


def test_trust_report_judges_the_kept_plan_against_the_best_it_measured():
    import argparse
    import trust_report
    # Plan 1 was kept; plan 2 is 3% faster in the judging blocks (medians,
    # the slowest rank's steps): kept / best = 1.03, over the 2% target.
    judged = {"names": ["ddp-cap5mb", "tuned", "ddp"], "kept": 1,
              "step_ms": [[110.0, 111.0, 109.0], [103.0, 500.0, 103.0], [100.0, 99.0, 101.0]]}
    j = trust_report.judge_figures(judged)
    assert j["best"] == "ddp" and j["kept"] == "tuned"
    assert abs(j["ratio"] - 1.03) < 1e-12 and j["median_ms"] == [110.0, 103.0, 100.0]
    assert trust_report.judge_figures(None) is None
    assert trust_report.judge_figures(dict(judged, kept=None))["ratio"] is None
    plain = {"total_s": 50.0, "losses": [1.0], "step_ms": [100.0] * 30}
    fused = {"total_s": 50.0, "losses": [1.0], "step_ms": [100.0] * 30, "judge": judged,
             "fusebox": {"decision": "replaced your DDP buckets (5 MiB) with tuned: x"}}
    slow = dict(trust_report.analyze_run(plain, fused), run=1, cap=5.0, order="plain, fusebox")
    best = dict(judged, kept=2)
    fine = [dict(trust_report.analyze_run(plain, dict(fused, judge=best)), run=k, cap=5.0,
                 order="plain, fusebox") for k in range(2, 21)]
    args = argparse.Namespace(caps=[5.0], runs=20, steps=30, link="loopback",
                              profile="resnet50", compute_scale=1.0, param_scale=1.0,
                              judge_blocks=1, judge_steps=3)
    row = "| kept plan <= 1.02x the best measured plan, judged in separate interleaved blocks"
    # 19 of 20 within: the target holds; 18 of 19 does not.
    assert row + " | 20 | 19 | PASS |" in trust_report.format_report(args, {5.0: [slow] + fine})
    assert row + " | 19 | 18 | FAIL |" in trust_report.format_report(args,
                                                                     {5.0: [slow] + fine[1:]})
    report = trust_report.format_report(args, {5.0: [slow] + fine})
    assert "worst 1.030 (cap 5 MiB, run 1: kept tuned, best ddp)" in report
    assert "| 1.030 | ddp |" in report


def test_the_judged_ratio_has_an_interval_over_blocks_and_a_clear_loss_is_counted_apart():
    import argparse
    import trust_report
    # Each plan's samples are its blocks' in turn: 3 blocks of 2 steps.
    judged = {"names": ["kept", "best"], "kept": 0, "blocks": 3, "steps": 2,
              "step_ms": [[105.0, 105.0, 104.0, 104.0, 103.0, 103.0], [100.0] * 6]}
    j = trust_report.judge_figures(judged)
    assert j["ratio"] == pytest.approx(1.04)
    assert j["ratio_ci"][:2] == pytest.approx([1.03, 1.05])   # 3 blocks: [min, max]
    close = dict(judged, step_ms=[[101.0, 101.0, 104.0, 104.0, 103.0, 103.0], [100.0] * 6])
    assert trust_report.judge_figures(close)["ratio_ci"][0] == pytest.approx(1.01)
    plain = {"total_s": 50.0, "losses": [1.0], "step_ms": [100.0] * 30}
    fused = {"total_s": 50.0, "losses": [1.0], "step_ms": [100.0] * 30,
             "fusebox": {"decision": "kept your DDP buckets (5 MiB): x"}}
    runs = [dict(trust_report.analyze_run(plain, dict(fused, judge=judged)), run=1, cap=5.0,
                 order="plain, fusebox"),
            dict(trust_report.analyze_run(plain, dict(fused, judge=close)), run=2, cap=5.0,
                 order="fusebox, plain")]
    args = argparse.Namespace(caps=[5.0], runs=2, steps=30, link="loopback",
                              profile="resnet50", compute_scale=1.0, param_scale=1.0,
                              judge_blocks=3, judge_steps=2)
    report = trust_report.format_report(args, {5.0: runs})
    assert "| 1.040 [1.030, 1.050] | best |" in report
    # Both over 1.02 by their medians; only the first clearly (its interval above it).
    assert "judged in separate interleaved blocks | 2 | 0 | FAIL |" in report
    assert "lies above 1.02 as over | 2 | 1 | FAIL |" in report


def test_the_measuring_blocks_are_split_by_their_own_step_count():
    import trust_report
    # Selection visits of 1 step, measuring visits of 3: the final blocks'
    # per-block ratios come from 3-step slices (1.03, 1.01), not 1-step ones.
    judged = {"names": ["kept", "other"], "kept": 0, "blocks": 2, "steps": 1,
              "step_ms": [[101.0, 102.0], [100.0, 100.0]], "challenger": 1,
              "final_blocks": 2, "final_steps": 3,
              "final_ms": [[103.0, 103.0, 120.0, 101.0, 101.0, 90.0], [100.0] * 6]}
    j = trust_report.judge_figures(judged)
    assert j["ratio"] == pytest.approx(1.02) and j["samples"] == 6
    assert j["ratio_ci"][:2] == pytest.approx([1.01, 1.03])
    # Runs from before final_steps was stored split by the selection's steps.
    old = dict(judged, steps=3)
    del old["final_steps"]
    assert trust_report.judge_figures(old)["ratio_ci"][:2] == pytest.approx([1.01, 1.03])


def test_the_rules_power_falls_with_noise_and_stays_at_its_level_for_equal_plans():
    import trust_report
    # The tuner's ranks (SignedRankRank, autotune/decision.h): P(T+ <= 5) = 10/256 for 8 pairs.
    assert trust_report.signed_rank_k(8, 0.05) == 6 and trust_report.signed_rank_k(5, 0.05) == 1
    assert trust_report.signed_rank_k(4, 0.05) == 0          # 4 pairs cannot reach 95%
    assert trust_report.signed_rank_k(24, 0.05) == 92
    assert trust_report.replace_power(0.05, 0.0) == 1.0
    assert trust_report.replace_power(0.0, 0.0) == 0.0       # no gain: the first look ends it
    # Equal plans: at most the rule's level (2.5% per challenger), with Monte Carlo slack.
    assert trust_report.replace_power(0.0, 0.08, draws=4000) <= 0.035
    assert (trust_report.replace_power(0.05, 0.03) > trust_report.replace_power(0.05, 0.08)
            > trust_report.replace_power(0.03, 0.08))
