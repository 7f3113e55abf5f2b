"""Tests for perf/bench_ddp_scaling.py: its analysis (ring transfer and lower bound,
PyTorch's pre-bucketing rule, DDP's bucket assignment, the statistics and the held-out
choice of the best cap, the report and its summary), pure Python; and a smoke run
(2 emulated hosts, a few steps, every cell) that needs root and `ip netns`, and prints
SKIPPED (and passes) without them.

    /usr/bin/python3 -m pytest -q tests/python/test_bench_ddp_scaling.py
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

import pytest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "perf"))

import bench_ddp_scaling as bs  # noqa: E402
import results  # noqa: E402

MIB = 1 << 20


# ------------------------------------------------------------ bound and rule

def test_ring_transfer_is_two_p_minus_one_over_p():
    # 1 MB at 8 Mbit/s is 1 s on the wire; a ring sends 2 (p-1)/p of it.
    assert bs.ring_transfer_s(1e6, 2, 8e6) == pytest.approx(1.0)
    assert bs.ring_transfer_s(1e6, 4, 8e6) == pytest.approx(1.5)
    assert bs.ring_transfer_s(1e6, 8, 8e6) == pytest.approx(1.75)
    assert bs.ring_transfer_s(1e6, 1, 8e6) == 0.0


def test_lower_bound_takes_the_larger_path():
    # Transfer of everything from the first ready gradient dominates ...
    assert bs.lower_bound_s(0.01, 0.02, 0.001, 1e3, 1e6, 2, 8e6) == pytest.approx(
        0.01 + 0.001 + 1.0)
    # ... or backward's end plus the last gradient's transfer does.
    assert bs.lower_bound_s(0.01, 2.0, 0.0, 1e6, 1e6, 2, 8e6) == pytest.approx(0.01 + 2.0 + 1.0)
    # More hosts, more ring steps: the bound grows toward 2x the bytes.
    b2 = bs.lower_bound_s(0.0, 0.0, 0.0, 0.0, 1e6, 2, 8e6)
    b8 = bs.lower_bound_s(0.0, 0.0, 0.0, 0.0, 1e6, 8, 8e6)
    assert b8 == pytest.approx(1.75 * b2)


def test_pytorch_rule_formula_and_clamp():
    # 9 x (base + (p-1) hops) x bandwidth: p=8, 1 ms each, 100 MB/s -> 7.2 MB.
    cap, raw = bs.pytorch_prebucket_cap_mb(8, 100e6, 1e-3)
    assert raw == pytest.approx(9 * 8e-3 * 100e6 / MIB)
    assert cap == 50.0                      # the floor
    cap, raw = bs.pytorch_prebucket_cap_mb(2, 10e9, 5e-3, base_latency_s=0.0)
    assert raw == pytest.approx(9 * 5e-3 * 10e9 / MIB)
    assert cap == pytest.approx(raw)        # inside [50, 2000]
    assert bs.pytorch_prebucket_cap_mb(64, 100e9, 1e-3)[0] == 2000.0   # the ceiling
    assert bs.pytorch_prebucket_cap_mb(1, 100e9, 1e-3) == (50.0, 0.0)
    # Grows with the world size: (p - 1) latency steps.
    assert (bs.pytorch_prebucket_cap_mb(8, 1e9, 1e-3)[1] >
            bs.pytorch_prebucket_cap_mb(2, 1e9, 1e-3)[1])


def test_ddp_bucket_assignment_first_bucket_then_cap():
    sizes = [600_000] * 5
    assert bs.ddp_bucket_bytes(sizes, ["f"] * 5, MIB) == [1_200_000, 1_200_000, 600_000]
    # A cap under 1 MiB also caps the first bucket.
    assert bs.ddp_bucket_bytes(sizes, ["f"] * 5, 500_000) == [600_000] * 5
    # A large cap: the 1 MiB first bucket, then everything else.
    assert bs.ddp_bucket_bytes(sizes, ["f"] * 5, 100 * MIB) == [1_200_000, 1_800_000]
    # Dtypes never share a bucket; each has its own first bucket.
    assert sorted(bs.ddp_bucket_bytes([10, 20, 30], ["a", "b", "a"], MIB)) == [20, 40]
    assert sum(bs.ddp_bucket_bytes(sizes, ["f"] * 5, 5 * MIB)) == sum(sizes)


# ------------------------------------------------------------------ statistics

def _cell(ms, fusebox=False, finished=True, excluded=None):
    c = {"step_ms": ms, "tuning_step_ms": [50.0] * 7 if fusebox else [],
         "tuning_finished": finished, "cpu_busy": 0.5, "rank_cpu_cores": 1.0,
         "fusebox": {"phase": "tuned"} if fusebox else None}
    if excluded:
        c["excluded"] = excluded
    return c


def _launch(repeat, caps, fb, fbw, fb_done=True, warm_excluded=None):
    cells = {c: _cell([v - 1, v, v + 1]) for c, v in caps.items()}
    cells["noallreduce"] = _cell([80.0, 80.0, 80.0])
    cells["fusebox"] = _cell([fb] * 3, fusebox=True, finished=fb_done)
    cells["fusebox_warm"] = _cell([fbw] * 3, fusebox=True, excluded=warm_excluded)
    return {"cells": cells, "repeat": repeat, "launch_s": 30.0 + repeat}


def _caps(ddp25, cap1, cap5, cap100, pytorch):
    return dict(ddp25=ddp25, cap1=cap1, cap5=cap5, cap100=cap100, pytorch=pytorch)


def test_best_cap_is_chosen_on_odd_repeats_and_reported_on_even_ones():
    # cap1 wins repeats 1 and 3 (selection); cap5 wins repeats 2 and 4 (held out).
    ls = [_launch(1, _caps(150, 100, 120, 150, 150), 110, 105),
          _launch(2, _caps(150, 130, 90, 150, 150), 99, 90),
          _launch(3, _caps(150, 101, 121, 150, 150), 110, 105),
          _launch(4, _caps(150, 140, 95, 150, 150), 95, 100)]
    a = bs.analyze_hosts(ls)
    assert a["best_cap"] == "cap1"          # not cap5: chosen without the held-out half
    assert a["held_out"] == 2 and a["repeats"] == 4
    assert a["best_held_ms"]["median"] == pytest.approx(135.0)   # cap1 on repeats 2, 4
    r = a["ratio_fusebox"]
    assert r["n"] == 2 and r["median"] == pytest.approx((99 / 130 + 95 / 140) / 2)
    assert a["cells"]["cap5"]["median"] == pytest.approx((95 + 120) / 2)   # of 90, 95, 120, 121
    assert a["tuning_steps"] == [7, 7, 7, 7] and a["not_tuned"] == 0
    assert a["launch_s"] == [31.0, 32.0, 33.0, 34.0]


def test_untuned_and_excluded_fusebox_cells_are_not_compared():
    ls = [_launch(1, _caps(150, 100, 120, 150, 150), 110, 105, warm_excluded="none cached"),
          _launch(2, _caps(150, 100, 120, 150, 150), 500, 90, fb_done=False)]
    a = bs.analyze_hosts(ls)
    assert a["not_tuned"] == 1
    assert a["cells"]["fusebox"]["n"] == 1 and a["cells"]["fusebox"]["median"] == 110
    assert a["ratio_fusebox"]["n"] == 0     # the held-out repeat's fusebox did not tune
    assert a["ratio_fusebox_warm"]["median"] == pytest.approx(0.9)
    assert a["cells"]["fusebox_warm"]["n"] == 1


def test_single_repeat_is_reported_in_sample():
    a = bs.analyze_hosts([_launch(1, _caps(150, 100, 120, 150, 150), 110, 105)])
    assert a["held_out"] == 0 and a["best_cap"] == "cap1"
    assert a["ratio_fusebox"]["median"] == pytest.approx(1.1)


def test_nearest_world_follows_the_policy_cache():
    assert bs.nearest_world([2, 8], 4) == 8     # equal ratio: the larger
    assert bs.nearest_world([2, 16], 4) == 2
    assert bs.nearest_world([], 4) is None


def _shared_cache(root, entry=lambda w: {"key": {"world_size": w}}):
    """Setting "s"'s shared cache under `root`, one entry per world size 2, 4 and 8."""
    shared = os.path.join(root, "cache", "s")
    os.makedirs(shared)
    for w in (2, 4, 8):
        with open(os.path.join(shared, "sig-w%d-r1-x.json" % w), "w") as f:
            json.dump(entry(w), f)
    return shared


