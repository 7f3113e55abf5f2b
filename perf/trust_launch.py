"""The launches of perf/bench_trust.py (and perf/bench_rollback.py): the 2 ranks of a job in
the namespaces of perf/netns.py, alone or, for a whole-run comparison, a plain and a fusebox job
started together that take turns (TurnTaker; the workers' side is Turns in
perf/trust_worker.py)."""
import json
import os
import select
import shlex
import time

import netns  # perf/netns.py: namespaces, shaping, ports, rank processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "perf", "trust_worker.py")


class Launcher(netns.RankProcesses):
    """Starts the 2 ranks of each launch (bench_ddp_hook.RankProcesses)."""

    def __init__(self, args, outdir):
        super().__init__(args.timeout, 0.2)
        self.args = args
        self.outdir = outdir
        self.count = 0

    def command(self, mode, cap, seed, extra=()):
        args = self.args
        cmd = [args.python, WORKER, "--mode", mode, "--cap", "%g" % cap,
               "--steps", str(args.steps), "--profile", args.profile,
               "--compute-scale", repr(args.compute_scale),
               "--param-scale", repr(args.param_scale)]
        if mode == "fusebox":
            cmd += ["--seed", str(seed)]
            if getattr(args, "judge_blocks", 0):  # bench_rollback's launches judge nothing
                cmd += ["--judge-blocks", str(args.judge_blocks),
                        "--judge-final-blocks", str(args.judge_final_blocks),
                        "--judge-steps", str(args.judge_steps),
                        "--judge-final-steps", str(args.judge_final_steps)]
        return cmd + list(extra)

    def start_job(self, tag, mode, cmd):
        """Starts the 2 ranks of one job; returns (rank 0's stdout path, the
        log paths, the processes)."""
        self.count += 1
        first = len(self.procs)
        # A fresh port per job on a shaped link (no TIME_WAIT clash).
        env = netns.launch_env(self.args.build, self.args.link, 2,
                               netns.NS_PORT + self.count % 1000)
        env.pop("FUSEBOX_DISABLE", None)
        outs, logs = [], []
        for rank in range(2):
            rank_env, rank_cmd = netns.place_rank(env, cmd, self.args.link, rank)
            base = os.path.join(self.outdir, "logs", "%s-%s-rank%d" % (tag, mode, rank))
            outs.append(base + ".out")
            logs.append(base + ".log")
            with open(outs[-1], "w") as out, open(logs[-1], "w") as err:
                err.write("# %s\n" % shlex.join(rank_cmd))
                err.flush()
                self.start(rank_cmd, rank_env, out, err)
        return outs[0], logs, self.procs[first:]

    @staticmethod
    def result(tag, mode, out, logs):
        with open(out) as f:
            lines = [line for line in f if line.startswith("{")]
        if not lines:
            raise RuntimeError("%s %s: rank 0 printed no JSON line\n%s"
                               % (tag, mode, netns.log_tails(logs + [out])))
        return json.loads(lines[-1])

    def run(self, tag, mode, cap, seed, extra=()):
        """One launch alone (`extra`: more worker arguments); returns rank 0's
        JSON line, parsed."""
        try:
            out, logs, _ = self.start_job(tag, mode, self.command(mode, cap, seed, extra))
            self.wait("%s %s" % (tag, mode), logs)
        finally:
            self.kill()
        return self.result(tag, mode, out, logs)

    def run_in_turns(self, tag, cap, seed, order):
        """A plain and a fusebox job started together, then run in turns of
        --turn-steps steps (TurnTaker), in ABBA order starting with order[0];
        returns ({mode: rank 0's JSON line, parsed}, the turns given)."""
        turns = TurnTaker(os.path.join(self.outdir, "ctl", tag), order)
        jobs = {}
        try:
            for mode in order:
                cmd = self.command(mode, cap, seed, ["--turns", turns.prefix(mode),
                                                     "--turn-steps", str(self.args.turn_steps)])
                jobs[mode] = self.start_job(tag, mode, cmd)
            every_log = [log for job in jobs.values() for log in job[1]]
            deadline = time.monotonic() + self.timeout_s
            check = lambda: self.check(tag, every_log, deadline)  # noqa: E731
            turns.await_all(list(order), "ready", check)
            blocks = -(-self.args.steps // self.args.turn_steps)
            for b in range(blocks):
                for mode in (order if b % 2 == 0 else order[::-1]):
                    turns.give(mode, check)
            # What follows the runs (the judge) runs alone: plain ends first.
            for mode in ("plain", "fusebox"):
                turns.release(mode)
                while any(p.poll() is None for p in jobs[mode][2]):
                    check()
                    time.sleep(0.05)
                check()
        finally:
            self.kill()
            turns.close()
        return ({mode: self.result(tag, mode, *jobs[mode][:2]) for mode in order},
                turns.given)


class TurnTaker:
    """The driver's side of the workers' Turns (perf/trust_worker.py): per job
    and rank a FIFO of go bytes and a FIFO of lines back. Both are opened
    read-write here before the ranks start, so that neither side's open
    blocks."""

    def __init__(self, prefix, modes):
        self.base = prefix
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        self.go, self.back, self.pending, self.given = {}, {}, {}, []
        for mode in modes:
            for rank in range(2):
                key = (mode, rank)
                for end in ("go", "done"):
                    path = self.path(mode, rank, end)
                    if os.path.exists(path):
                        os.unlink(path)
                    os.mkfifo(path)
                self.go[key] = os.open(self.path(mode, rank, "go"), os.O_RDWR)
                self.back[key] = os.open(self.path(mode, rank, "done"), os.O_RDWR | os.O_NONBLOCK)
                self.pending[key] = b""

    def prefix(self, mode):
        """What a job's workers are given as --turns."""
        return "%s-%s" % (self.base, mode)

    def path(self, mode, rank, end):
        """The FIFO `end` ("go" or "done") of one rank (Turns opens the same)."""
        return "%s-rank%d.%s" % (self.prefix(mode), rank, end)

    def await_all(self, modes, word, check):
        """Waits until every rank of `modes` has said a line starting with `word`."""
        waiting = {(m, r) for m in modes for r in range(2)}
        while waiting:
            check()
            ready, _, _ = select.select([self.back[k] for k in waiting], [], [], 0.2)
            for key in list(waiting):
                if self.back[key] not in ready:
                    continue
                self.pending[key] += os.read(self.back[key], 4096)
                while b"\n" in self.pending[key]:
                    line, self.pending[key] = self.pending[key].split(b"\n", 1)
                    if line.decode().startswith(word):
                        waiting.discard(key)

    def give(self, mode, check):
        """One turn: both ranks of `mode` go, and this returns when both are done."""
        self.release(mode)
        self.given.append(mode)
        self.await_all([mode], "done", check)

    def release(self, mode):
        for rank in range(2):
            os.write(self.go[(mode, rank)], b"g")

    def close(self):
        for fd in list(self.go.values()) + list(self.back.values()):
            os.close(fd)
        for mode, rank in self.go:
            for end in ("go", "done"):
                path = self.path(mode, rank, end)
                if os.path.exists(path):
                    os.unlink(path)
