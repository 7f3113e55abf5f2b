"""perf/bench_allreduce.py and perf/mpi_tools.py: OpenMPI's variants, the parsing of OpenMPI's
and fusebox-mpi-allreduce's output, the best-of families and the tie rule (pure functions: no
MPI needed)."""
import argparse
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "perf"))

import allreduce_stats  # noqa: E402
import bench_allreduce  # noqa: E402
import mpi_tools  # noqa: E402
from allreduce_report import FORMAT  # noqa: E402

# ------------------------------------------------------------------ OpenMPI's output

OMPI_INFO = """\
                 Package: Debian OpenMPI
                MCA coll: sm (MCA v2.1.0, API v2.0.0, Component v4.1.4)
                MCA coll: tuned (MCA v2.1.0, API v2.0.0, Component v4.1.4)
                MCA coll: adapt (MCA v2.1.0, API v2.0.0, Component v4.1.4)
                MCA coll: libnbc (MCA v2.1.0, API v2.0.0, Component v4.1.4)
                MCA coll: han (MCA v2.1.0, API v2.0.0, Component v4.1.4)
                 MCA pml: ob1 (MCA v2.1.0, API v2.0.0, Component v4.1.4)
                 MCA pml: ucx (MCA v2.1.0, API v2.0.0, Component v4.1.4)
"""

# coll_base_verbose 20 with coll_han_priority 100 on 2 local ranks (trimmed from a real run):
# han disqualifies itself on MPI_COMM_WORLD; sm is disabled there, enabled on nothing else.
HAN_LOG = """\
[vm:08194] coll:base:comm_select: new communicator: MPI_COMM_WORLD (cid 0)
[vm:08194] coll:base:comm_select: Checking all available modules
[vm:08194] coll:han:comm_query (0/MPI_COMM_WORLD): comm has only local processes; disqualifying myself
[vm:08194] coll:base:comm_select: component not available: han
[vm:08194] coll:base:comm_select: selecting          sm, priority   0, Disabled
[vm:08194] coll:base:comm_select: selecting      libnbc, priority  10, Enabled
[vm:08194] coll:base:comm_select: selecting       tuned, priority  30, Enabled
[vm:08194] coll:base:comm_select: new communicator: MPI_COMM_SELF (cid 1)
[vm:08194] coll:base:comm_select: selecting        self, priority  75, Enabled
[vm:08193] coll:base:comm_select: new communicator: MPI_COMM_WORLD (cid 0)
[vm:08193] coll:han:comm_query (0/MPI_COMM_WORLD): comm has only local processes; disqualifying myself
[vm:08193] coll:base:comm_select: selecting      libnbc, priority  10, Enabled
[vm:08193] coll:base:comm_select: selecting       tuned, priority  30, Enabled
"""


def sm_log(second_rank_enabled=True):
    """coll/sm forced to priority 100: enabled on MPI_COMM_WORLD on both ranks (or only on
    the first); on MPI_COMM_SELF it is never there."""
    out = []
    for pid, on in (("101", True), ("102", second_rank_enabled)):
        out += ["[vm:%s] coll:base:comm_select: new communicator: MPI_COMM_WORLD (cid 0)" % pid,
                "[vm:%s] coll:base:comm_select: selecting       tuned, priority  30, Enabled"
                % pid,
                "[vm:%s] coll:base:comm_select: selecting          sm, priority 100, %s"
                % (pid, "Enabled" if on else "Disabled"),
                "[vm:%s] coll:base:comm_select: new communicator: MPI_COMM_SELF (cid 1)" % pid,
                "[vm:%s] coll:base:comm_select: selecting        self, priority  75, Enabled"
                % pid]
    return "\n".join(out) + "\n"


def test_parse_ompi_info_lists_components_by_framework():
    got = mpi_tools.parse_ompi_info(OMPI_INFO)
    assert got == {"coll": ["sm", "tuned", "adapt", "libnbc", "han"], "pml": ["ob1", "ucx"]}


def test_world_selection_sees_han_disqualify_itself_and_only_world_counts():
    sel = mpi_tools.world_coll_selection(HAN_LOG)
    assert sel["han"] == (False, "comm has only local processes; disqualifying myself")
    assert sel["tuned"][0] and sel["libnbc"][0]
    assert not sel["sm"][0]
    assert "self" not in sel  # selected on MPI_COMM_SELF only


