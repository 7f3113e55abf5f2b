"""Every benchmark driver in perf/ starts and prints its help: the drivers share modules
(perf/toolkit.py, perf/netns.py, the *_report.py and allreduce_*.py modules), and a name one of
them imports from another must exist there. --help exits before anything runs (no root, no
build, no torch needed beyond what a driver imports at the top)."""
import glob
import os
import subprocess
import sys

import pytest

PERF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf")
DRIVERS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(PERF, "*.py"))
                 if "if __name__ == \"__main__\":" in open(p).read())


def test_the_drivers_are_found():
    for name in ("bench_allreduce.py", "bench_ddp_hook.py", "bench_autotune.py",
                 "bench_trust.py", "bench_ddp_scaling.py", "devtime.py"):
        assert name in DRIVERS


@pytest.mark.parametrize("driver", DRIVERS)
def test_driver_prints_its_help(driver):
    p = subprocess.run([sys.executable, os.path.join(PERF, driver), "--help"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "usage:" in p.stdout.lower(), p.stdout + p.stderr
