"""Tests for perf/devtime.py, the device-time model (EMULATED compute: the host
sleeps; real DDP communication): gradients become ready in the profile's order
and at its (scaled) times, backward and forward take the scaled device time,
param_scale keeps the sizes' ratios, gradients are deterministic and a 2-rank
gloo DDP run averages them exactly, bad input fails with ValueError naming the
argument.

Run with a Python that imports torch (Debian: /usr/bin/python3):

    OMP_NUM_THREADS=1 /usr/bin/python3 -m pytest -q tests/python/test_devtime.py

This file is also the DDP test's rank program (`python test_devtime.py ddp-rank
CONFIG`, with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set).
"""
import json
import math
import os
import statistics
import subprocess
import sys
import time

import pytest

sys.dont_write_bytecode = True  # keep __pycache__ out of perf/
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PERF = os.path.join(ROOT, "perf")
sys.path.insert(0, PERF)

torch = pytest.importorskip("torch")
import devtime  # noqa: E402
from devtime import DeviceTimeModel  # noqa: E402

torch.set_num_threads(1)

SHIPPED = ("bert_large", "gpt2_small", "gpt2_xl", "resnet50", "vit_b16")
DDP_TIMEOUT_S = 180


def _tiny_profile():
    """Groups of 1, 2 and 3 tensors ready together, other dtypes, a scalar,
    an empty tensor, names that do not nest as module paths, and a backward
    that goes on after the last gradient (a stem). Times in us."""
    return {
        "format": "fusebox-profile", "version": 1, "model": "tiny",
        "forward_us": 10000.0, "backward_us": 24000.0,
        "tensors": [
            {"name": "head.bias", "shape": [10], "dtype": "float", "ready_us": 2000.0},
            {"name": "head.weight", "shape": [10, 64], "dtype": "float", "ready_us": 2000.0},
            {"name": "mid.a", "shape": [64, 64], "dtype": "double", "ready_us": 9000.0},
            {"name": "mid.b", "shape": [], "dtype": "float", "ready_us": 9000.0},
            {"name": "mid.c", "shape": [64], "dtype": "half", "ready_us": 9000.0},
            {"name": "mid..odd", "shape": [0, 4], "dtype": "float", "ready_us": 15000.0},
            {"name": "emb", "shape": [100, 64], "dtype": "bfloat16", "ready_us": 20000.0},
        ],
    }


def _record_ready(model):
    """Hooks on every parameter's AccumulateGrad (where DDP hooks in): returns
    the list they append (profile name, time.perf_counter()) to."""
    events = []
    keep = []
    for name, p in model.named_parameters_in_ready_order():
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        acc.register_hook(lambda *_, n=name: events.append((n, time.perf_counter())))
        keep.append(acc)
    model._test_accumulators = keep  # they must outlive this function
    return events


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters_in_ready_order()}


def _step_grads(model, rank, step):
    model.zero_grad(set_to_none=True)
    model.loss(model(model.make_batch(rank, step))).backward()
    return _grads(model)


# --- ready order ---------------------------------------------------------

@pytest.mark.parametrize("name", SHIPPED)
def test_ready_order_is_the_profiles(name):
    model = DeviceTimeModel.from_profile(name, compute_scale=0.0, param_scale=1e-4)
    events = _record_ready(model)
    tensor_hooks = []
    for n, p in model.named_parameters_in_ready_order():
        p.register_hook(lambda g, n=n: tensor_hooks.append(n))
    for step in range(2):
        del events[:], tensor_hooks[:]
        _step_grads(model, 0, step)
        with open(os.path.join(ROOT, "autotune", "profiles", name + ".json")) as f:
            profile = [t["name"] for t in json.load(f)["tensors"]]
        assert [n for n, _ in events] == profile
        assert tensor_hooks == profile
    # Parameters carry the profile's names; every one gets a gradient.
    assert sorted(n for n, _ in model.named_parameters()) == sorted(profile)
    assert all(p.grad is not None for p in model.parameters())


