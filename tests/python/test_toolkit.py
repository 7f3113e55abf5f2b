"""perf/toolkit.py: the helpers the benchmark drivers share (median, the
order-statistic interval of the median, size parsing, the command runner)."""
import argparse
import math
import os
import random
import re
import sys
from fractions import Fraction

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "perf"))

import toolkit  # noqa: E402


# ------------------------------------------------------------------ median

def test_median_of_odd_and_even_counts():
    assert toolkit.median([3, 1, 2]) == 2
    assert toolkit.median([5]) == 5
    assert toolkit.median([4, 1, 3, 2]) == 2.5           # the mean of the middle two
    assert toolkit.median([1, 3]) == 2.0
    assert toolkit.median([10.0, -1.0, 7.0, 7.0, 2.0, 100.0]) == 7.0
    assert toolkit.median(x for x in (9, 8, 7)) == 8      # any iterable
    assert toolkit.median([]) is None


def test_median_leaves_its_input_alone():
    xs = [3, 1, 2]
    toolkit.median(xs)
    assert xs == [3, 1, 2]


# --------------------------------------------------------------- median_ci

def coverage(n, k):
    """P(x_(k) <= true median <= x_(n+1-k)) = P(k <= Binomial(n, 1/2) <= n - k), exactly."""
    return Fraction(sum(math.comb(n, j) for j in range(k, n - k + 1)), 2 ** n)


def reference_rank(n, level):
    """The largest k (1-based, k <= (n+1)/2) with coverage >= level; 1 when none has."""
    ks = [k for k in range(1, (n + 1) // 2 + 1) if coverage(n, k) >= level]
    return max(ks) if ks else 1


def test_median_ci_hand_worked_small_samples():
    # n = 5: [min, max] covers 1 - 2/32 = 93.75% < 95%: too few values, [min, max].
    lo, hi, cov = toolkit.median_ci([5, 3, 1, 4, 2])
    assert (lo, hi) == (1, 5) and cov == pytest.approx(30 / 32)
    # n = 6: [min, max] covers 1 - 2/64 = 96.9%; [x_(2), x_(5)] 1 - 14/64 = 78.1%.
    lo, hi, cov = toolkit.median_ci([6, 1, 5, 2, 4, 3])
    assert (lo, hi) == (1, 6) and cov == pytest.approx(62 / 64)
    # n = 8 (as autotune's decision_test): P(B <= 1) = 9/256, so k = 2: [x_(2), x_(7)], 93.0%
    # at 90%; at 95% only [min, max] (1 - 2/256 = 99.2%).
    v = [5, 1, 7, 3, 8, 2, 6, 4]
    lo, hi, cov = toolkit.median_ci(v, level=0.90)
    assert (lo, hi) == (2, 7) and cov == pytest.approx(1 - 18 / 256)
    assert toolkit.median_ci(v)[:2] == (1, 8)
    # n = 12: P(B <= 2) = 79/4096 (1.9% per side), P(B <= 3) = 299/4096 (7.3%): k = 3.
    lo, hi, cov = toolkit.median_ci(range(1, 13))
    assert (lo, hi) == (3, 10) and cov == pytest.approx(1 - 2 * 79 / 4096)
    # n = 3 and fewer: [min, max] whatever its coverage.
    assert toolkit.median_ci([2, 9, 4]) == (2, 9, pytest.approx(0.75))
    assert toolkit.median_ci([1.5, 2.5])[:2] == (1.5, 2.5)
    assert toolkit.median_ci([7])[:2] == (7, 7)


def test_median_ci_is_the_binomial_definition():
    for n in range(1, 60):
        xs = list(range(100, 100 + n))
        random.Random(n).shuffle(xs)
        for level in (0.5, 0.8, 0.9, 0.95, 0.99):
            k = reference_rank(n, level)
            lo, hi, cov = toolkit.median_ci(xs, level)
            assert (lo, hi) == (100 + k - 1, 100 + n - k), (n, level)
            assert cov == pytest.approx(float(coverage(n, k)), rel=1e-12), (n, level)
            if coverage(n, 1) >= level:    # the interval reaches the level ...
                assert cov >= level
                if k + 1 <= (n + 1) // 2:  # ... and the next narrower one does not
                    assert coverage(n, k + 1) < level


def test_median_ci_bounds_the_median_and_handles_large_and_empty_samples():
    rng = random.Random(3)
    xs = [rng.lognormvariate(0, 1) for _ in range(2000)]   # large n: no float overflow
    lo, hi, cov = toolkit.median_ci(xs)
    assert lo <= toolkit.median(xs) <= hi and 0.95 <= cov < 0.96
    lo, hi, cov = toolkit.median_ci([])
    assert math.isnan(lo) and math.isnan(hi) and math.isnan(cov)


def test_median_ci_covers_as_often_as_it_claims():
    rng = random.Random(7)
    trials, covered = 2000, 0
    for _ in range(trials):
        lo, hi, _ = toolkit.median_ci([rng.lognormvariate(0, 0.5) for _ in range(15)])
        covered += lo <= 1.0 <= hi   # the lognormal's median is exactly 1
    assert covered >= 0.94 * trials


# -------------------------------------------------------------- parse_size

@pytest.mark.parametrize("text, size", [
    ("8", 8), ("0", 0), (" 64 ", 64), (4096, 4096),
    ("1K", 1024), ("1k", 1024), ("64M", 64 << 20), ("2G", 2 << 30),
    ("64MB", 64 << 20), ("64mb", 64 << 20), ("1Kb", 1024), ("1.5K", 1536),
    ("0.5M", 512 << 10), ("1e3", 1000), ("1 K", 1024),
])
def test_parse_size_accepts(text, size):
    assert toolkit.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "abc", "1T", "8B", "64MiB", "1KK", "0x10", "B", "inf",
                                  "nan", "1e400"])
