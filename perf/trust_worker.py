#!/usr/bin/env python3
"""One rank of perf/bench_trust.py: one whole training run, plain DDP or DDP + fusebox.

    COMPUTE IS EMULATED DEVICE TIME (perf/devtime.py: the host sleeps);
    COMMUNICATION IS REAL (DDP's allreduce over gloo).

Started by the driver (inside a network namespace for a shaped link) with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT and GLOO_SOCKET_IFNAME set. It builds
DeviceTimeModel.from_profile(--profile, --compute-scale, --param-scale, seed 0)
(the same weights in every run), wraps it in
DistributedDataParallel(model, bucket_cap_mb=--cap), and with --mode fusebox
adds fusebox.torch.register(ddp, cache_dir=False, seed=--seed), as a user would
(no policy cache: every run tunes from scratch). Then it trains --steps steps
of SGD on make_batch(rank, step) after a barrier, so both ranks start together.
With --turns it runs them in turns of --turn-steps steps, each started by the
driver (Turns), so that a plain and a fusebox job share the machine's spells
alike; the waits between turns are inside handle.paused() and outside every
step's time.

Timing: time.perf_counter() at the start of every step (before zero_grad) and
at its end (after the loss is read). After the run (outside the timed span) the
ranks exchange their stamps; rank 0 prints ONE JSON line on stdout:

    {"mode", "cap_mb", "steps", "world_size",
     "step_ms": per step, the slowest rank's time (maximum over ranks),
     "total_s": the sum of step_ms,
     "rank_step_ms": [[...] per rank], "turn_steps": --turn-steps or null,
     "setup_s": DDP construction (+ register) on rank 0, outside the total,
     "losses": rank 0's loss at every step (fusebox changes when gradients are
               reduced, not what: plain and fusebox runs must agree),
     "model": DeviceTimeModel.profile_summary(),
     "fusebox": null for plain DDP, else the hook's snapshot fields: phase,
               decision, summary, tuning_iterations, tuning_cost_ms, seed,
               fallbacks, checks, chosen, chosen_name, plan, buckets,
               plan_installs, iterations, passthrough_iterations, cache_hit,
               measured; with --inject-regression also "injection":
               Injector.report()),
     "judge": null, or with --judge-blocks the judging blocks' figures
              (judge() below)}

Logs (fusebox's, torch's) go to stderr.
"""
import argparse
import contextlib
import gc
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from devtime import DeviceTimeModel  # noqa: E402
from toolkit import median  # noqa: E402  perf/toolkit.py: the drivers' one estimator
from trust_report import add_judge_arguments, check_judge_arguments  # noqa: E402  (pure)

SNAPSHOT_FIELDS = ("phase", "decision", "summary", "tuning_iterations", "tuning_cost_ms", "seed",
                   "fallbacks", "checks", "chosen", "plan_installs", "iterations",
                   "passthrough_iterations", "cache_hit", "measured")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("plain", "fusebox"), required=True)
    ap.add_argument("--cap", type=float, required=True, help="DDP's bucket_cap_mb (MiB)")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--profile", default="resnet50")
    ap.add_argument("--compute-scale", type=float, required=True)
    ap.add_argument("--param-scale", type=float, required=True)
    ap.add_argument("--seed", type=int, default=None,
                    help="fusebox's tuner seed (--mode fusebox; logged by the driver)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate")
    ap.add_argument("--inject-regression", type=float, default=0.0, metavar="F",
                    help="--mode fusebox: --inject-after steps after fusebox keeps a plan other "
                         "than the user's buckets, that plan's steps take (1 + F) times the "
                         "baseline's verified median (extra device time, slept before backward): "
                         "a regression of F against the user's DDP, for the checks to catch")
    ap.add_argument("--inject-after", type=int, default=50,
                    help="steps between the decision and the injection (default: %(default)s)")
    ap.add_argument("--judge-blocks", type=int, default=0, metavar="B",
                    help="--mode fusebox: after the timed run, B interleaved blocks that time "
                         "every plan the tuner measured alone (judge(); default: none)")
    add_judge_arguments(ap)
    ap.add_argument("--turns", metavar="PREFIX", default=None,
                    help="run in turns of --turn-steps steps handed out by the driver through "
                         "the FIFOs PREFIX-rank<r>.go and .done (Turns; default: no turns)")
    ap.add_argument("--turn-steps", type=int, default=10, metavar="K",
                    help="steps per turn with --turns (default: %(default)s)")
    args = ap.parse_args(argv)
    check_judge_arguments(ap, args)
    if args.turn_steps < 1:
        ap.error("need --turn-steps >= 1")
    if args.judge_blocks and args.mode != "fusebox":
        ap.error("--judge-blocks needs --mode fusebox")
    if args.steps < 1 or args.cap <= 0:
        ap.error("need --steps >= 1 and --cap > 0")
    if not 0 <= args.inject_regression < 1 or args.inject_after < 0:
        ap.error("need --inject-regression in [0, 1) and --inject-after >= 0")
    if args.inject_regression and args.mode != "fusebox":
        ap.error("--inject-regression needs --mode fusebox")
    if args.mode == "fusebox" and args.seed is None:
        ap.error("--mode fusebox needs --seed")
    return args


