"""Ranks on network namespaces for the DDP benchmarks (perf/bench_ddp_hook.py,
perf/bench_trust.py, perf/bench_rollback.py, perf/bench_ddp_scaling.py): two namespaces joined
by a veth pair whose ends are shaped with tc tbf (needs root), each rank's environment and
command on them or on loopback, and the rank processes of one launch, kept track of so that
only they are killed when anything goes wrong."""
import os
import re
import signal
import socket
import subprocess
import time

PYTHON = "/usr/bin/python3"  # Debian's Python, which sees python3-torch
NS = ("fbbenchA", "fbbenchB")
DEV = ("fbvethA", "fbvethB")
ADDR = ("10.231.77.1", "10.231.77.2")
NS_PORT = 29731  # MASTER_PORT inside the namespaces (plus the round number)
RATE = re.compile(r"^[0-9]+(\.[0-9]+)?[kmg]?bit$")


# ----------------------------------------------------------- network setup

def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def namespaces_present():
    listed = sh("ip", "netns", "list", check=False).stdout.split()
    return [ns for ns in NS if ns in listed]


def teardown():
    """Deletes the namespaces (and with them the veth pair)."""
    for ns in NS:
        sh("ip", "netns", "del", ns, check=False)


def setup(rate):
    """Two namespaces joined by a veth pair, each end's egress shaped to `rate`."""
    for ns in NS:
        sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", DEV[0], "netns", NS[0], "type", "veth", "peer", "name", DEV[1],
       "netns", NS[1])
    for ns, dev, addr in zip(NS, DEV, ADDR):
        sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
           rate, "burst", "256kb", "latency", "50ms")
        # A training job's connections are never idle for long; a job that
        # waits for its turn (perf/bench_trust.py) must not restart slow.
        sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------- launches

def launch_env(build, link, world, ns_port):
    """The environment every rank of one launch shares: torchrun's variables
    for `world` ranks, fusebox.torch from `build`, one thread; on a shaped
    link one "host" per namespace, rank 0's on `ns_port`."""
    env = dict(os.environ, WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(os.path.abspath(build), "python"))
    if link == "loopback":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   GLOO_SOCKET_IFNAME="lo", LOCAL_WORLD_SIZE=str(world))
    else:
        env.update(MASTER_ADDR=ADDR[0], MASTER_PORT=str(ns_port),
                   LOCAL_WORLD_SIZE="1", LOCAL_RANK="0")
    return env


def place_rank(env, cmd, link, rank):
    """One rank's environment and command: its RANK, and on a shaped link its
    namespace and interface."""
    rank_env = dict(env, RANK=str(rank))
    if link == "loopback":
        rank_env["LOCAL_RANK"] = str(rank)
        return rank_env, cmd
    rank_env["GLOO_SOCKET_IFNAME"] = DEV[rank]
    return rank_env, ["ip", "netns", "exec", NS[rank]] + cmd


def log_tails(logs, lines=15):
    parts = []
    for log in logs:
        with open(log, errors="replace") as f:
            parts.append("--- %s (last %d lines)\n%s" % (
                log, lines, "".join(f.readlines()[-lines:])))
    return "\n".join(parts)


class RankProcesses:
    """The ranks of one launch at a time, kept track of so that only they are
    killed when anything goes wrong (each in a session of its own)."""

    def __init__(self, timeout_s, poll_s):
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.procs = []

    def start(self, cmd, env, stdout, stderr):
        self.procs.append(subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr,
                                           start_new_session=True))

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs = []

    def check(self, what, logs, deadline):
        """Fails at once, with the tails of `logs`, when a rank has failed or
        the time.monotonic() `deadline` has passed."""
        failed = [(r, c) for r, c in enumerate(p.poll() for p in self.procs) if c not in (None, 0)]
        if failed or time.monotonic() > deadline:
            why = ("rank %d exited with %d" % failed[0] if failed
                   else "timed out after %d s" % self.timeout_s)
            raise RuntimeError("%s: %s\n%s" % (what, why, log_tails(logs)))

    def wait(self, what, logs):
        """Waits for every rank; fails at once when one fails or the launch
        takes longer than the timeout, with the tails of `logs`."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            self.check(what, logs, deadline)
            if all(p.poll() == 0 for p in self.procs):
                return
            time.sleep(self.poll_s)
