"""Small helpers shared by the benchmark drivers in perf/ (one copy of each).

- median(values): the sample median (None for no values).
- median_ci(values, level): the distribution-free order-statistic interval of the median.
- parse_size(text): "64M"-style byte counts, for argparse's type=.
- run(cmd, timeout, log_path): a command with stdout and stderr merged, within a timeout.

The drivers import it as a sibling (`import toolkit`): perf/ is on sys.path when they run.
"""

import argparse
import math
import shlex
import subprocess


def median(values):
    """The median of `values` (the mean of the middle two for an even count); None when empty."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return None
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def median_ci(values, level=0.95):
    """A distribution-free confidence interval for the median of `values`:
    [x_(k), x_(n+1-k)] for the largest k whose coverage is at least `level`
    (with too few values for that: [min, max]). Returns (low, high, coverage);
    (nan, nan, nan) for no values."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan

    below = [0]  # below[k]: sum of C(n, i) over i < k, exact (integers: no overflow for large n)
    for i in range((n + 1) // 2):
        below.append(below[-1] + math.comb(n, i))

    def coverage(k):  # P(x_(k) <= median <= x_(n+1-k)) = 1 - 2 P(Binomial(n, 1/2) < k)
        return 1 - 2 * below[k] / 2 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """Bytes from "8", "1.5K", "64M", "1G", "64MB", "64mb" (binary units; a B after the unit is
    optional). Raises argparse.ArgumentTypeError naming the text when it is not a size or is
    negative."""
    t = str(text).strip()
    if len(t) > 1 and t[-1] in "bB" and t[-2].isalpha():
        t = t[:-1]
    mult = 1
    if t and t[-1].upper() in SIZE_UNITS:
        mult = SIZE_UNITS[t[-1].upper()]
        t = t[:-1]
    try:
        v = float(t)
    except ValueError:
        v = math.nan
    if not math.isfinite(v):  # not a number; "inf" and "nan" too
        raise argparse.ArgumentTypeError("bad size: %r" % text)
    if v < 0:
        raise argparse.ArgumentTypeError("negative size: %r" % text)
    return int(v * mult)


def run(cmd, timeout, log_path=None, header=None):
    """Runs `cmd` (a list) with stdout and stderr merged into one text, for at most `timeout`
    seconds; returns (returncode, output). With `log_path`, that file gets `header` (default
    "$ " and the quoted command) on its first line, before the command starts, and then the
    output. Past the timeout the command is killed and subprocess.TimeoutExpired raised (its
    .stdout: the bytes read so far, which the log gets too)."""
    log = open(log_path, "w") if log_path else None
    try:
        if log:
            log.write((header if header is not None else "$ " + shlex.join(cmd)) + "\n")
            log.flush()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            if log:
                log.write(partial_output(e))
            raise
        if log:
            log.write(proc.stdout)
    finally:
        if log:
            log.close()
    return proc.returncode, proc.stdout


def partial_output(expired):
    """The text a command had printed when subprocess.TimeoutExpired `expired` stopped it."""
    out = expired.stdout
    return out if isinstance(out, str) else (out or b"").decode(errors="replace")
