#!/usr/bin/env python3
"""What a progress thread's wake-up costs, from a scheduler trace: for every wake-up of a thread
named THREAD (default fb-progress), the time from its sched_waking to the sched_switch that puts
it on a CPU, who woke it, whether waker and wakee share a CPU, and how the thread it replaced
left the CPU (R: preempted while runnable; S or D: it blocked).

A collective issued to an idle communicator starts when its progress thread runs, so these are
the launches' hand-offs (Note [Progress without sleeping] in comm/async_core.h). Launches that
find the thread already running or runnable do not wake it and are not counted.

usage: zcat sched.txt.gz | wakeups.py [--thread fb-progress]
"""
import argparse
import collections
import re
import sys

from delays import SWITCH  # the same sched_switch lines, in this folder

# Unlike delays.py's WAKEUP, also who woke the thread and on which CPU.
WAKING = re.compile(
    r"^\s*(.*?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:sched_waking:\s+comm=(.*?) pid=(\d+) "
    r"prio=\d+\s+target_cpu=(\d+)")


def quantile(xs, q):
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--thread", default="fb-progress")
    a = ap.parse_args()

    pending = {}  # pid -> (t, waker comm, waker cpu, target cpu)
    rows = []  # (us, same cpu, waker, how the replaced thread left, its comm)
    for line in sys.stdin:
        m = WAKING.search(line)
        if m:
            if m.group(5) == a.thread:
                pending[int(m.group(6))] = (float(m.group(4)), m.group(1), int(m.group(3)),
                                            int(m.group(7)))
            continue
        m = SWITCH.search(line)
        if not m or m.group(6) != a.thread:
            continue
        pid = int(m.group(7))
        if pid not in pending:
            continue
        t, waker, wcpu, tcpu = pending.pop(pid)
        left = "preempted (R)" if m.group(5).startswith("R") else "blocked (%s)" % m.group(5)
        rows.append(((float(m.group(2)) - t) * 1e6, wcpu == tcpu, waker, left, m.group(3)))

    if not rows:
        print("no wake-ups of %s in the trace" % a.thread)
        return
    us = sorted(r[0] for r in rows)
    print("wake-ups of %s: %d" % (a.thread, len(rows)))
    print("sched_waking to on a CPU, us: p10 %.0f, median %.0f, p90 %.0f, p99 %.0f, max %.0f"
          % (quantile(us, 0.1), quantile(us, 0.5), quantile(us, 0.9), quantile(us, 0.99), us[-1]))
    print("(perf script prints microseconds: each figure is +-1 us)")
    print()
    print("| woken by | waker on the same CPU | the thread it replaced | left the CPU | n "
          "| median us |")
    print("| --- | --- | --- | --- | ---: | ---: |")
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r[2], "yes" if r[1] else "no", r[4], r[3])].append(r[0])
    for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        v.sort()
        print("| %s | %s | %s | %s | %d | %.0f |" % (k + (len(v), quantile(v, 0.5))))


if __name__ == "__main__":
    main()