def test_ready_order_groups_dtypes_and_stem():
    model = DeviceTimeModel(_tiny_profile(), compute_scale=0.0)
    events = _record_ready(model)
    grads = _step_grads(model, 0, 0)
    assert [n for n, _ in events] == [t["name"] for t in _tiny_profile()["tensors"]]
    # "mid..odd" does not nest, so every parameter is named tensor<i>.
    assert model.parameter_names == ["tensor%d" % i for i in range(7)]
    for t in _tiny_profile()["tensors"]:
        assert list(grads[t["name"]].shape) == t["shape"]
        assert grads[t["name"]].dtype == devtime._DTYPES[t["dtype"]]


# --- timing (emulated device time on a shared machine: generous bounds) --

def _timed_steps(model, steps):
    events = _record_ready(model)
    rows = []
    for step in range(steps + 1):  # the first is warm-up
        del events[:]
        forward_s, backward_s, backward_start, _ = model.timed_step(0, step)
        if step:
            rows.append((forward_s, backward_s, [t - backward_start for _, t in events]))
    return rows


@pytest.mark.parametrize("name,compute_scale", [("resnet50", 1.5), ("tiny", 2.0)])
def test_wall_times_follow_device_times(name, compute_scale):
    profile = _tiny_profile() if name == "tiny" else devtime.load_profile(name)
    model = DeviceTimeModel(profile, compute_scale=compute_scale, param_scale=0.01)
    fwd, bwd = model.device_forward_s(), model.device_backward_s()
    assert 0.015 <= fwd and bwd <= 0.06  # tens of ms
    rows = _timed_steps(model, 3)
    margin = devtime.sleep_margin_s()
    for f, b, _ in rows:
        assert f >= 0.9 * fwd - margin and b >= 0.9 * bwd - margin, (f, b, fwd, bwd)
    assert statistics.median(f for f, _, _ in rows) <= 1.5 * fwd + 0.02
    assert statistics.median(b for _, b, _ in rows) <= 1.5 * bwd + 0.02
    # Each gradient is ready at its scaled ready_us: never much before it (any
    # step), and near it in the step where it was soonest (slow spells aside).
    ready = model.device_ready_s()
    for i, r in enumerate(ready):
        times = [row[2][i] for row in rows]
        assert min(times) >= 0.9 * r - margin, (model.tensor_names[i], times, r)
        assert min(times) <= 1.5 * r + 0.02, (model.tensor_names[i], times, r)


# --- sizes ---------------------------------------------------------------

@pytest.mark.parametrize("name,param_scale", [("resnet50", 0.01), ("gpt2_small", 0.001),
                                              ("vit_b16", 0.003)])
def test_param_scale_keeps_ratios(name, param_scale):
    profile = devtime.load_profile(name)
    model = DeviceTimeModel(profile, compute_scale=0.0, param_scale=param_scale)
    numel = [math.prod(t["shape"]) for t in profile["tensors"]]
    got = [p.numel() for _, p in model.named_parameters_in_ready_order()]
    assert got == [max(1, math.floor(n * param_scale + 0.5)) for n in numel]
    # Largest and last-ready keep their relative sizes (up to rounding).
    big = max(range(len(numel)), key=numel.__getitem__)
    assert got[big] == max(got)
    for i in (big, len(numel) - 1):
        assert abs(got[i] - numel[i] * param_scale) <= 0.5
    assert got[big] / got[-1] == pytest.approx(numel[big] / numel[-1], rel=0.5 / got[-1] + 1e-9)
    s = model.profile_summary()
    assert s["tensors"] == len(numel) and s["param_elements"] == sum(numel)
    assert s["param_bytes"] == 4 * sum(numel) and s["scaled_param_bytes"] == 4 * sum(got)
    assert s["scaled_param_elements"] == sum(got) == sum(p.numel() for p in model.parameters())
    assert s["device_forward_us"] == 0.0 and s["device_backward_us"] == 0.0


