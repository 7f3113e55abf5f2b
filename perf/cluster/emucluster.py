#!/usr/bin/env python3
"""An emulated cluster on one machine: N network namespaces ("hosts") on a
bridge, each host's link shaped with tc tbf, R ranks per host started by
fusebox-run (one launcher per host, TCP rendezvous on host 0).

    emucluster.py run --hosts 4 --ranks_per_host 1 --rate 1gbit -- \\
        build/perf/fusebox-perf allreduce -b 1M -e 64M -f 4
    emucluster.py mpirun --hosts 4 --rate 1gbit -- \\
        build/perf/baselines/fusebox-mpi-allreduce -b 1M -e 64M -f 4
    emucluster.py cleanup            # after a run that was SIGKILLed

Topology: namespace <prefix>sw holds the bridge <prefix>br; host i is
namespace <prefix>h<i> with interface "fbeth" at 10.231.<subnet>.<i+1>/24,
joined to the bridge by a veth pair. Both ends of every host's veth are
shaped with tbf at --rate, so each host sends and receives at that rate
(a NIC's full duplex). netem is absent from this kernel: there is no added
latency (inject it in user space if an experiment needs it).

Ranks get UCX_TLS=tcp and UCX_NET_DEVICES=fbeth (namespaces do not isolate
shared memory: without this, UCX would bypass the shaped links) and
GLOO_SOCKET_IFNAME=fbeth. Output lines carry the global rank ("[r]: ").

`mpirun` starts an MPI program the same way, on the same kind of hosts,
with OpenMPI's own launcher instead of fusebox-run: mpirun runs in host 0's
namespace and starts one orted per host through an rsh agent (written by
this script to a temporary directory) that enters the host's namespace
instead of logging in; each host gets its own hostname (a UTS namespace),
as a real host has. Hosts are named by address; the TCP byte-transfer
layer and OpenMPI's out-of-band channel are restricted to fbeth (btl
self,vader,tcp: vader only joins ranks of the same host), and no rank is
bound (OpenMPI would bind every host's rank 0 to the same core). Arguments
after "--" are mpirun's options, then the program and its arguments:

    emucluster.py mpirun --hosts 2 -- --mca coll_tuned_use_dynamic_rules 1 \\
        --mca coll_tuned_allreduce_algorithm 4 ./prog -b 8 -e 1M

Everything it creates is removed on exit, on failure and on SIGINT/SIGTERM/
SIGHUP; it kills only the processes it started (every process inside its
namespaces). If the script itself is SIGKILLed, its launchers die with it
(PR_SET_PDEATHSIG) and so do fusebox-run's ranks; mpirun's orteds and
ranks, and the namespaces, stay until `cleanup` (which kills whatever runs
inside the namespaces) or the next run with the same prefix. Needs root
(ip netns, tc).

Exit status: a failing host's launcher status (its first failing rank's;
the lowest-numbered host when several are found failed at once), 124 on
--timeout, 128+SIG on a signal, 1 on a set-up error.
"""
import argparse
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IFACE = "fbeth"
# What every rank is given, under either launcher: namespaces do not isolate
# shared memory, so UCX must be kept to TCP on the shaped interface.
RANK_ENV = ("UCX_TLS=tcp", "UCX_NET_DEVICES=" + IFACE, "GLOO_SOCKET_IFNAME=" + IFACE)
PR_SET_PDEATHSIG = 1


class SetupError(Exception):
    pass


def sh(*cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise SetupError("%s: %s" % (" ".join(cmd), (p.stderr or p.stdout).strip()))
    return p


def namespaces(prefix):
    """This prefix's namespaces exactly (<prefix>sw, <prefix>h<i>): never
    another run's whose prefix merely starts the same way."""
    ours = re.compile(re.escape(prefix) + r"(sw|h\d+)")
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.split() and ours.fullmatch(line.split()[0])]


def cleanup(prefix):
    """Kills every process inside this prefix's namespaces (all of them were
    started by this script) and deletes the namespaces (and so their veths)."""
    for ns in namespaces(prefix):
        for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for ns in namespaces(prefix):
        sh("ip", "netns", "del", ns, check=False)
    left = namespaces(prefix)
    if left:
        raise SetupError("could not delete namespaces %s" % ", ".join(left))


def host_ns(prefix, i):
    return "%sh%d" % (prefix, i)


def address(subnet, i):
    return "10.231.%d.%d" % (subnet, i + 1)