def test_probe_verdict_coll_component():
    why = mpi_tools.probe_verdict((("coll", "han"),), 0, HAN_LOG)
    assert "coll/han not used on MPI_COMM_WORLD" in why and "only local processes" in why
    assert mpi_tools.probe_verdict((("coll", "sm"),), 0, sm_log()) is None
    # Enabled on one rank only: not used (the ranks would run different algorithms).
    assert mpi_tools.probe_verdict((("coll", "sm"),), 0, sm_log(False)) is not None


def test_probe_verdict_pml_and_failed_start():
    ok = "[vm:1] select: component ucx selected\n[vm:2] select: component ucx selected\n"
    assert mpi_tools.probe_verdict((("pml", "ucx"),), 0, ok) is None
    ob1 = "[vm:1] select: component ob1 selected\n"
    assert mpi_tools.probe_verdict((("pml", "ucx"),), 0, ob1) == "pml ucx not selected (ob1)"
    failed = "------\n  Framework: pml\n------\n[vm:08346] PML ucx cannot be selected\n"
    why = mpi_tools.probe_verdict((("pml", "ucx"),), 1, failed)
    assert why == "does not start (exit status 1: Framework: pml)"


def test_doc_shape_of_the_baseline_json():
    # fusebox-mpi-allreduce writes "shape"; a JSON from a build before -z has none: blocking.
    assert mpi_tools.check_doc_shape({"shape": "nonblocking"}, mpi_tools.THROUGHPUT) is None
    assert mpi_tools.check_doc_shape({"shape": "wait_each"}, mpi_tools.WAIT_EACH) is None
    assert mpi_tools.check_doc_shape({"results": []}, mpi_tools.BLOCKING) is None
    assert mpi_tools.check_doc_shape({"results": []}, mpi_tools.THROUGHPUT) == \
        "ran blocking, asked for nonblocking"


# ------------------------------------------------------------------ variants

def test_variants_flags_and_shapes():
    vs = mpi_tools.make_variants([4], ("ob1", "ucx"), ("sm", "adapt", "ucc"), True, [1])
    assert list(vs) == ["mpi", "mpi-a4", "mpinb", "mpinb-a1", "mpiwe", "mpiwe-a1",
                        "mpi-ucx", "mpi-ucx-a4", "mpinb-ucx", "mpinb-ucx-a1", "mpiwe-ucx",
                        "mpiwe-ucx-a1", "mpi-sm", "mpi-ucc", "mpinb-ucc", "mpiwe-ucc"]
    assert vs["mpi-ucx-a4"].mca == mpi_tools.PML_UCX_MCA + [
        "--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm",
        "4"]
    assert vs["mpi-ucx-a4"].needs == (("pml", "ucx"),)
    assert vs["mpinb-a1"].mca == ["--mca", "coll_libnbc_iallreduce_algorithm", "1"]
    assert vs["mpiwe-a1"].shape == mpi_tools.WAIT_EACH
    assert vs["mpi-sm"].mca == ["--mca", "coll_sm_priority", "100"]
    assert vs["mpi"].mca == [] and vs["mpi"].needs == ()
    assert mpi_tools.SHAPE_ARGS[mpi_tools.WAIT_EACH] == ["-z", "0", "--wait_each", "1"]
    assert mpi_tools.SHAPE_ARGS[mpi_tools.BLOCKING] == []  # older builds lack -z
    assert mpi_tools.label(vs, "mpi-ucx-a4") == "mpi-ucx-a4 (tuned ring, pml ucx)"
    blocking_only = mpi_tools.make_variants([], ("ob1",), (), False, [1])
    assert list(blocking_only) == ["mpi"]


def test_with_mca_goes_after_oversubscribe():
    argv = ["mpirun", "-n", "2", "--oversubscribe", "bin"]
    assert mpi_tools.with_mca(argv, ["--mca", "a", "1"]) == [
        "mpirun", "-n", "2", "--oversubscribe", "--mca", "a", "1", "bin"]
    assert mpi_tools.with_mca(["mpiexec", "bin"], ["-x"]) == ["mpiexec", "-x", "bin"]