def test_param_scale_one_keeps_shapes_and_summary():
    profile = devtime.load_profile("resnet50")
    model = DeviceTimeModel(profile, compute_scale=0.5)
    for t, (n, p) in zip(profile["tensors"], model.named_parameters_in_ready_order()):
        assert n == t["name"] and list(p.shape) == t["shape"] and p.dtype == torch.float32
    s = model.profile_summary()
    assert s["param_elements"] == s["scaled_param_elements"] == 25557032
    assert s["device_forward_us"] == pytest.approx(0.5 * profile["forward_us"])
    assert s["device_backward_us"] == pytest.approx(0.5 * profile["backward_us"])
    assert s["layers"] == len({t["ready_us"] for t in profile["tensors"]})


# --- gradients -----------------------------------------------------------

def test_gradients_are_deterministic():
    kw = dict(compute_scale=0.0, param_scale=0.01, seed=3)
    a = DeviceTimeModel.from_profile("resnet50", **kw)
    b = DeviceTimeModel.from_profile("resnet50", **kw)
    ga, gb, ga2 = _step_grads(a, 1, 4), _step_grads(b, 1, 4), _step_grads(a, 1, 4)
    for n in ga:
        assert torch.equal(ga[n], gb[n]) and torch.equal(ga[n], ga2[n]), n
    # Another rank's batch gives other gradients (so DDP's average means something).
    other = _step_grads(a, 0, 4)
    assert all(not torch.equal(ga[n], other[n]) for n in ga)
    assert torch.equal(a.make_batch(1, 4), b.make_batch(1, 4))
    assert not torch.equal(a.make_batch(0, 4), a.make_batch(1, 4))


DDP_KW = dict(compute_scale=0.05, param_scale=0.01, seed=0)
DDP_STEPS = 2
LR = 0.1


def _reference_ddp(profile):
    """What 2-rank DDP must give, computed in one process: at each step the
    average of the two ranks' gradients, then one SGD step with it."""
    model = DeviceTimeModel.from_profile(profile, **DDP_KW)
    steps = []
    for step in range(DDP_STEPS):
        g0, g1 = _step_grads(model, 0, step), _step_grads(model, 1, step)
        avg = {n: (g0[n] + g1[n]) / 2 for n in g0}
        steps.append(avg)
        with torch.no_grad():
            for n, p in model.named_parameters_in_ready_order():
                p.sub_(avg[n], alpha=LR)
    return steps