def test_warm_cache_leaves_out_the_own_world_size():
    root = tempfile.mkdtemp()
    try:
        _shared_cache(root)
        cold, warm, worlds = bs.prepare_caches(root, "s", "t", 4)
        assert worlds == [2, 8] and os.listdir(cold) == []
        assert sorted(os.listdir(warm)) == ["sig-w2-r1-x.json", "sig-w8-r1-x.json"]
    finally:
        shutil.rmtree(root)


# ---------------------------------------------------------------------- report

def test_report_tables_become_a_valid_summary():
    ls = [_launch(r, _caps(150, 100 + r, 120, 150, 150), 110, 105) for r in (1, 2, 3)]
    for i, l in enumerate(ls):
        l.update(setting="s", hosts=2, tag="s-h2-r%d" % (i + 1), order=list(bs.CELLS), seed=i,
                 launch_cpu_busy=0.5, warm_from=None)
    fig = {"label": "EMULATED", "buckets": "ddp25 2", "forward_s": 0.01, "backward_s": 0.02,
           "first_ready_s": 0.0, "last_bytes": 10, "total_bytes": 1e6, "rate_bps": 8e6,
           "pt": {2: (50.0, 0.1)}, "sizes": [MIB // 2] * 4, "dtypes": ["torch.float32"] * 4}
    args = types.SimpleNamespace(hosts=[2])
    text = bs.build_report(args, {"s": fig}, ls, ["# cmd"])
    tables, _ = results.parse_report(text)
    assert [t["name"] for t in tables] == ["s", "s-2"]
    main, side = tables
    assert main["columns"][:3] == ["hosts", "bound", "noallreduce"]
    assert main["rows"][0][0] == "2" and main["rows"][0][1] == "1010.0"   # 10 + 1000 ms
    assert main["rows"][0][main["columns"].index("cap1")] == "102.0 [101.0, 103.0]"
    assert side["rows"][0][side["columns"].index("best cap")] == "cap1"
    summary = results.make_summary(text, "bench_ddp_scaling", "cmd", "t", "abc", "2026-01-01",
                                   "vm")
    results.validate_summary(summary, "test")


# ------------------------------------------------------------------------ smoke

def _skip_reason():
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None or subprocess.run(
            ["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "ip netns unavailable"
    if os.environ.get("FUSEBOX_PYTHON_DIR", None) == "":
        # Under ctest in a build without fusebox.torch (the sanitizer builds):
        # another build's module is not this build's to test.
        return "this build has no fusebox.torch"
    py = os.environ.get("FUSEBOX_PYTHON_DIR") or os.path.join(ROOT, "build", "python")
    if subprocess.run(["/usr/bin/python3", "-c", "import fusebox.torch"], capture_output=True,
                      env=dict(os.environ, PYTHONPATH=py)).returncode != 0:
        return "fusebox.torch not built in %s" % py
    return None


def test_smoke_two_and_three_hosts_every_cell():
    why = _skip_reason()
    if why:
        print("SKIPPED: %s" % why)
        return
    py = os.environ.get("FUSEBOX_PYTHON_DIR") or os.path.join(ROOT, "build", "python")
    out = tempfile.mkdtemp(prefix="fusebox-scaling-smoke.")
    try:
        cmd = ["/usr/bin/python3", os.path.join(ROOT, "perf", "bench_ddp_scaling.py"),
               "--hosts", "2,3", "--repeats", "1", "--steps", "3", "--warmup", "1",
               "--tune-steps", "60", "--compute-scale", "0.1", "--prefix", "fbst",
               "--subnet", "99", "--port", "29700", "--seed", "5", "--out", out,
               "--build", os.path.dirname(py), "--timeout", "120"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        raw = json.load(open(os.path.join(out, "raw", "resnet50-comm1.5x-h2-r1.json")))
        assert sorted(raw["cells"]) == sorted(bs.CELLS)
        assert all(len(c["step_ms"]) == 3 for c in raw["cells"].values())
        assert raw["cells"]["fusebox"]["fusebox"]["phase"]   # the hook's snapshot came back
        assert raw["cells"]["fusebox_warm"]["excluded"] == "no other size cached"
        # At 3 hosts the plan tuned at 2 runs untuned (the cross-size matrix), and the
        # fusebox cell brought its tuner's predictions back (the simulator beside the cells).
        raw3 = json.load(open(os.path.join(out, "raw", "resnet50-comm1.5x-h3-r1.json")))
        assert sorted(raw3["cells"]) == sorted(bs.CELLS + ("from2",))
        assert raw3["cells"]["from2"]["fusebox"]["phase"] == "fixed"
        assert raw3["cells"]["fusebox"]["fusebox"]["measured"]
        report = open(os.path.join(out, "report.md")).read()
        assert "| tuned at | run at 2 | run at 3 |" in report
        summary = json.load(open(os.path.join(out, "result.json")))
        results.validate_summary(summary, "smoke")
        assert "fbsth0" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                              text=True).stdout   # torn down
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_the_global_cap_is_the_lowest_mean_ratio_to_each_settings_best():
    """perf/ddp_scaling_global.py: the cap closest to each setting's best on
    average, read from the summaries' median tables (first number of a cell)."""
    import ddp_scaling_global as g
    summary = {"tables": [
        {"name": "a", "columns": ["hosts", "bound", "ddp25", "cap1", "cap5", "cap100",
                                  "pytorch", "fusebox"],
         "rows": [["2", "1", "100 [99, 101]", "110", "100", "100", "100", "98"],
                  ["8", "1", "200", "300", "200", "200", "200", "210"]]},
        {"name": "a-2", "columns": ["hosts", "repeats"], "rows": [["2", "6"]]}]}
    medians = g.medians_of(summary)
    assert medians[("a", 2)]["ddp25"] == 100.0 and ("a-2", 2) not in medians
    best, means = g.global_cap(medians)
    # cap1 is 1.10 and 1.50 of the best: mean 1.30; the others 1.0 in both (a
    # tie goes to the first listed, ddp25).
    assert abs(means["cap1"] - 1.3) < 1e-12 and best == "ddp25"
    text = g.report(medians, ["x.json"])
    assert "| a | 8 | 200.0 | ddp25 | 200.0 | 210.0 | 1.050 | 1.050 |" in text


def test_the_hook_cost_is_hooked_over_ddp25_in_the_same_launch():
    """--hook-cost: per launch, the hooked cell's median step over ddp25's."""
    def cell(ms, **kw):
        return dict({"step_ms": ms}, **kw)
    launches = [{"cells": {"ddp25": cell([100.0, 100.0, 102.0]),
                           "hooked": cell([103.0, 104.0, 103.0], fusebox={"phase": "fixed"},
                                          tuning_finished=True)}},
                {"cells": {"ddp25": cell([200.0]), "hooked": cell([210.0])}},
                {"cells": {"ddp25": cell([100.0])}}]   # no hooked cell: not counted
    d = bs.hook_cost(launches)
    assert d["n"] == 2 and d["median"] == pytest.approx((1.03 + 1.05) / 2)
    assert bs.hook_cost(launches[2:]) is None
    text = "\n".join(bs.format_hook_cost("s", {8: d, 4: None}))
    assert "| 8 | 1.040 [1.030, 1.050] (2) |" in text and "| 4 |" not in text
    assert bs.format_hook_cost("s", {4: None}) == []


def test_the_bound_targets_count_removal_where_there_is_headroom_and_nearness_where_reached():
    """perf/ddp_scaling_global.py's targets against the lower bound."""
    import ddp_scaling_global as g
    summary = {"tables": [
        {"name": "a", "columns": ["hosts", "bound", "noallreduce", "ddp25", "cap1", "cap5",
                                  "cap100", "pytorch", "fusebox"],
         # 2 hosts: headroom 1.5, fusebox removes 40 of 50 ms (80%), within 1.05 of the bound
         # as cap1 is; 4 hosts: headroom 1.2 (no removal target), nothing near the bound;
         # 8 hosts: headroom 2.0, fusebox removes 50 of 100 ms (50%).
         "rows": [["2", "100", "90", "150", "104", "150", "150", "150", "110"],
                  ["4", "100", "90", "120", "115", "120", "120", "120", "112"],
                  ["8", "100", "130", "200", "190", "200", "200", "200", "150"]]}]}
    medians = g.medians_of(summary)
    assert medians[("a", 2)]["bound"] == 100.0
    rows = {r[1]: r for r in g.bound_rows(medians)}
    assert rows[2][4] == "cap1" and abs(rows[2][7] - 0.8) < 1e-12
    assert rows[8][4] == "fusebox" and abs(rows[8][7] - 0.5) < 1e-12 and rows[8][8] == 1.3
    text = "\n".join(g.bound_report(medians))
    # Removal: 2 and 8 hosts have the headroom, only 2 removes 75%; nearness: only 2 has a
    # plan within 1.05 (cap1, 1.04), and fusebox there is 1.10.
    assert "where ddp25 / bound >= 1.3 | 2 | 1 | FAIL |" in text
    assert "where some measured plan is | 1 | 0 | FAIL |" in text
    assert "| a | 8 | 100.0 | 2.000 | fusebox | 1.500 | 1.500 | 50% | 1.300 |" in text


# ------------------------------------------------------------ the plot

def test_plot_reads_every_setting_of_a_committed_summary_and_writes_an_image(tmp_path):
    import plot_ddp_scaling as plot
    assert plot.parse_cell("146.2 [143.7, 148.7]") == (146.2, 143.7, 148.7)
    assert plot.parse_cell("102.7") == (102.7, 102.7, 102.7)
    assert plot.parse_cell("-") is None
    path = os.path.join(ROOT, "docs", "results", "data", "ddp-scaling",
                        "resnet50-comm0.5x-gpt2small-comm1.5x-500mbit.json")
    with open(path) as f:
        summary = json.load(f)
    panels = plot.settings(summary)
    # Two settings in that run; each has the bound, no allreduce and fusebox at every size.
    assert [title for title, _ in panels] == ["resnet50-comm0.5x", "gpt2_small-comm1.5x"]
    for _, series in panels:
        for cell in ("bound", "noallreduce", "ddp25", "fusebox"):
            assert [p[0] for p in series[cell]] == [2, 4, 8], cell
        for _, med, lo, hi in series["fusebox"]:
            assert lo <= med <= hi
    out = tmp_path / "scaling.png"
    assert plot.main([path, "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        plot.main([os.path.join(ROOT, "docs", "results", "data", "ddp-scaling",
                                "global-cap.json"), "--out", str(tmp_path / "x.png")])


# ---------------------------------------------------------- cross-size matrix

def test_cross_plans_are_the_other_sizes_entries_as_plan_files():
    root = tempfile.mkdtemp()
    try:
        shared = _shared_cache(root, lambda w: {
            "key": {"world_size": w}, "plan": {"format": "fusebox-plan", "name": "tuned%d" % w}})
        with open(os.path.join(shared, "notes.txt"), "w") as f:
            f.write("not an entry")
        plans = bs.cross_plans(root, "s", "s-h4-r1", 4)
        assert sorted(plans) == ["from2", "from8"]          # not its own size
        assert json.load(open(plans["from8"]))["name"] == "tuned8"
        assert bs.cross_plans(root, "other", "t", 4) == {}   # nothing cached yet
    finally:
        shutil.rmtree(root)


def test_cross_matrix_is_each_plan_over_the_sizes_own_fusebox_in_the_same_launch():
    ls = [_launch(r, _caps(150, 100, 120, 150, 150), fb, 105) for r, fb in ((1, 100), (2, 110))]
    ls[0]["cells"]["from8"] = _cell([104.0] * 3, fusebox=True)   # 1.04 x fusebox
    ls[1]["cells"]["from8"] = _cell([121.0] * 3, fusebox=True)   # 1.10 x
    ls[1]["cells"]["from2"] = _cell([99.0] * 3, fusebox=True, finished=False)  # not compared
    a = bs.analyze_hosts(ls)
    assert sorted(a["cross"]) == ["from2", "from8"]
    assert a["cross"]["from8"]["n"] == 2
    assert a["cross"]["from8"]["median"] == pytest.approx((1.04 + 1.10) / 2)
    assert a["cross"]["from2"]["n"] == 0
    b = bs.analyze_hosts([_launch(1, _caps(150, 100, 120, 150, 150), 100, 105)])
    b["cross"] = {"from4": bs.describe([0.95])}
    lines = bs.format_cross({4: (a, 0, None), 8: (b, 0, None)})
    assert "| tuned at | run at 4 | run at 8 |" in lines
    assert "| 4 | 1 (itself) | 0.950 (1) |" in lines
    assert "| 8 | 1.070 [1.040, 1.100] (2) | 1 (itself) |" in lines
    assert "| 2 | - | - |" in lines
    assert bs.format_cross({8: (dict(b, cross={}), 0, None)}) == []


# ------------------------------------------------------- simulator beside cells

def test_each_fixed_cell_takes_the_prediction_of_the_tuners_plan_with_its_buckets():
    # 8 tensors of 1 MiB: caps 5 and 25 give different buckets; 25, 100 and a 50 MiB
    # pytorch cap the same two (the 1 MiB first bucket and the rest).
    fig = {"sizes": [MIB] * 8, "dtypes": ["torch.float32"] * 8}
    names = bs.tuner_names(fig, 50.0)
    assert names == {"ddp25": "ddp", "cap1": "ddp-cap1mb", "cap5": "ddp-cap5mb",
                     "cap100": "ddp", "pytorch": "ddp"}


def _predicting_launch(repeat, measured, predicted, kept="tuned", tail=10.0):
    cells = {c: _cell([v] * 3) for c, v in measured.items() if c != "fusebox"}
    cells["fusebox"] = _cell([measured["fusebox"]] * 3, fusebox=True)
    cells["fusebox"]["fusebox"].update(plan=kept, tail_ms=tail, measured=[
        {"name": n, "predicted_ms": p, "measured_ms": 0.0} for n, p in predicted.items()])
    return {"cells": cells, "repeat": repeat}


def test_predictions_are_the_tuners_plus_the_tail_and_pairs_are_judged_by_order():
    names = {"ddp25": "ddp", "cap1": "ddp-cap1mb", "cap5": "ddp", "cap100": "ddp",
             "pytorch": "ddp"}
    measured = dict(ddp25=150.0, cap1=100.0, cap5=150.0, cap100=150.0, pytorch=150.0,
                    fusebox=100.0)
    # The tuner predicts 130 for DDP's default and 95 for cap1 and its tuned plan: +10 ms
    # tail gives 140 (-6.7%) and 105 (+5%).
    predicted = {"ddp": 130.0, "ddp-cap1mb": 95.0, "tuned": 95.0}
    ls = [_predicting_launch(r, {c: v + r for c, v in measured.items()}, predicted)
          for r in (1, 2, 3)]
    assert bs.predicted_steps(ls[0], names)["cap5"] == 140.0
    assert bs.predicted_steps(ls[0], names)["fusebox"] == 105.0
    sim = bs.analyze_predictions(ls, names)
    assert sim["predicted"]["cap1"]["median"] == 105.0
    assert sim["errors"]["cap1"] == pytest.approx([105 / 101 - 1, 105 / 102 - 1, 105 / 103 - 1])
    # Significant pairs: each large-cap cell against cap1 and fusebox (intervals apart);
    # cap1 and fusebox overlap, and the large-cap cells are one plan (equal predictions).
    assert len(sim["pairs"]) == 8 and all(ok for _, _, ok in sim["pairs"])
    # A prediction that orders a significant pair the other way is counted as wrong.
    wrong = {"ddp": 90.0, "ddp-cap1mb": 95.0, "tuned": 95.0}
    ls = [_predicting_launch(r, {c: v + r for c, v in measured.items()}, wrong)
          for r in (1, 2, 3)]
    sim = bs.analyze_predictions(ls, names)
    assert len(sim["pairs"]) == 8 and not any(ok for _, _, ok in sim["pairs"])
    lines = bs.format_sim({2: ({"sim": sim}, 0, None)})
    assert any("ordered as measured by the predictions: 0" in x for x in lines)
    # No prediction (a launch without a fitted model): no section.
    none = [_predicting_launch(1, measured, {}, tail=None)]
    assert bs.format_sim({2: ({"sim": bs.analyze_predictions(none, names)}, 0, None)}) == []
