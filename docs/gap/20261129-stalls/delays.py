#!/usr/bin/env python3
"""How long the progress threads wait for a CPU while runnable, and who holds it meanwhile.

Reads `perf script` output of a `perf sched record` (sched_switch, and sched_waking or
sched_wakeup) and, for every thread named THREAD (default fb-progress, the communicators'
progress threads), measures each interval in which it was runnable but not running:

  preempted  switched out while still runnable (prev_state R: preempted, or yielded with
             sched_yield, which the trace cannot tell apart), until it runs again;
  woken      from its wake-up (sched_waking) until it runs.

It prints how many such intervals fall in each range of lengths, and for the intervals of at least
--long ms, which threads ran on that CPU during them (by name, total milliseconds).

usage: perf script -i perf.data | delays.py [--thread fb-progress] [--long 1]
"""
import argparse
import collections
import re
import sys

SWITCH = re.compile(
    r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch:\s+prev_comm=(.*?) prev_pid=(\d+) "
    r"prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)")
WAKEUP = re.compile(
    r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_wak(?:eup|eup_new|ing):\s+comm=(.*?) pid=(\d+) prio=\d+"
    r"(?: success=\d+)? target_cpu=(\d+)")
RANGES_MS = [0.05, 0.1, 0.5, 1, 2, 5, 1e9]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--thread", default="fb-progress")
    ap.add_argument("--long", type=float, default=1.0, help="ms; who ran during longer waits")
    a = ap.parse_args()

    tracked = {}  # pid -> comm, for threads named a.thread
    waiting = {}  # pid -> (kind, since, cpu or None)
    running = {}  # cpu -> (pid, comm, since)
    ran = collections.defaultdict(list)  # cpu -> [(start, end, comm, pid)]
    delays = []  # (kind, ms, pid, cpu, start, end)
    runtime = collections.Counter()  # pid -> seconds on a CPU, for threads named a.thread
    first = last = None
    for line in sys.stdin:
        m = SWITCH.search(line)
        if m:
            cpu, t = int(m.group(1)), float(m.group(2))
            prev_comm, prev_pid, state = m.group(3), int(m.group(4)), m.group(5)
            next_comm, next_pid = m.group(6), int(m.group(7))
            first = t if first is None else first
            last = t
            if cpu in running:
                pid, comm, since = running[cpu]
                ran[cpu].append((since, t, comm, pid))
                if comm == a.thread:
                    runtime[pid] += t - since
            running[cpu] = (next_pid, next_comm, t)
            if prev_comm == a.thread:
                tracked[prev_pid] = prev_comm
                if state.startswith("R"):
                    waiting[prev_pid] = ("preempted", t, cpu)
                else:
                    waiting.pop(prev_pid, None)
            if next_comm == a.thread:
                tracked[next_pid] = next_comm
                w = waiting.pop(next_pid, None)
                if w is not None:
                    delays.append((w[0], 1e3 * (t - w[1]), next_pid, cpu, w[1], t))
            continue
        m = WAKEUP.search(line)
        if m:
            t, comm, pid = float(m.group(2)), m.group(3), int(m.group(4))
            if comm == a.thread and pid not in waiting:
                waiting[pid] = ("woken", t, int(m.group(5)))

    print("threads named %s: %d (pids %s)" % (a.thread, len(tracked),
                                              ", ".join(str(p) for p in sorted(tracked))))
    if runtime:
        print("their time on a CPU: %.1f ms in all, over a trace of %.2f s" % (
            1e3 * sum(runtime.values()), last - first))
    print()
    print("| kind | " + " | ".join(
        "%s-%s ms" % (lo, hi if hi < 1e9 else "") for lo, hi in zip(RANGES_MS, RANGES_MS[1:])) +
          " | longest ms |")
    print("| --- " * (len(RANGES_MS) + 1) + "|")
    for kind in ("preempted", "woken"):
        ms = [d[1] for d in delays if d[0] == kind]
        counts = [sum(1 for x in ms if lo <= x < hi) for lo, hi in zip(RANGES_MS, RANGES_MS[1:])]
        print("| %s | %s | %.2f |" % (kind, " | ".join(str(c) for c in counts),
                                      max(ms) if ms else 0))
    print()
    print("all waits: %d, %.1f ms in all (preempted %.1f, woken %.1f)" % (
        len(delays), sum(d[1] for d in delays),
        sum(d[1] for d in delays if d[0] == "preempted"),
        sum(d[1] for d in delays if d[0] == "woken")))
    long = [d for d in delays if d[1] >= a.long]
    print()
    print("waits of at least %g ms: %d, %.1f ms in all" % (a.long, len(long),
                                                          sum(d[1] for d in long)))
    who = collections.Counter()
    for kind, ms, pid, cpu, start, end in long:
        for s, e, comm, p in ran[cpu]:
            overlap = min(e, end) - max(s, start)
            if overlap > 0:
                who["%s (%s)" % (comm, "itself" if p == pid else "other")] += 1e3 * overlap
    print()
    print("| ran on that CPU meanwhile | ms |")
    print("| --- | ---: |")
    for name, v in who.most_common(12):
        print("| %s | %.1f |" % (name, v))


if __name__ == "__main__":
    main()