def _ddp_rank(config_path):
    import torch.distributed as dist
    from datetime import timedelta
    from torch.nn.parallel import DistributedDataParallel as DDP
    with open(config_path) as f:
        cfg = json.load(f)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=60))
    model = DeviceTimeModel.from_profile(cfg["profile"], **DDP_KW)
    ddp = DDP(model, bucket_cap_mb=0.25)  # several buckets
    steps = []
    for step in range(DDP_STEPS):
        model.zero_grad(set_to_none=True)
        model.loss(ddp(model.make_batch(rank, step))).backward()
        steps.append(_grads(model))
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(p.grad, alpha=LR)
    torch.save(steps, os.path.join(cfg["out"], "rank%d.pt" % rank))
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_two_ranks_average_exactly(tmp_path):
    from ports import free_port
    profile = "resnet50"
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"profile": profile, "out": str(tmp_path)}))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE="2", OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    procs = []
    for r in range(2):
        log = open(tmp_path / ("rank%d.log" % r), "w")
        procs.append((subprocess.Popen([sys.executable, os.path.abspath(__file__), "ddp-rank",
                                        str(cfg)], env=dict(env, RANK=str(r)), stdout=log,
                                       stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + DDP_TIMEOUT_S
    try:
        for p, _ in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    logs = [(tmp_path / ("rank%d.log" % r)).read_text() for r in range(2)]
    codes = [p.returncode for p, _ in procs]
    assert codes == [0, 0], "ranks exited %s\n%s" % (
        codes, "\n".join("--- rank %d:\n%s" % (r, l[-3000:]) for r, l in enumerate(logs)))
    got = [torch.load(tmp_path / ("rank%d.pt" % r)) for r in range(2)]
    want = _reference_ddp(profile)
    for step in range(DDP_STEPS):
        for n, w in want[step].items():
            # g0/2 + g1/2 == (g0 + g1)/2 exactly in binary floating point.
            assert torch.equal(got[0][step][n], w), (step, n)
            assert torch.equal(got[1][step][n], w), (step, n)


# --- bad input -----------------------------------------------------------

@pytest.mark.parametrize("kwargs,argument", [
    (dict(path_or_name="no_such_model"), "path_or_name"),
    (dict(path_or_name="resnet50", compute_scale=-0.1), "compute_scale"),
    (dict(path_or_name="resnet50", compute_scale=float("nan")), "compute_scale"),
    (dict(path_or_name="resnet50", param_scale=-0.01), "param_scale"),
    (dict(path_or_name="resnet50", param_scale=0.0), "param_scale"),
    (dict(path_or_name="resnet50", param_scale=float("inf")), "param_scale"),
    (dict(path_or_name="resnet50", seed=1.5), "seed"),
])
def test_bad_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        DeviceTimeModel.from_profile(**kwargs)


@pytest.mark.parametrize("edit,field", [
    (lambda p: p["tensors"][3].update(ready_us=1.0), r"tensors\[3\]\.ready_us"),
    (lambda p: p["tensors"][1].update(name="head.bias"), r"tensors\[1\]\.name"),
    (lambda p: p["tensors"][0].update(dtype="int32"), r"tensors\[0\]\.dtype"),
    (lambda p: p["tensors"][2].update(shape=[64, -1]), r"tensors\[2\]\.shape\[1\]"),
    (lambda p: p.update(backward_us=0), "backward_us"),
    (lambda p: p.update(version=2), "version"),
    (lambda p: p.update(tensors=[]), "tensors"),
])
def test_bad_profiles_name_the_field(tmp_path, edit, field):
    profile = _tiny_profile()
    edit(profile)
    with pytest.raises(ValueError, match=field):
        DeviceTimeModel(profile)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match="path_or_name: .*bad.json: " + field):
        DeviceTimeModel.from_profile(str(path))
    path.write_text("{")
    with pytest.raises(ValueError, match="path_or_name"):
        DeviceTimeModel.from_profile(path)


def test_recorded_profile_file(tmp_path):
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(_tiny_profile()))
    model = DeviceTimeModel.from_profile(str(path), compute_scale=0.0)
    assert model.tensor_names == [t["name"] for t in _tiny_profile()["tensors"]]
    assert model.profile_summary()["backward_tail_us"] == 4000.0


# --- CLI -----------------------------------------------------------------

def test_cli_runs():
    out = subprocess.run(
        [sys.executable, os.path.join(PERF, "devtime.py"), "--profile", "resnet50",
         "--compute-scale", "0.5", "--param-scale", "0.01", "--steps", "2"],
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1"),
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "EMULATED" in out.stdout
    assert "161 tensors" in out.stdout and "forward 6.719 ms, backward 13.438 ms" in out.stdout
    assert len([l for l in out.stdout.splitlines() if l.startswith(("   0 ", "   1 "))]) == 2
    bad = subprocess.run([sys.executable, os.path.join(PERF, "devtime.py"), "--profile", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "path_or_name: unknown profile 'nope'" in bad.stderr


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "ddp-rank":
        _ddp_rank(sys.argv[2])
    else:
        sys.exit("usage: %s ddp-rank CONFIG (the DDP test's rank program)" % sys.argv[0])