def test_parse_size_rejects_naming_the_text(text):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape("bad size: " + repr(text))):
        toolkit.parse_size(text)


def test_parse_size_rejects_negative_sizes():
    with pytest.raises(argparse.ArgumentTypeError, match="negative size: '-1K'"):
        toolkit.parse_size("-1K")


def test_parse_size_is_an_argparse_type():
    p = argparse.ArgumentParser()
    p.add_argument("-b", type=toolkit.parse_size)
    assert p.parse_args(["-b", "4M"]).b == 4 << 20
    with pytest.raises(SystemExit):
        p.parse_args(["-b", "lots"])


# --------------------------------------------------------------------- run

PY = sys.executable


def test_run_returns_the_exit_code_and_the_merged_output(tmp_path):
    code, out = toolkit.run([PY, "-c", "import sys; print('out'); sys.stdout.flush(); "
                             "print('err', file=sys.stderr); sys.exit(3)"], timeout=30)
    assert code == 3 and out == "out\nerr\n"
    assert toolkit.run([PY, "-c", "pass"], timeout=30) == (0, "")


def test_run_logs_the_command_then_its_output(tmp_path):
    log = tmp_path / "x.log"
    cmd = [PY, "-c", "print('hello world')"]
    assert toolkit.run(cmd, 30, str(log)) == (0, "hello world\n")
    assert log.read_text() == "$ %s -c 'print('\"'\"'hello world'\"'\"')'\nhello world\n" % PY
    toolkit.run(["true"], 30, str(log), header="# true")
    assert log.read_text() == "# true\n"


def test_run_kills_at_the_timeout(tmp_path):
    import subprocess
    import time
    log = tmp_path / "slow.log"
    start = time.time()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        toolkit.run([PY, "-c", "import sys, time; print('started'); sys.stdout.flush(); "
                     "time.sleep(30)"], 1, str(log))
    assert time.time() - start < 15
    assert toolkit.partial_output(e.value) == "started\n"
    assert log.read_text().endswith("\nstarted\n")   # the log keeps what it had printed
