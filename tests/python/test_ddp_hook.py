"""The fusebox DDP hook in real multi-process DDP (gloo, CPU): parameters
after training equal plain DDP's (bit for bit on 2 ranks, 1e-6 relative on
3), in tuning and cached mode, with tiny and default buckets, gradients as
bucket views or not, unused parameters, gradient accumulation under
no_sync(); the tuned plan is what the process
group actually carries; bad use fails clearly on every rank, never hangs.

Each launch starts WORLD processes of ddp_worker.py; its scenarios run one
after another on the same process group.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

from ports import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.environ.get("FUSEBOX_PYTHON_DIR")
LAUNCH_TIMEOUT_S = 300
# Longer than the workers' own collective timeout (ddp_worker.py registers
# with timeout_s=60): a rank that learns of a peer's failure only by timing
# out must get to report it.
ORPHAN_GRACE_S = 120

pytestmark = pytest.mark.skipif(not PYDIR, reason="FUSEBOX_PYTHON_DIR not set (module not built)")



def read_log(out, rank):
    with open(os.path.join(out, "rank%d.log" % rank)) as f:
        return f.read()


def launch(tmp, world, scenarios, tag):
    """Runs the scenarios on `world` ranks; returns ({name: [result per rank]}, returncodes, logs)."""
    out = os.path.join(tmp, tag)
    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(out, "config.json")
    with open(cfg, "w") as f:
        json.dump({"out": out, "scenarios": scenarios}, f)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1", LOCAL_WORLD_SIZE="1",
               PYTHONPATH=PYDIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = []
    for r in range(world):
        log = open(os.path.join(out, "rank%d.log" % r), "w")
        procs.append((subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_worker.py"), cfg],
                                       env=dict(env, RANK=str(r)), stdout=log,
                                       stderr=subprocess.STDOUT), log))
    # Waits for every rank. A rank that failed leaves its peers waiting on it
    # (torch's rendezvous waits 30 minutes): once one has failed, the rest get
    # ORPHAN_GRACE_S to finish (a mismatch fails every rank, each on its own)
    # before they are stopped, and the failure shows every rank's log.
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    first_failure = None
    while any(p.poll() is None for p, _ in procs):
        now = time.monotonic()
        if first_failure is None and any(p.poll() not in (None, 0) for p, _ in procs):
            first_failure = now
        late = first_failure is not None and now - first_failure > ORPHAN_GRACE_S
        if now > deadline or late:
            for q, _ in procs:
                q.kill()
                q.wait()
            for _, log in procs:
                log.close()
            tails = "\n".join("--- rank %d:\n%s" % (r, read_log(out, r)[-2000:])
                                for r in range(world))
            pytest.fail("launch %s %s; logs in %s\n%s" % (
                tag, "hung (> %d s)" % LAUNCH_TIMEOUT_S if not late else
                "left ranks waiting on a failed one (> %d s)" % ORPHAN_GRACE_S, out, tails))
        time.sleep(0.05)
    codes = [p.returncode for p, _ in procs]
    for _, log in procs:
        log.close()
    logs = [read_log(out, r) for r in range(world)]
    results = {}
    for sc in scenarios:
        per_rank = []
        for r in range(world):
            path = os.path.join(out, "%s.rank%d.json" % (sc["name"], r))
            per_rank.append(json.load(open(path)) if os.path.exists(path) else None)
        results[sc["name"]] = per_rank
    return results, codes, logs


TINY = 0.0005  # MiB: DDP puts (about) one parameter in each bucket
# Learning (2) + profiling (3) + a warm-up visit and one screening block of
# at most 5 candidates + 5 verification pairs, and a few steps on the kept
# plan.
STEPS = 30


def scenario(name, model, cache, **kw):
    sc = dict(name=name, model=model, cache_dir=cache, steps=STEPS, bucket_cap_mb=TINY)
    sc.update(kw)
    return sc


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ddp"))


def two_rank_scenarios(tmp):
    c = lambda n: os.path.join(tmp, "cache-" + n)
    return [
        # Through a communication hook and a separate process group.
        scenario("mlp_tiny_hook", "mlp", c("mlp_hook"), communicator="process_group"),
        scenario("cnn_default_view_hook", "cnn", c("cnn_hook"), bucket_cap_mb=25, view=True,
                 communicator="process_group"),
        # DDP reduces (the default).
        scenario("mlp_tiny", "mlp", c("mlp")),
        scenario("mlp_default_view", "mlp", c("mlp_default"), bucket_cap_mb=25, view=True),
        scenario("cnn_tiny_view", "cnn", c("cnn"), view=True),
        scenario("cnn_default", "cnn", c("cnn_default"), bucket_cap_mb=25),
        scenario("block_tiny", "block", c("block")),
        scenario("block_default_view", "block", c("block_default"), bucket_cap_mb=25, view=True),
        scenario("mlp_unused", "mlp", c("mlp_unused"), unused=True),
        # Gradient accumulation under no_sync(): a step is one optimizer
        # step (3 backward passes, 1 reduced).
        scenario("cnn_tiny_no_sync", "cnn", c("cnn_no_sync"), accumulate=3),
        scenario("mlp_tiny_no_sync_hook", "mlp", c("mlp_no_sync_hook"), accumulate=3,
                 communicator="process_group"),
    ]


@pytest.fixture(scope="module")
def first_run(tmp):
    return launch(tmp, 2, two_rank_scenarios(tmp), "w2-first")


@pytest.fixture(scope="module")
def second_run(tmp, first_run):
    return launch(tmp, 2, two_rank_scenarios(tmp), "w2-second")


def check_ok(results, name, logs):
    per_rank = results[name]
    for r, res in enumerate(per_rank):
        assert res is not None, "rank %d wrote no result for %s; log:\n%s" % (r, name, logs[r][-3000:])
        assert res["ok"], "rank %d, %s: %s" % (r, name, res.get("error"))
    return per_rank


@pytest.mark.parametrize("name", [s["name"] for s in two_rank_scenarios("x")])
def test_two_ranks_match_plain_ddp_bit_for_bit_while_tuning(first_run, name):
    results, codes, logs = first_run
    per_rank = check_ok(results, name, logs)
    for res in per_rank:
        assert res["bitwise"], "%s rank %d: max relative difference %g" % (name, res["rank"], res["max_rel"])
        assert res["phase"] == "tuned", res["phase"]
        assert not res["cache_hit"]
        assert 0 < res["tuning_iterations"] <= STEPS - 3
        assert res["passthrough"] == 2  # DDP's ready order is learned first
        assert res["fused_iterations"] >= STEPS - 2 - 1
    # Every rank runs the same plan.
    assert len({json.dumps(r["plan"]) for r in per_rank}) == 1


@pytest.mark.parametrize("name", ["mlp_tiny", "cnn_tiny_view", "block_tiny", "mlp_tiny_hook",
                                  "cnn_tiny_no_sync"])
def test_tuned_plan_is_what_the_process_group_carries(first_run, name):
    results, _, logs = first_run
    for res in check_ok(results, name, logs):
        plan = res["plan"]
        # The last step ran on the chosen plan: its allreduce calls, in
        # issue order, are exactly the plan's buckets.
        assert res["counts_per_step"][-1] == plan["bucket_elements"]
        # fusebox's layout has one entry per parameter, and the plan (DDP's
        # buckets, installed by the hook) covers every element of them.
        assert len(res["layout"]) >= 3
        assert sum(plan["bucket_elements"]) == sum(res["layout"])
        if name.endswith("_hook"):
            # The learning iterations went through the process group
            # directly, one call per DDP bucket, outside the engine's log.
            assert res["counts_per_step"][0] == []
        else:
            # The learning iterations ran DDP's own buckets (several at the
            # tiny cap), where every plan of these small models starts with
            # one (DDP's default: a 1 MiB first bucket).
            assert sum(res["counts_per_step"][1]) == sum(res["layout"])
            assert len(res["counts_per_step"][1]) > 1


@pytest.mark.parametrize("name", [s["name"] for s in two_rank_scenarios("x")])
def test_second_run_hits_the_cache(second_run, name):
    results, codes, logs = second_run
    for res in check_ok(results, name, logs):
        assert res["cache_hit"], name
        assert res["tuning_iterations"] == 0
        assert res["bitwise"]
        assert res["counts_per_step"][-1] == res["plan"]["bucket_elements"]


def test_three_ranks_match_plain_ddp_and_derive_from_the_two_rank_entry(tmp, first_run):
    c = lambda n: os.path.join(tmp, "cache-" + n)
    scenarios = [
        scenario("mlp_tiny", "mlp", c("mlp")),  # cached at 2 ranks: nearest size seeds
        scenario("cnn_default_view", "cnn", c("cnn3"), bucket_cap_mb=25, view=True),
        scenario("block_tiny", "block", c("block3")),
        scenario("mlp_unused", "mlp", c("mlp_unused3"), unused=True),
    ]
    results, codes, logs = launch(tmp, 3, scenarios, "w3")
    for sc in scenarios:
        for res in check_ok(results, sc["name"], logs):
            # Gloo's ring sums 3 contributions in an order that depends on
            # the message size, and DDP divides before summing: not bit
            # for bit, but within 1e-6.
            assert res["max_rel"] <= 1e-6, (sc["name"], res["max_rel"])
            assert res["phase"] == "tuned"
            assert not res["cache_hit"]  # the cached entry is for 2 ranks
    assert all(r["derived"] for r in results["mlp_tiny"])
    assert not any(r["derived"] for r in results["block_tiny"])


@pytest.mark.parametrize("world", [2, 3])
def test_ucx_communicator_from_the_torch_store_matches_plain_ddp(tmp, world):
    c = lambda n: os.path.join(tmp, "cache-ucx%d-%s" % (world, n))
    scenarios = [
        scenario("mlp_tiny_ucx", "mlp", c("mlp"), communicator="ucx"),
        scenario("block_default_view_ucx", "block", c("block"), bucket_cap_mb=25, view=True,
                 communicator="ucx"),
        scenario("mlp_unused_ucx", "mlp", c("mlp_unused"), unused=True, communicator="ucx"),
    ]
    results, codes, logs = launch(tmp, world, scenarios, "ucx-w%d" % world)
    for sc in scenarios:
        per_rank = check_ok(results, sc["name"], logs)
        for res in per_rank:
            assert res["backend"] == "ucx", res["backend"]
            assert res["phase"] == "tuned"
            assert res["tuning_iterations"] > 0
            if world == 2:
                assert res["bitwise"], (sc["name"], res["max_rel"])
            else:  # UCX sums in rank order, gloo along its ring: 1e-6
                assert res["max_rel"] <= 1e-6, (sc["name"], res["max_rel"])
        assert len({json.dumps(r["plan"]) for r in per_rank}) == 1
    assert all(c == 0 for c in codes), codes


def test_a_rank_with_a_different_model_fails_on_every_rank(tmp):
    sc = scenario("differs", "mlp", os.path.join(tmp, "cache-differs"),
                  hidden_by_rank={"1": 48}, hook_only=True,
                  communicator="process_group")
    results, codes, logs = launch(tmp, 2, [sc], "differs")
    assert all(c != 0 for c in codes), codes
    for r, res in enumerate(results["differs"]):
        assert res is not None and not res["ok"], logs[r][-2000:]


def test_ranks_with_different_ddp_buckets_fail_before_reducing(tmp):
    # find_unused_parameters keeps DDP's initial buckets (no rebuild), which
    # follow bucket_cap_mb: the ranks' layouts differ.
    sc = scenario("buckets_differ", "mlp", os.path.join(tmp, "cache-bd"), unused=True,
                  cap_by_rank={"0": TINY, "1": 25}, hook_only=True,
                  communicator="process_group")
    results, codes, logs = launch(tmp, 2, [sc], "buckets-differ")
    assert all(c != 0 for c in codes), codes
    for r, res in enumerate(results["buckets_differ"]):
        assert res is not None and not res["ok"], logs[r][-2000:]
        assert "ranks disagree on DDP's buckets" in res["error"], res["error"]


BAD_USE = r'''
import os, sys, torch, torch.distributed as dist
import fusebox.torch
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", rank=0, world_size=1)
model = DDP(torch.nn.Linear(4, 4))
try:
    fusebox.torch.register(torch.nn.Linear(4, 4), cache_dir=False)
except TypeError as e:
    print("NOT_DDP", e)
h = fusebox.torch.register(model, cache_dir=False)
try:
    fusebox.torch.register(model, cache_dir=False)
except RuntimeError as e:
    print("TWICE", e)
other = DDP(torch.nn.Linear(4, 4))
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
other.register_comm_hook(None, default_hooks.allreduce_hook)
try:
    fusebox.torch.register(other, cache_dir=False, communicator="process_group")
except RuntimeError as e:
    print("OTHER_HOOK", e)
# DDP reducing (the default) registers no hook: the model's own hook stays.
print("BESIDE_HOOK", fusebox.torch.register(other, cache_dir=False).state)
for pairs in (2, 300):
    try:
        fusebox.torch.register(DDP(torch.nn.Linear(4, 4)), cache_dir=False, verify_pairs=pairs)
    except ValueError as e:
        print("BAD_ARG", e)
for c in ("nccl", "bogus"):
    try:
        fusebox.torch.register(DDP(torch.nn.Linear(4, 4)), cache_dir=False, communicator=c)
    except ValueError as e:
        print("BAD_COMM", e)
print("STATE", h.state)
'''


def test_bad_use_is_refused_with_a_clear_error(tmp):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1", PYTHONPATH=PYDIR)
    p = subprocess.run([sys.executable, "-c", BAD_USE], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "NOT_DDP fusebox.torch.register expects a torch.nn.parallel.DistributedDataParallel model, got Linear" in out
    assert "TWICE" in out and "already has the fusebox hook" in out
    assert "OTHER_HOOK" in out and "DDP refused the fusebox hook" in out
    assert "BESIDE_HOOK learning" in out
    assert "BAD_ARG verify_pairs must be an integer >= 5" in out
    assert "BAD_ARG verify_pairs must be at most 256, got 300" in out
    assert "BAD_COMM communicator='nccl' is not available yet" in out
    assert "BAD_COMM communicator must be 'ddp', 'process_group' or 'ucx', got 'bogus'" in out
    assert "STATE learning" in out


def run_script_on_two_ranks(script, **env_changes):
    """Runs `script` (python -c) as ranks 0 and 1 of a gloo job; returns their
    outputs after checking both exited 0. env_changes: variables to set, or
    to remove (None)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE="2", OMP_NUM_THREADS="1", PYTHONPATH=PYDIR)
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    procs = [subprocess.Popen([sys.executable, "-c", script], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=LAUNCH_TIMEOUT_S)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    return outs


TIMING = r'''
import json, os, sys, time, torch, torch.distributed as dist
import fusebox.torch
from torch.nn.parallel import DistributedDataParallel as DDP
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
torch.manual_seed(0)
SLEEP_S = {"forward": 0.03, "optimizer": 0.02}
class Sleepy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)
    def forward(self, x):
        time.sleep(SLEEP_S["forward"])
        return self.b(torch.relu(self.a(x)))
model = DDP(Sleepy())
handle = fusebox.torch.register(model, cache_dir=False, candidates=0, screening_blocks=1,
                                verify_pairs=5, check_every=2, check_pairs=1, timeout_s=60)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
forced_at, rolled_back_at, bad_index_error = None, None, None
for step in range(100):
    x = torch.randn(16, 64)
    opt.zero_grad()
    # The forced plan is the bad one: its steps take 60 ms longer.
    if (handle.plan or {}).get("name", "").startswith("forced"):
        time.sleep(0.06)
    model(x).sum().backward()
    time.sleep(SLEEP_S["optimizer"])
    opt.step()
    if forced_at is None and handle.state == "tuned":
        try:
            handle._hook._force_plan("candidate:%d" % len(handle.snapshot()["measured"]))
        except Exception as e:  # one past the last measured plan
            bad_index_error = str(e)
        handle._hook._force_plan("per-tensor")
        forced_at = step
    elif forced_at is not None and rolled_back_at is None and handle.snapshot()["fallbacks"]:
        rolled_back_at = step
snap = handle.snapshot()
print("RESULT", json.dumps({"rank": rank, "iteration_ms": [s["iteration_ms"] for s in snap["stats"]],
      "forced_at": forced_at, "rolled_back_at": rolled_back_at, "decision": snap["decision"],
      "bad_index_error": bad_index_error,
      "final_plan": snap["plan"]["name"], "installs": snap["plan_installs"]}))
'''


def test_steps_are_timed_whole_and_a_bad_plan_is_rolled_back():
    """The hook times forward start to forward start (a model whose forward
    sleeps 30 ms and an optimizer step after 20 ms of sleep: every step
    measures >= 50 ms), and a plan forced in after tuning that makes steps
    60 ms slower is detected by the checks and replaced by DDP's default
    (the user's buckets here) within 10 check pairs: a check every 5 steps
    (check_every 2 is raised to the minimum, 5) plus its control step; the
    regression test without a noise estimate waits for 4 pairs and needs
    a few more to cross its threshold (Note [Catching small regressions])."""
    outs = run_script_on_two_ranks(TIMING)
    for out in outs:
        res = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
        assert res["iteration_ms"], res
        assert min(res["iteration_ms"]) >= 50.0, res["iteration_ms"]
        assert res["forced_at"] is not None, res
        assert "the tuner measured" in (res["bad_index_error"] or ""), res
        assert res["rolled_back_at"] is not None, res
        assert res["rolled_back_at"] - res["forced_at"] <= 10 * (5 + 1) + 2, res
        assert "fell back to DDP's default" in res["decision"], res["decision"]
        assert res["final_plan"] == "ddp", res


PAUSED = r'''
import json, os, time, torch, torch.distributed as dist
import fusebox.torch
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
class Sleepy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 8)
    def forward(self, x):
        time.sleep(0.03)
        return self.a(x)
model = DDP(Sleepy())
handle = fusebox.torch.register(model, cache_dir=False, candidates=0, screening_blocks=1,
                                verify_pairs=5, timeout_s=60)
# Communication that ends 40 ms after the last gradient: a callback queued
# where DDP queues its wait for the buckets (a post hook of the gradient
# accumulators, once the last gradient is accumulated), sleeping.
params, accumulated, accumulators = list(model.parameters()), [0], []
def slow_end(*_):
    accumulated[0] += 1
    if accumulated[0] == len(params):
        accumulated[0] = 0
        torch.autograd.Variable._execution_engine.queue_callback(lambda: time.sleep(0.04))
for p in params:
    accumulators.append(p.expand_as(p).grad_fn.next_functions[0][0])
    accumulators[-1].register_hook(slow_end)
def steps(n, pause):
    for _ in range(n):
        model(torch.randn(16, 64)).sum().backward()
        pause()
def paused():
    with handle.paused():
        time.sleep(0.15)
steps(12, paused)
first = len(handle.stats())
steps(8, lambda: time.sleep(0.15))
ms = [s["iteration_ms"] for s in handle.stats()]
exposed = [s["exposed_ms"] for s in handle.stats()]
try:
    handle._hook.exclude_from_step(-1.0)
    negative = "no error"
except ValueError as e:
    negative = str(e)
print("RESULT", json.dumps({"paused_ms": ms[:first], "bare_ms": ms[first + 1:],
                           "negative": negative, "exposed_ms": exposed}))
'''


def test_time_in_paused_is_not_counted_and_the_end_of_communication_is_seen():
    """Steps of 30 ms whose communication ends 40 ms after the last gradient,
    with 150 ms between them: inside handle.paused() the hook measures each
    step without the 150 ms (under 150 ms: it would be over 220 with it);
    outside, the same wait counts (over 150 ms each). Every step's exposed
    communication is the 40 ms (it was 0 before the native path saw where
    DDP's backward ends). A negative time to exclude is refused."""
    for out in run_script_on_two_ranks(PAUSED):
        res = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
        assert len(res["paused_ms"]) >= 8 and len(res["bare_ms"]) >= 5, res
        assert max(res["paused_ms"]) < 150.0, res["paused_ms"]
        assert min(res["paused_ms"]) >= 30.0, res["paused_ms"]
        assert min(res["bare_ms"]) >= 150.0, res["bare_ms"]
        assert "finite and >= 0" in res["negative"], res
        assert min(res["exposed_ms"]) >= 38.0, res["exposed_ms"]
        assert max(res["exposed_ms"]) < 140.0, res["exposed_ms"]


LOGGING = r'''
import json, logging, os, subprocess, sys, torch, torch.distributed as dist
import fusebox.torch
from fusebox.record_profile import record_profile, write_profile
from torch.nn.parallel import DistributedDataParallel as DDP
rank = int(os.environ["RANK"])
tmp, tune = os.environ["FB_TMP"], os.environ["FB_TUNE"]
dist.init_process_group("gloo")
records = []
class Keep(logging.Handler):
    def emit(self, r):
        records.append((r.levelname, r.getMessage()))
logging.getLogger("fusebox").addHandler(Keep())
def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
def steps(model, n):
    for _ in range(n):
        model(torch.randn(4, 32)).sum().backward()
out = {}
# A plan file that does not exist: FileNotFoundError, naming it.
try:
    m = DDP(make())
    fusebox.torch.register(m, plan=os.path.join(tmp, "missing.json"), cache_dir=False)
    steps(m, 4)
    out["missing"] = "no error"
except FileNotFoundError as e:
    out["missing"] = "FileNotFoundError: %s" % e
# A cache directory that cannot be made: one WARNING on the "fusebox"
# logger (shown by default), and training goes on.
blocker = os.path.join(tmp, "blocker-%d" % rank)
open(blocker, "w").close()
m = DDP(make())
h = fusebox.torch.register(m, cache_dir=os.path.join(blocker, "cache"), candidates=0,
                           screening_blocks=1, verify_pairs=5)
steps(m, 15)
h.snapshot()
out["warnings"] = [msg for lvl, msg in records if lvl == "WARNING"]
out["infos_by_default"] = sum(1 for lvl, _ in records if lvl == "INFO")
# An entry written offline by fusebox-tune from a profile recorded on this
# model is a hit for the hook: zero tuning iterations.
cache = os.path.join(tmp, "offline-cache")
if rank == 0:
    x, y = torch.randn(4, 32), torch.randn(4, 8)
    prof = record_profile(make(), lambda: (x, y), loss_fn=torch.nn.functional.mse_loss,
                          iterations=3, warmup=1, model_name="mlp")
    write_profile(prof, os.path.join(tmp, "mlp.json"))
    p = subprocess.run([tune, "--profile", os.path.join(tmp, "mlp.json"), "--preset", "25gbe",
                        "--world", "2", "--ranks_per_node", "2", "--backend", "gloo",
                        "--network", "lab+cpu+torch" + torch.__version__.split(".")[0],
                        "--cache_dir", cache], capture_output=True, text=True)
    out["tune"] = p.returncode, p.stdout[-2000:] + p.stderr[-2000:]
dist.barrier()
m = DDP(make())
h = fusebox.torch.register(m, cache_dir=cache, network="lab", ranks_per_node=2)
steps(m, 6)
out["offline_hit"] = h.cache_hit, h.tuning_iterations, h.state
print("RESULT", json.dumps(out))
'''


def test_logging_exceptions_and_an_entry_tuned_offline():
    """Messages go to the "fusebox" logger (an unusable cache directory is a
    WARNING, shown without verbose; the tuner's progress is INFO and hidden
    by default); a missing plan file raises FileNotFoundError; and a plan
    that fusebox-tune stored offline, from a profile recorded on the model,
    is a cache hit for the hook (same model signature, world, ranks per
    node, backend family "gloo" for DDP's own process group, network)."""
    tmp = tempfile.mkdtemp(prefix="fusebox-log-")
    tune = os.path.join(os.path.dirname(PYDIR), "tools", "fusebox-tune")
    outs = run_script_on_two_ranks(LOGGING, FB_TMP=tmp, FB_TUNE=tune, FUSEBOX_LOG_LEVEL=None)
    for rank, out in enumerate(outs):
        res = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
        assert res["missing"].startswith("FileNotFoundError:"), res["missing"]
        assert "missing.json" in res["missing"]
        assert any("policy cache disabled" in w and "blocker" in w for w in res["warnings"]), res
        assert res["infos_by_default"] == 0  # the tuner's progress: INFO, off by default
        if rank == 0:
            assert res["tune"][0] == 0, res["tune"][1]
        assert res["offline_hit"] == [True, 0, "tuned"], res["offline_hit"]


DECLINES = r'''
import json, os, torch, torch.distributed as dist
import fusebox.torch
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
out = {}
def train(m, n):
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for _ in range(n):
        opt.zero_grad()
        m(torch.ones(4, 16)).sum().backward()
        opt.step()
    return [p.detach().clone() for p in m.parameters()]
# static_graph=True: declined at register, named, and the model trains as plain DDP.
m = DDP(torch.nn.Linear(16, 4), static_graph=True)
h = fusebox.torch.register(m)
out["static"] = h.state, h.decision
torch.manual_seed(0)
plain = DDP(torch.nn.Linear(16, 4))
out["same_as_plain"] = all(torch.equal(a, b) for a, b in zip(train(m, 3), train(plain, 3)))
# torch.compile, around DDP or under it: declined, named. This torch may
# have no torch.compile: a stand-in with its wrapper's name and attribute.
class OptimizedModule(torch.nn.Module):
    def __init__(self, mod):
        super().__init__()
        self._orig_mod = mod
    def forward(self, *a):
        return self._orig_mod(*a)
m = DDP(OptimizedModule(torch.nn.Linear(16, 4)))
h = fusebox.torch.register(m)
out["compiled_under"] = h.state, h.decision
out["compiled_under_trains"] = len(train(m, 2)) == 2
h = fusebox.torch.register(OptimizedModule(DDP(torch.nn.Linear(16, 4))))
out["compiled_around"] = h.state, h.decision
# A module merely named so (no _orig_mod) is not taken for a compiled one.
class Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(16, 4)
    def forward(self, x):
        return self.l(x)
Plain.__name__ = "OptimizedModule"
h = fusebox.torch.register(DDP(Plain()), cache_dir=False)
out["named_only"] = h.state
# FUSEBOX_DISABLE=1: nothing registered.
os.environ["FUSEBOX_DISABLE"] = "1"
h = fusebox.torch.register(DDP(torch.nn.Linear(16, 4)))
out["disabled"] = h.state, h.decision
os.environ["FUSEBOX_DISABLE"] = "maybe"
try:
    fusebox.torch.register(DDP(torch.nn.Linear(16, 4)))
except ValueError as e:
    out["bad_disable"] = str(e)
print("RESULT", json.dumps(out))
'''


def test_a_ddp_it_cannot_handle_is_declined_and_fusebox_can_be_turned_off():
    """static_graph=True and torch.compile (around DDP or under it) are
    declined at register, with a message naming the option, and the model
    trains as plain DDP (same parameters as a plain
    DDP model after 3 steps); FUSEBOX_DISABLE=1 registers nothing; any
    other value of it is a ValueError naming the variable."""
    outs = run_script_on_two_ranks(DECLINES)
    for out in outs:
        res = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
        assert res["static"][0] == "disabled", res
        assert "static_graph=True" in res["static"][1], res
        assert res["same_as_plain"], res
        for where in ("compiled_under", "compiled_around"):
            assert res[where][0] == "disabled", res
            assert "torch.compile" in res[where][1], res
        assert "module under DDP" in res["compiled_under"][1], res
        assert res["compiled_under_trains"], res
        assert res["named_only"] != "disabled", res
        assert res["disabled"][0] == "disabled" and "FUSEBOX_DISABLE" in res["disabled"][1], res
        assert "FUSEBOX_DISABLE" in res["bad_disable"], res


SYNCS = r'''
import json, os, time, torch, torch.distributed as dist
import fusebox.torch as ft
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
# A fake device: the hook's synchronisations are counted per step.
syncs = []
ft._device_sync = lambda params: (lambda: syncs.append(step))
class Sleepy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)
    def forward(self, x):
        time.sleep(0.005)
        return self.b(torch.relu(self.a(x)))
m = DDP(Sleepy())
h = ft.register(m, cache_dir=False, candidates=0, screening_blocks=1, verify_pairs=5,
                check_every=5, timeout_s=60)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
tuned_at = None
for step in range(160):
    opt.zero_grad()
    m(torch.ones(8, 64)).sum().backward()
    opt.step()
    if tuned_at is None and h.state == "tuned":
        tuned_at = step
        # A plan other than the user's buckets, so that checks run (every
        # model-sized cap gives this small model the same single bucket).
        h._hook._force_plan("per-tensor")
snap = h.snapshot()
kept_baseline = False
after = [s for s in syncs if tuned_at is not None and s > tuned_at + 2]
print("RESULT", json.dumps({"tuned_at": tuned_at, "before": len(syncs) - len(after),
      "after": len(after), "kept_baseline": kept_baseline, "steps": 160,
      "checks": snap["checks"]}))
'''


def test_the_device_is_synchronised_only_at_measured_steps():
    """A fake device counts the hook's synchronisations (Note [Timing
    without stalling the device]): every step while tuning; after the
    decision, with a plan other than the user's buckets forced in, only the
    three boundaries of each check (one baseline step every 5 or more), and
    at least one check's."""
    for out in run_script_on_two_ranks(SYNCS):
        res = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
        assert res["tuned_at"] is not None, res
        assert res["before"] >= res["tuned_at"], res
        after_steps = res["steps"] - res["tuned_at"] - 3
        assert 0 < res["after"] <= 3 * (after_steps // 6 + 1), res
        assert res["checks"] >= 1, res


DEVICES = r"""
import os, torch, torch.distributed as dist
import fusebox.torch as ft
from torch.nn.parallel import DistributedDataParallel as DDP
for comm, devices in (("ucx", ["cuda"]), ("process_group", ["cpu", "cuda"]), ("nccl", ["cuda"])):
    try:
        ft._check_devices(comm, devices)
        print("ACCEPTED", comm)
    except ValueError as e:
        print("REFUSED", comm, e)
ft._check_devices("ddp", ["cuda", "cpu"])
ft._check_devices("ucx", ["cpu"])
print("SYNC", ft._device_sync([torch.nn.Parameter(torch.zeros(2))]))
# The native path's agreements go through a group of its own, always gloo,
# and the cache key names DDP's backend.
dist.init_process_group("gloo", rank=0, world_size=1)
made = []
real_new_group = dist.new_group
def new_group(*args, **kw):
    made.append(kw.get("backend"))
    return real_new_group(*args, **kw)
dist.new_group = new_group
handle = ft.register(DDP(torch.nn.Linear(4, 2)), cache_dir=False)
print("GROUPS", made, handle.snapshot()["backend"])
"""


def test_models_off_the_cpu_are_refused_at_register_except_on_the_native_path():
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1", PYTHONPATH=PYDIR)
    p = subprocess.run([sys.executable, "-c", DEVICES], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    for comm in ("ucx", "process_group", "nccl"):
        assert ("REFUSED %s communicator=%r reduces DDP's buckets through fusebox, which takes "
                "CPU gradients only; the model has cuda parameters. Use communicator='ddp'"
                % (comm, comm)) in out, out
    assert "ACCEPTED" not in out, out
    assert "SYNC None" in out, out
    assert "GROUPS ['gloo'] torch-gloo" in out, out


CALIBRATION = r'''
import json, torch, torch.distributed as dist
import fusebox.torch
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(4)])
m = DDP(model, bucket_cap_mb=0.1)
h = fusebox.torch.register(m, cache_dir=False, candidates=1, screening_blocks=1,
                           verify_pairs=5, check_every=0, timeout_s=60)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for step in range(30):
    opt.zero_grad()
    m(torch.ones(8, 128)).sum().backward()
    opt.step()
snap = h.snapshot()
print("RESULT", json.dumps({"calls": h._calibration, "cost_model": snap["cost_model"],
      "phase": snap["phase"],
      "grad_bytes": sum(p.numel() * 4 for p in m.parameters())}))
'''


def test_the_cost_model_is_fitted_through_ddps_own_process_group():
    """With DDP reducing (the default), the tuner's calibration allreduces
    run through the process group DDP reduces its buckets on, not through
    fusebox's side group: the timer on DDP's group is called with the
    calibration sizes (4 KiB x8 up to the gradients' bytes, at least 1 MiB),
    its figures are the slowest rank's (the same on both ranks), and the
    fitted model names DDP's group."""
    outs = run_script_on_two_ranks(CALIBRATION)
    res = [json.loads(out.split("RESULT ", 1)[1].splitlines()[0]) for out in outs]
    for r in res:
        assert r["phase"] == "tuned", r
        assert len(r["calls"]) >= 1, r
        sizes, reps, times = r["calls"][0]
        cap = max(r["grad_bytes"], 1 << 20)
        assert sizes == [4096, 32768, 262144, cap], r
        assert reps >= 3 and all(t > 0 for t in times), r
        assert "DDP's process group (torch-gloo)" in r["cost_model"], r
    assert res[0]["calls"] == res[1]["calls"]