def shorten_plan(plan):
    return (plan["name"], len(plan["bucket_elements"])) if plan else (None, None)


class Injector:
    """--inject-regression: finds the step fusebox keeps a plan other than the
    user's buckets (the hook's summary line appears), then from --inject-after
    steps later makes every step of that plan (1 + F) x the baseline's
    verified median by sleeping the difference, and notes the step the hook
    falls back (its summary line goes: the kept plan is the baseline again)."""

    def __init__(self, handle, fraction, after):
        self.hook, self.handle = handle._hook, handle
        self.fraction, self.after = fraction, after
        self.decided_at = self.inject_at = self.fallback_at = None
        self.kept_hash, self.extra_s, self.injected_steps = None, 0.0, 0
        self.base_ms = self.kept_ms = None

    def before_backward(self, step):
        """Called after the forward (the step's plan is installed)."""
        if self.fallback_at is not None:
            return
        kept = bool(self.hook.summary_line())
        if self.decided_at is None:
            if kept:
                snap = self.handle.snapshot()
                measured, chosen = snap["measured"], snap["chosen"]
                self.decided_at, self.inject_at = step, step + self.after
                self.kept_hash = self.hook.plan_hash()
                self.base_ms = measured[0]["measured_ms"]
                self.kept_ms = measured[chosen]["measured_ms"]
                self.extra_s = max(0.0, (1 + self.fraction) * self.base_ms - self.kept_ms) / 1e3
            return
        if not kept:
            self.fallback_at = step
            return
        if step >= self.inject_at and self.hook.plan_hash() == self.kept_hash:
            self.injected_steps += 1
            time.sleep(self.extra_s)

    def report(self):
        return {"fraction": self.fraction, "after": self.after, "decided_at": self.decided_at,
                "inject_at": self.inject_at, "fallback_at": self.fallback_at,
                "extra_ms": self.extra_s * 1e3, "injected_steps": self.injected_steps,
                "baseline_ms": self.base_ms, "kept_ms": self.kept_ms}


def train_step(ddp, model, opt, rank, step, before_backward=None):
    opt.zero_grad(set_to_none=True)
    loss = model.loss(ddp(model.make_batch(rank, step)))
    if before_backward is not None:
        before_backward(step)
    loss.backward()  # DDP waits here for its buckets' allreduces
    opt.step()
    return loss.item()


def visit(handle, ddp, model, opt, rank, step, plan, hashes, names, steps):
    """Forces candidate `plan`, runs 2 unmeasured steps (the step that installs
    it ran the previous plan; its first step pays for its buffers) and `steps`
    timed ones; returns (the next step, this rank's step times in ms)."""
    handle._hook._force_plan("candidate:%d" % plan, checks=False)
    for _ in range(2):
        train_step(ddp, model, opt, rank, step)
        step += 1
    if handle._hook.plan_hash() != hashes[plan]:
        raise RuntimeError("judge: candidate %d (%s) was forced but plan %x runs"
                           % (plan, names[plan], handle._hook.plan_hash()))
    ms = []
    for _ in range(steps):
        t0 = time.perf_counter()
        train_step(ddp, model, opt, rank, step)
        ms.append((time.perf_counter() - t0) * 1e3)
        step += 1
    return step, ms