def setup(args):
    cleanup(args.prefix)  # a previous SIGKILLed run's leftovers
    sw = args.prefix + "sw"
    br = args.prefix + "br"
    sh("ip", "netns", "add", sw)
    sh("ip", "-n", sw, "link", "add", br, "type", "bridge")
    sh("ip", "-n", sw, "link", "set", br, "up")
    for i in range(args.hosts):
        ns = host_ns(args.prefix, i)
        port = "%sp%d" % (args.prefix, i)
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", IFACE, "netns", ns, "type", "veth", "peer", "name", port,
           "netns", sw)
        sh("ip", "-n", sw, "link", "set", port, "master", br)
        sh("ip", "-n", sw, "link", "set", port, "up")
        sh("ip", "-n", ns, "addr", "add", address(args.subnet, i) + "/24", "dev", IFACE)
        sh("ip", "-n", ns, "link", "set", IFACE, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        if args.rate != "none":
            for where, dev in ((ns, IFACE), (sw, port)):
                sh("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                   "rate", args.rate, "burst", args.burst, "latency", "100ms")


def die_with_parent(parent):
    def hook():
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            os._exit(126)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(126)
    return hook


def launch(args, launchers):
    """Starts one fusebox-run per host, appending each to `launchers` as it
    starts (so that a failure part way stops those already running)."""
    master = address(args.subnet, 0)
    for i in range(args.hosts):
        cmd = ["ip", "netns", "exec", host_ns(args.prefix, i), args.fusebox_run,
               "-n", str(args.ranks_per_host), "--nnodes", str(args.hosts), "--node-rank", str(i),
               "--master-addr", master, "--master-port", str(args.port), "--bind", "none"]
        for e in RANK_ENV + ("FUSEBOX_EMULATED_HOST=%d" % i,) + tuple(args.env):
            cmd += ["--env", e]
        cmd += ["--"] + args.command
        # A session of its own: a terminal's ^C reaches only this script,
        # which stops the launchers with one SIGTERM (then --grace applies).
        launchers.append(subprocess.Popen(cmd, preexec_fn=die_with_parent(os.getpid()),
                                          start_new_session=True))


AGENT = """#!/bin/sh
# OpenMPI rsh agent written by emucluster.py: "$0 HOST COMMAND..." runs COMMAND
# (a shell line, as ssh would) inside the namespace of the host whose address
# is HOST, with that host's own hostname.
host=$1
shift
case $host in
%s
  *) echo "emucluster agent: unknown host '$host'" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns && $*"
"""


def launch_mpirun(args, launchers, tmpdir):
    """Starts mpirun in host 0's namespace with one slot set per host and the
    agent that enters the others'."""
    cases = "\n".join("  %s) ns=%s ;;" % (address(args.subnet, i), host_ns(args.prefix, i))
                      for i in range(args.hosts))
    agent = os.path.join(tmpdir, "agent")
    with open(agent, "w") as f:
        f.write(AGENT % cases)
    os.chmod(agent, 0o755)
    hosts = ",".join("%s:%d" % (address(args.subnet, i), args.ranks_per_host)
                     for i in range(args.hosts))
    ns0 = host_ns(args.prefix, 0)
    mpirun = [args.mpirun, "--allow-run-as-root", "-n", str(args.hosts * args.ranks_per_host),
              "--host", hosts, "--bind-to", "none", "--tag-output",
              "--mca", "plm_rsh_agent", agent,
              "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", IFACE,
              "--mca", "oob_tcp_if_include", IFACE]
    for e in RANK_ENV + tuple(args.env):
        mpirun += ["-x", e]
    cmd = ["ip", "netns", "exec", ns0, "unshare", "--uts", "sh", "-c",
           'hostname "$0" && exec "$@"', ns0] + mpirun + args.command
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    launchers.append(subprocess.Popen(cmd, preexec_fn=die_with_parent(os.getpid()),
                                      start_new_session=True, env=env))


def stop(launchers, grace):
    for p in launchers:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)  # fusebox-run forwards it to its ranks
    end = time.monotonic() + grace
    while time.monotonic() < end and any(p.poll() is None for p in launchers):
        time.sleep(0.05)
    for p in launchers:
        if p.poll() is None:
            p.kill()
            p.wait()


def run(args):
    if not args.command:
        raise SetupError("no command given (emucluster.py %s [options] -- COMMAND ...)"
                         % args.what)
    if args.what == "run" and not os.access(args.fusebox_run, os.X_OK):
        raise SetupError("%s is not executable (build first: bash scripts/build.sh)"
                         % args.fusebox_run)
    if args.what == "mpirun" and shutil.which(args.mpirun) is None:
        raise SetupError("no %s (OpenMPI: bash scripts/install-deps.sh)" % args.mpirun)
    got = []

    def on_signal(sig, _frame):
        got.append(sig)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    launchers = []
    tmpdir = tempfile.mkdtemp(prefix="fusebox-emucluster-") if args.what == "mpirun" else None
    try:
        setup(args)
        if args.what == "mpirun":
            launch_mpirun(args, launchers, tmpdir)
        else:
            launch(args, launchers)
        deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
        code = 0
        while True:
            if got:
                code = 128 + got[0]
                print("emucluster: got signal %d; stopping every host" % got[0], file=sys.stderr)
                break
            if deadline is not None and time.monotonic() > deadline:
                code = 124
                print("emucluster: --timeout %gs expired; stopping every host" % args.timeout,
                      file=sys.stderr)
                break
            failed = [(i, p.returncode) for i, p in enumerate(launchers)
                      if p.poll() is not None and p.returncode != 0]
            if failed:  # (the lowest-numbered host among those found failed in this poll)
                i, code = failed[0]
                if code < 0:
                    code = 128 - code
                print("emucluster: host %d failed (exit %d); stopping the others" % (i, code),
                      file=sys.stderr)
                break
            if all(p.poll() is not None for p in launchers):
                break
            time.sleep(0.05)
        stop(launchers, args.grace)
        return code
    finally:
        stop(launchers, 0)
        try:
            cleanup(args.prefix)
        except SetupError as e:  # report it; keep the run's own exit status
            print("emucluster: cleanup: %s" % e, file=sys.stderr)
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="set up, run COMMAND on every rank, tear down")
    m = sub.add_parser("mpirun", help="set up, run an MPI program under OpenMPI's mpirun "
                                      "(one orted per host), tear down")
    for q in (r, m):
        q.add_argument("--hosts", type=int, default=2, help="emulated hosts, 1..64 (default 2)")
        q.add_argument("--ranks_per_host", type=int, default=1,
                       help="ranks per host (default 1)")
        q.add_argument("--rate", default="1gbit",
                       help="tc tbf rate of each host's link, both directions (e.g. 1gbit, "
                            "500mbit), or none (default 1gbit)")
        q.add_argument("--burst", default="256kb", help="tbf burst (default 256kb)")
        q.add_argument("--prefix", default="fbc", help="name prefix of namespaces and links")
        q.add_argument("--subnet", type=int, default=90, help="hosts get 10.231.SUBNET.1..N")
        q.add_argument("--timeout", type=float, default=0, help="seconds; 0 = no limit")
        q.add_argument("--grace", type=float, default=5, help="SIGTERM-to-SIGKILL seconds")
        q.add_argument("--env", action="append", default=[], help="NAME=VALUE for every rank")
    r.add_argument("--port", type=int, default=29650, help="rendezvous store port on host 0")
    r.add_argument("--fusebox_run", default=os.path.join(REPO, "build", "tools", "fusebox-run"))
    r.add_argument("command", nargs=argparse.REMAINDER)
    m.add_argument("--mpirun", default="mpirun", help="OpenMPI's mpirun (default: from PATH)")
    m.add_argument("command", nargs=argparse.REMAINDER,
                   help="mpirun options, then the program and its arguments")
    c = sub.add_parser("cleanup", help="remove what a killed run left behind")
    c.add_argument("--prefix", default="fbc")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("emucluster: needs root (ip netns, tc)")
    if not args.prefix.isalnum() or len(args.prefix) > 6:
        sys.exit("emucluster: --prefix must be 1-6 letters or digits (interface names are short)")
    try:
        if args.what == "cleanup":
            cleanup(args.prefix)
            return 0
        if not 1 <= args.hosts <= 64:
            sys.exit("emucluster: --hosts must be in 1..64")
        if not 1 <= args.ranks_per_host <= 64:
            sys.exit("emucluster: --ranks_per_host must be in 1..64")
        if not 0 <= args.subnet <= 255:
            sys.exit("emucluster: --subnet must be in 0..255")
        if args.command and args.command[0] == "--":
            args.command = args.command[1:]
        return run(args)
    except SetupError as e:
        print("emucluster: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
