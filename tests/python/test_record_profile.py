"""Tests for plugins/torch/python/fusebox_record_profile.py.

Run with a Python that can import torch (Debian: /usr/bin/python3):

    OMP_NUM_THREADS=1 /usr/bin/python3 -m pytest -q tests/python

If FUSEBOX_PROFILE_TOOL names the C++ `fusebox-profile` binary, every recorded
profile is also checked with `$FUSEBOX_PROFILE_TOOL validate <file>`.
"""

import json
import os
import subprocess
import sys

import pytest

sys.dont_write_bytecode = True  # keep __pycache__ out of plugins/
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "plugins",
                                           "torch", "python"))
SCRIPT = os.path.join(SCRIPT_DIR, "fusebox_record_profile.py")
sys.path.insert(0, SCRIPT_DIR)

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import fusebox_record_profile as frp  # noqa: E402

torch.set_num_threads(1)

BUILTINS = ("mlp", "cnn", "transformer")
BATCH = 8
ITERATIONS = 3
WARMUP = 1
DTYPES = {torch.float32: "float", torch.float64: "double",
          torch.float16: "half", torch.bfloat16: "bfloat16"}
TOP_KEYS = {"format", "version", "model", "description", "forward_us",
            "backward_us", "tensors"}


def _subprocess_env():
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _params_with_grad(model, make_batch, loss_fn):
    """Names of parameters that receive a gradient in one forward/backward."""
    model.train()
    model.zero_grad(set_to_none=True)
    inputs, target = make_batch()
    out = model(inputs)
    loss = loss_fn(out, target) if loss_fn is not None else out.float().sum()
    loss.backward()
    names = {n for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return names


class Recorded:
    def __init__(self, profile, path, model, grad_names):
        self.profile = profile
        self.path = path
        self.model = model
        self.grad_names = grad_names


@pytest.fixture(scope="module")
def builtin(tmp_path_factory):
    """name -> Recorded, for the three built-in models (recorded once)."""
    out = {}
    directory = tmp_path_factory.mktemp("profiles")
    for name in BUILTINS:
        torch.manual_seed(0)
        model, make, loss_fn = frp.build_model(name)
        batch = make(BATCH)
        profile = frp.record_profile(model, lambda: batch, loss_fn=loss_fn,
                                     iterations=ITERATIONS, warmup=WARMUP,
                                     device="cpu", model_name=name)
        path = directory / ("%s.json" % name)
        frp.write_profile(profile, str(path))
        grads = _params_with_grad(model, lambda: batch, loss_fn)
        out[name] = Recorded(profile, path, model, grads)
    return out


class PartlyUsed(nn.Module):
    """fc1 -> frozen -> head, scaled by a float64 scalar; `unused` is never
    called and `frozen` does not require grad."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.frozen = nn.Linear(32, 32)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)
        self.scale = nn.Parameter(torch.tensor(0.5, dtype=torch.float64))

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.frozen(h))
        return self.head(h) * self.scale


@pytest.fixture(scope="module")
def partly_used(tmp_path_factory):
    torch.manual_seed(0)
    model = PartlyUsed()
    x = torch.randn(BATCH, 16)
    profile = frp.record_profile(model, lambda: x, iterations=2, warmup=1,
                                 model_name="partly-used")
    path = tmp_path_factory.mktemp("partly") / "partly.json"
    frp.write_profile(profile, str(path))
    grads = _params_with_grad(model, lambda: (x, None), None)
    return Recorded(profile, path, model, grads)


@pytest.fixture(scope="module")
def cli_mlp(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "cli-mlp.json"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--model", "mlp", "--batch", "4",
         "--iterations", "2", "--warmup", "0", "--threads", "1",
         "-o", str(path)],
        env=_subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return path


# --------------------------------------------------------------------------
# Built-in models
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", BUILTINS)
def test_format_fields(builtin, name):
    p = builtin[name].profile
    assert set(p) == TOP_KEYS
    assert p["format"] == "fusebox-profile"
    assert p["version"] == 1 and type(p["version"]) is int
    assert p["model"] == name
    assert isinstance(p["description"], str)
    assert "fusebox_record_profile.py" in p["description"]
    assert "batch %d" % BATCH in p["description"]
    assert "median of %d iterations" % ITERATIONS in p["description"]


@pytest.mark.parametrize("name", BUILTINS)
def test_tensors_match_parameters(builtin, name):
    rec = builtin[name]
    tensors = rec.profile["tensors"]
    names = [t["name"] for t in tensors]
    assert len(names) == len(set(names)), "duplicate tensor names"
    assert set(names) == rec.grad_names
    params = dict(rec.model.named_parameters())
    # Every parameter of the built-in models receives a gradient.
    assert len(tensors) == len(params)
    for t in tensors:
        assert set(t) == {"name", "shape", "dtype", "ready_us"}
        p = params[t["name"]]
        assert t["shape"] == list(p.shape)
        assert t["dtype"] == DTYPES[p.dtype]


@pytest.mark.parametrize("name", BUILTINS)
def test_ready_times(builtin, name):
    p = builtin[name].profile
    assert p["forward_us"] > 0
    assert p["backward_us"] > 0
    ready = [t["ready_us"] for t in p["tensors"]]
    assert all(isinstance(r, float) for r in ready)
    assert ready == sorted(ready), "ready_us must be non-decreasing"
    assert all(0 <= r <= p["backward_us"] for r in ready)


def test_cnn_has_batchnorm_parameters(builtin):
    names = {t["name"] for t in builtin["cnn"].profile["tensors"]}
    assert {"bn1.weight", "bn1.bias", "bn3.weight", "bn3.bias"} <= names


def test_transformer_has_attention_parameters(builtin):
    names = {t["name"] for t in builtin["transformer"].profile["tensors"]}
    assert "encoder.self_attn.in_proj_weight" in names
    assert "embed.weight" in names


def test_mlp_backward_order(builtin):
    """Backward visits fc3, then fc2, then fc1: the reverse of forward."""
    tensors = builtin["mlp"].profile["tensors"]
    index = {t["name"]: i for i, t in enumerate(tensors)}
    ready = {t["name"]: t["ready_us"] for t in tensors}
    layer_pos = {}
    for layer in ("fc1", "fc2", "fc3"):
        layer_pos[layer] = [index[layer + ".weight"], index[layer + ".bias"]]
    # Each layer's parameters come strictly after the next layer's.
    assert max(layer_pos["fc3"]) < min(layer_pos["fc2"])
    assert max(layer_pos["fc2"]) < min(layer_pos["fc1"])
    assert {tensors[0]["name"], tensors[1]["name"]} == {"fc3.weight",
                                                       "fc3.bias"}
    assert {tensors[-1]["name"], tensors[-2]["name"]} == {"fc1.weight",
                                                         "fc1.bias"}
    # And in time: fc2's backward runs between fc3's and fc1's gradients.
    assert max(ready["fc3.weight"], ready["fc3.bias"]) < \
        min(ready["fc1.weight"], ready["fc1.bias"])


@pytest.mark.parametrize("name", BUILTINS)
def test_written_file_roundtrip(builtin, name):
    rec = builtin[name]
    with open(rec.path, encoding="utf-8") as f:
        loaded = json.load(f)
    assert loaded == rec.profile
    # Atomic write leaves no temporary files behind.
    assert sorted(os.listdir(rec.path.parent)) == \
        sorted("%s.json" % n for n in BUILTINS)


# --------------------------------------------------------------------------
# Parameters without gradients, dtypes
# --------------------------------------------------------------------------

def test_unused_and_frozen_parameters_excluded(partly_used):
    p = partly_used.profile
    names = [t["name"] for t in p["tensors"]]
    assert set(names) == partly_used.grad_names
    assert set(names) == {"fc1.weight", "fc1.bias", "head.weight",
                          "head.bias", "scale"}
    assert not any(n.startswith("unused.") for n in names)
    assert not any(n.startswith("frozen.") for n in names)
    assert len(names) < len(list(partly_used.model.parameters()))
    by_name = {t["name"]: t for t in p["tensors"]}
    assert by_name["scale"]["dtype"] == "double"
    assert by_name["scale"]["shape"] == []
    assert by_name["fc1.weight"]["shape"] == [32, 16]
    # head is after fc1 in forward, so its gradient is ready first.
    assert names.index("head.weight") < names.index("fc1.weight")
    ready = [t["ready_us"] for t in p["tensors"]]
    assert ready == sorted(ready)
    assert all(0 <= r <= p["backward_us"] for r in ready)
    frp.validate_profile(p)


def test_hooks_removed_and_grads_cleared(partly_used):
    model = partly_used.model
    for p in model.parameters():
        assert p.grad is None
    # No leftover hooks: a later backward must not be affected.
    x = torch.randn(2, 16)
    model(x).sum().backward()
    for p in model.parameters():
        assert not p._backward_hooks


def test_no_gradient_at_all_is_an_error():
    model = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="no parameter received a gradient"):
        frp.record_profile(model, lambda: torch.randn(2, 4),
                           loss_fn=lambda out: out.detach().sum()
                           .requires_grad_(), iterations=1, warmup=0)


def test_record_profile_rejects_bad_arguments():
    model = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="iterations"):
        frp.record_profile(model, lambda: torch.randn(2, 4), iterations=0)
    with pytest.raises(ValueError, match="warmup"):
        frp.record_profile(model, lambda: torch.randn(2, 4), warmup=-1)


def test_write_profile_invalid_keeps_existing_file(tmp_path, builtin):
    path = tmp_path / "p.json"
    good = builtin["mlp"].profile
    frp.write_profile(good, str(path))
    before = path.read_text()
    bad = dict(good)
    bad["tensors"] = list(reversed(good["tensors"]))  # decreasing ready_us
    with pytest.raises(ValueError):
        frp.write_profile(bad, str(path))
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["p.json"]


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def test_cli_records_mlp(cli_mlp):
    with open(cli_mlp, encoding="utf-8") as f:
        p = json.load(f)
    frp.validate_profile(p)
    assert p["model"] == "mlp"
    assert "batch 4" in p["description"]
    assert [t["name"] for t in p["tensors"]][-1].startswith("fc1.")
    assert len(p["tensors"]) == 6


def test_cli_rejects_zero_iterations(tmp_path):
    out = tmp_path / "never.json"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--model", "mlp", "--iterations", "0",
         "-o", str(out)],
        env=_subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--iterations must be >= 1" in proc.stderr
    assert not out.exists()


def test_cli_rejects_unknown_model(tmp_path):
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--model", "resnet", "-o",
         str(tmp_path / "x.json")],
        env=_subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "unknown model" in proc.stderr


def test_cli_torchvision(tmp_path):
    out = tmp_path / "tv.json"
    cmd = [sys.executable, SCRIPT, "--model", "torchvision:resnet18",
           "--batch", "2", "--iterations", "1", "--warmup", "0",
           "--image-size", "64", "--threads", "1", "-o", str(out)]
    proc = subprocess.run(cmd, env=_subprocess_env(), capture_output=True,
                          text=True, timeout=240)
    try:
        import torchvision  # noqa: F401
    except ImportError:
        assert proc.returncode != 0
        assert "needs torchvision" in proc.stderr
        assert not out.exists()
        return
    assert proc.returncode == 0, proc.stderr
    with open(out, encoding="utf-8") as f:
        p = json.load(f)
    frp.validate_profile(p)
    assert p["model"] == "torchvision:resnet18"


# --------------------------------------------------------------------------
# C++ validator (optional)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("which", BUILTINS + ("partly-used", "cli-mlp"))
def test_profile_tool_validates(which, request):
    tool = os.environ.get("FUSEBOX_PROFILE_TOOL")
    if not tool:
        pytest.skip("FUSEBOX_PROFILE_TOOL is not set (path to the C++ "
                    "fusebox-profile binary); C++ validation not run")
    assert os.path.isfile(tool) and os.access(tool, os.X_OK), \
        "FUSEBOX_PROFILE_TOOL=%s is not an executable file" % tool
    if which in BUILTINS:
        path = request.getfixturevalue("builtin")[which].path
    elif which == "partly-used":
        path = request.getfixturevalue("partly_used").path
    else:
        path = request.getfixturevalue("cli_mlp")
    proc = subprocess.run([tool, "validate", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, \
        "%s validate %s failed (rc %d):\n%s%s" % (
            tool, path, proc.returncode, proc.stdout, proc.stderr)