def test_probe_runs_once_per_requirement_and_world_size():
    vs = mpi_tools.make_variants([4], ("ob1", "ucx"), ("sm",), False, [])
    calls = []

    def run(argv, name):
        calls.append((argv, name))
        if "pml" in argv:  # the ucx variants: pretend the PML does not start
            return 1, "[vm:1] error\nPML ucx cannot be selected\n"
        return 0, sm_log()

    def argv_fn(k, n):  # as bench_allreduce's tools: the variant's flags are in its command
        return mpi_tools.with_mca(["mpirun", "-n", str(n), "--oversubscribe", "b"], vs[k].mca)

    skip, records = mpi_tools.probe(vs, list(vs), [2, 4], argv_fn, run)
    assert len(calls) == 4  # (pml ucx, coll sm) x (2, 4): mpi-ucx-a4 shares mpi-ucx's probe
    assert calls[0][0][-1 - len(mpi_tools.PROBE_ARGS):] == ["b"] + mpi_tools.PROBE_ARGS
    assert set(skip) == {("mpi-ucx", 2), ("mpi-ucx", 4), ("mpi-ucx-a4", 2), ("mpi-ucx-a4", 4)}
    assert skip[("mpi-ucx", 2)].startswith("does not start (exit status 1")
    assert [r["runs"] for r in records] == [False, False, True, True]
    assert "--mca" in calls[0][0] and "coll_base_verbose" in calls[0][0]


# ------------------------------------------------------------------ statistics

