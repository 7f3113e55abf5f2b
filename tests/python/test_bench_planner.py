"""Tests for perf/bench_planner.py: the rotation, the ratios to the first binary, and the check
that every binary prints the same results, with stand-in binaries (shell scripts that sleep).

    /usr/bin/python3 -m pytest -q tests/python/test_bench_planner.py
"""
import json
import os
import stat
import sys

import pytest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "perf"))

import bench_planner  # noqa: E402


def _script(tmp_path, name, sleep_s, output="plan A\n"):
    path = tmp_path / name
    path.write_text("#!/bin/sh\nsleep %s\nprintf '%s'\n" % (sleep_s, output.replace("\n", "\\n")))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_the_slower_binary_shows_a_ratio_above_one_and_a_summary_is_written(tmp_path, capsys):
    fast = _script(tmp_path, "fast", 0.02)
    slow = _script(tmp_path, "slow", 0.12)
    out = tmp_path / "out"
    assert bench_planner.main(["--binary", "fast=" + fast, "--binary", "slow=" + slow,
                               "--rounds", "3", "--out", str(out), "--", "sweep"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("| slow |"))
    ratio = float(row.split("|")[3].split()[0])
    assert ratio > 2.0, text       # 0.12 s against 0.02 s, plus the start of a shell each
    assert "| fast | " in text and text.count("# round") == 3
    summary = json.load(open(out / "result.json"))
    assert summary["benchmark"] == "bench_planner"
    assert summary["tables"][0]["columns"][0] == "binary"


def test_a_binary_whose_results_differ_fails_the_run(tmp_path):
    a = _script(tmp_path, "a", 0, "plan A\n")
    b = _script(tmp_path, "b", 0, "plan B\n")
    with pytest.raises(SystemExit) as e:
        bench_planner.main(["--binary", "a=" + a, "--binary", "b=" + b, "--rounds", "1"])
    assert "other results" in str(e.value)


def test_bad_arguments_are_refused(tmp_path):
    a = _script(tmp_path, "a", 0)
    for argv in (["--binary", "a=" + a], ["--binary", "a=" + a, "--binary", "a=" + a],
                 ["--binary", "a=/nonexistent", "--binary", "b=" + a],
                 ["--binary", "a=" + a, "--binary", "b=" + a, "--rounds", "0"]):
        with pytest.raises(SystemExit):
            bench_planner.parse_args(argv)