def slowest_rank(local_ms):
    """Per plan and step, the slowest rank's time (a collective: every rank
    gets the same lists)."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, local_ms)
    return [[max(col) for col in zip(*per_rank)] for per_rank in zip(*every)]


def judge(handle, ddp, model, opt, rank, first_step, blocks, final_blocks, steps, final_steps,
          seed):
    """Did the tuner keep the best plan? Judged apart from its own samples,
    and the best chosen apart from the samples that measure it.

    After the timed run, two stages; every plan runs alone (no check steps:
    _force_plan(..., checks=False)), each visit 2 unmeasured steps and
    `steps` timed ones (visit()):
      select   `blocks` blocks, each visiting every plan the tuner measured
               (its snapshot's "measured": your buckets first, then DDP's
               default and caps and the planner's plans) once, in a fresh
               random order (random.Random(seed), the same on every rank).
               The challenger is the plan other than the kept one with the
               lowest median step (the slowest rank's).
      measure  `final_blocks` blocks of the kept plan and the challenger
               alone, in ABBA order, `final_steps` timed steps a visit.
               kept / challenger over these steps only is the judged ratio:
               the minimum over many noisy medians is lower than the best
               plan's true time (the winner's curse), so the plan that wins
               the selection is measured again on steps that did not select
               it.
    Returns {"names", "hashes", "kept" (the index of the plan the tuner kept,
    snapshot["chosen"]), "order" (per selection block), "step_ms" (per plan:
    its selection steps), "challenger", "final_order", "final_ms" ([the kept
    plan's, the challenger's] measuring steps)}, or None if the tuner never
    decided. Step times are the slowest rank's.
    """
    import random
    snap = handle.snapshot()
    measured = snap.get("measured") or []
    # The tuner's kept plan (0 after a fallback), not the plan that ran last:
    # the last step may have been a check's control step, which runs yours.
    chosen = snap.get("chosen")
    if (snap.get("phase") != "tuned" or len(measured) < 2 or not isinstance(chosen, int)
            or not 0 <= chosen < len(measured)):
        return None
    kept = chosen
    hashes = [m["hash"] for m in measured]
    names = [m["name"] for m in measured]
    rng = random.Random(seed)
    local_ms = [[] for _ in measured]
    orders, step = [], first_step
    for _ in range(blocks):
        order = rng.sample(range(len(measured)), len(measured))
        orders.append(order)
        for c in order:
            step, ms = visit(handle, ddp, model, opt, rank, step, c, hashes, names, steps)
            local_ms[c] += ms
    step_ms = slowest_rank(local_ms)
    medians = [median(ms) if ms else float("inf") for ms in step_ms]
    challenger = min((c for c in range(len(measured)) if c != kept), key=medians.__getitem__)
    final_local, final_order = [[], []], []
    for b in range(final_blocks):
        pair = (0, 1) if b % 2 == 0 else (1, 0)  # ABBA: kept first in even blocks
        final_order.append(pair)
        for which in pair:
            plan = (kept, challenger)[which]
            step, ms = visit(handle, ddp, model, opt, rank, step, plan, hashes, names,
                             final_steps)
            final_local[which] += ms
    return {"names": names, "hashes": ["%016x" % h for h in hashes], "kept": kept,
            "blocks": blocks, "steps": steps, "seed": seed, "order": orders,
            "step_ms": step_ms, "challenger": challenger, "final_blocks": final_blocks,
            "final_steps": final_steps,
            "final_order": final_order, "final_ms": slowest_rank(final_local)}


class Turns:
    """--turns PREFIX: this job shares the machine with another, in turns
    handed out by the driver (perf/bench_trust.py), so that both see the same
    spells of a noisy machine. The driver's FIFOs PREFIX-rank<r>.go (a byte
    "g" per turn) and PREFIX-rank<r>.done (a line per event: "ready" once,
    then "done <steps so far>" after each turn)."""

    def __init__(self, prefix, rank):
        self.go = open("%s-rank%d.go" % (prefix, rank), "rb", buffering=0)
        self.out = open("%s-rank%d.done" % (prefix, rank), "w", buffering=1)
        self.out.write("ready\n")

    def wait(self):
        if self.go.read(1) != b"g":
            raise RuntimeError("turns: the driver closed %s" % self.go.name)

    def done(self, steps):
        self.out.write("done %d\n" % steps)


def main():
    args = parse_args()
    if args.mode == "fusebox":
        import fusebox.torch  # noqa: F401  (fail before joining the group)
    torch.set_num_threads(args.threads)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    model = DeviceTimeModel.from_profile(args.profile, compute_scale=args.compute_scale,
                                         param_scale=args.param_scale, seed=0)
    t_setup = time.perf_counter()
    ddp = DDP(model, bucket_cap_mb=args.cap)
    handle = None
    if args.mode == "fusebox":
        import fusebox.torch
        handle = fusebox.torch.register(ddp, cache_dir=False, seed=args.seed)
    setup_s = time.perf_counter() - t_setup
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    injector = (Injector(handle, args.inject_regression, args.inject_after)
                if args.inject_regression else None)

    turns = Turns(args.turns, rank) if args.turns else None
    paused = handle.paused if handle is not None else contextlib.nullcontext
    dist.barrier()
    starts, ends, losses = [], [], []
    for step in range(args.steps):
        if turns is not None and step % args.turn_steps == 0:
            if step:
                turns.done(step)
            with paused():  # not training: fusebox's step timing leaves it out
                turns.wait()
        starts.append(time.perf_counter())
        losses.append(train_step(ddp, model, opt, rank, step,
                                 injector.before_backward if injector is not None else None))
        ends.append(time.perf_counter())
    if turns is not None:
        turns.done(args.steps)
        turns.wait()  # one more go: what follows the run (the judge) runs alone
    judged = None
    if args.judge_blocks:  # outside the timed run
        judged = judge(handle, ddp, model, opt, rank, args.steps, args.judge_blocks,
                       args.judge_final_blocks, args.judge_steps, args.judge_final_steps,
                       args.seed + 1)

    # Outside the timed span: every rank's stamps to every rank.
    stamps = [None] * dist.get_world_size()
    dist.all_gather_object(stamps, {"starts": starts, "ends": ends})
    rank_step_ms = [[(b - a) * 1e3 for a, b in zip(s["starts"], s["ends"])] for s in stamps]
    step_ms = [max(col) for col in zip(*rank_step_ms)]
    fb = None
    if handle is not None:
        snap = handle.snapshot()
        fb = {k: snap.get(k) for k in SNAPSHOT_FIELDS}
        fb["plan"], fb["buckets"] = shorten_plan(snap.get("plan"))
        chosen, measured = snap.get("chosen"), snap.get("measured") or []
        fb["chosen_name"] = (measured[chosen]["name"]
                             if isinstance(chosen, int) and 0 <= chosen < len(measured) else None)
        if injector is not None:
            fb["injection"] = injector.report()
    if rank == 0:
        out = {
            "mode": args.mode, "cap_mb": args.cap, "steps": args.steps,
            "world_size": dist.get_world_size(),
            "step_ms": step_ms, "total_s": sum(step_ms) / 1e3,
            "rank_step_ms": rank_step_ms, "turn_steps": args.turn_steps if turns else None,
            "setup_s": setup_s, "losses": losses,
            "model": model.profile_summary(), "fusebox": fb, "judge": judged,
            "torch": torch.__version__, "threads": args.threads,
        }
        print(json.dumps(out), flush=True)
    dist.barrier()
    # Free the model (and the hook's group and threads) while the process
    # group still exists, not at interpreter exit.
    del ddp, handle, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