def st(times, reps=None, wrong=0):
    """A summarize()-like entry: median time and the samples with their repeats."""
    s = sorted(times)
    return {"time_us": s[len(s) // 2], "busbw": 1.0 / s[len(s) // 2], "wrong": wrong,
            "samples_time_us": list(times), "samples_rep": list(reps or range(len(times)))}


def test_summarize_keeps_each_sample_s_repeat():
    es = [{"bytes": 8, "oop": {"time_us": 2.0, "wrong": 0}, "_rep": 3},
          {"bytes": 8, "ip": {"time_us": 9.0}, "_rep": 4},          # no oop: skipped
          {"bytes": 8, "oop": {"time_us": 4.0, "wrong": 0}, "_rep": 5}]
    got = allreduce_stats.summarize(es, 8, 2, "oop")
    assert got["samples_time_us"] == [2.0, 4.0] and got["samples_rep"] == [3, 5]
    assert got["time_us"] == 3.0


def test_add_best_picks_the_lowest_median_among_correct_results_per_family():
    vs = mpi_tools.make_variants([1, 4], ("ob1",), (), True, [])
    stats = {("mpi", 2, 8): st([5, 5, 5]),
             ("mpi-a1", 2, 8): st([1, 1, 1], wrong=3),   # fastest but wrong: out
             ("mpi-a4", 2, 8): st([4, 6, 2]),            # median 4: the winner
             ("mpinb", 2, 8): st([0.5, 0.5, 0.5])}       # another family
    added = mpi_tools.add_best(stats, vs, list(vs), [(2, 8)])
    assert added == [("mpibest", 2, 8), ("mpinbbest", 2, 8)]
    best = stats[("mpibest", 2, 8)]
    assert best["best_tool"] == "mpi-a4" and best["best_of"] == "mpi-a4 (tuned ring)"
    assert best["samples_time_us"] == [4, 5, 2]          # repeat by repeat, of the correct
    assert best["winner_samples_time_us"] == [4, 6, 2]
    assert stats[("mpinbbest", 2, 8)]["best_tool"] == "mpinb"
    assert ("mpiwebest", 2, 8) not in stats


def test_paired_ratios_pair_by_repeat_against_the_winner():
    fb = st([2.0, 4.0, 5.0], reps=[0, 1, 2])
    mpi = dict(st([9, 9]), winner_samples_time_us=[4.0, 10.0], winner_samples_rep=[0, 2])
    assert mpi_tools.paired_ratios(fb, mpi) == [2.0, 2.0]  # repeat 1 has no MPI sample


def test_repeats_needed():
    assert mpi_tools.repeats_needed(0.95) == 6             # 1 - 2^-5 = 96.9%
    assert mpi_tools.repeats_needed(1 - 0.05 / 13) == 10   # 1 - 2^-9 = 99.8%
    assert mpi_tools.repeats_needed(0.5) == 2


def test_tie_rule_and_the_bonferroni_correction():
    # 10 repeats, one below 1.0: at 95% (one size) the interval [x(2), x(9)] is above 1; at
    # 1 - 0.05/13 it is [min, max], which contains 1.0: a tie.
    ratios = [0.95] + [1.10 + 0.01 * i for i in range(9)]
    one = mpi_tools.ratio_verdict(ratios, 1)
    assert one["verdict"] == "fusebox faster" and one["ci_low"] == pytest.approx(1.10)
    assert one["level"] == pytest.approx(0.95) and one["coverage"] >= 0.95
    many = mpi_tools.ratio_verdict(ratios, 13)
    assert many["verdict"] == "tie" and many["ci_low"] == 0.95
    assert many["level"] == pytest.approx(1 - 0.05 / 13) and not many["too_few_repeats"]
    # The mirror image: MPI faster.
    slow = mpi_tools.ratio_verdict([1 / r for r in ratios], 1)
    assert slow["verdict"] == "MPI faster" and slow["ci_high"] < 1.0
    # An interval that straddles 1.0 is a tie however many repeats.
    assert mpi_tools.ratio_verdict([0.9, 1.1] * 10, 1)["verdict"] == "tie"


def test_too_few_repeats_is_a_tie_even_when_every_ratio_is_above_one():
    v = mpi_tools.ratio_verdict([1.5, 1.6, 1.7, 1.8, 1.9], 1)   # 5 repeats: 93.75% < 95%
    assert v["too_few_repeats"] and v["verdict"] == "tie"
    assert (v["ci_low"], v["ci_high"]) == (1.5, 1.9)
    assert mpi_tools.ratio_verdict([], 1)["verdict"] == "tie"


def test_comparison_section_counts_sizes_for_the_correction():
    stats = {}
    # fusebox twice as fast, MPI within 5% either way repeat by repeat, fusebox twice as slow.
    for b, fb_t, mpi_t in ((8, [1.0] * 12, [2.0] * 12), (1024, [2.0] * 12, [1.9, 2.1] * 6),
                           (1 << 20, [4.0] * 12, [2.0] * 12)):
        stats[("ucxz", 2, b)] = st([t * (1 + 0.001 * i) for i, t in enumerate(fb_t)])
        stats[("mpibest", 2, b)] = dict(st(mpi_t), best_of="mpi (default)")
    stats[("ucxz", 2, 64)] = st([1.0] * 12)  # no MPI at 64 B: not compared, not counted
    lines, summary = mpi_tools.comparison_section(stats, 2, [8, 64, 1024, 1 << 20], FORMAT)
    text = "\n".join(lines)
    assert "### Blocking: ucxz vs mpibest" in text
    assert "Bonferroni over the 3 sizes" in text and "98.33% = 1 - 0.05/3" in text
    verdicts = [s["verdict"] for s in summary[0]["sizes"]]
    assert verdicts == ["fusebox faster", "tie", "MPI faster"]
    assert summary[0]["sizes_compared"] == 3 and summary[0]["correction"] == "bonferroni"
    assert "1 fusebox faster, 1 tie, 1 MPI faster" in text
    assert "Too few repeats" not in text


def test_arguments_expand_to_variants_without_running_mpi():
    p = argparse.ArgumentParser()
    args = bench_allreduce.parse_args(["--tools", "mpi", "--ranks", "2", "--mpi-algorithms", "4",
                                       "--mpi-components", "sm", "--mpi-nb-algorithms", "2",
                                       "--mpi-pmls", "ob1", "--ompi-info", "/nonexistent"])
    assert args.tools == ["mpi", "mpi-a4", "mpinb", "mpinb-a2", "mpiwe", "mpiwe-a2", "mpi-sm"]
    assert args.ompi_components == {}
    mpi_tools.add_arguments(p)
    ns = p.parse_args(["--mpi-pmls", "psm2"])
    ns.emulate, ns.tools, ns.mpi_algorithms = None, ["mpi"], []
    with pytest.raises(SystemExit):
        mpi_tools.finish_arguments(p, ns, lambda cmd: (1, ""))
