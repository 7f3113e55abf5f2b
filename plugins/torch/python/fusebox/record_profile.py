"""Record a fusebox gradient profile (fusebox-profile v1) from a PyTorch model.

The profile lists every parameter that receives a gradient, in the order the
gradients become ready during backward, with the median time (microseconds
from the start of ``loss.backward()``) at which each one became ready, plus
the median forward and backward durations.  The bucketing planners consume it
through the C++ profile loader, which validates the format strictly:

    {"format": "fusebox-profile", "version": 1, "model": "mlp",
     "description": "recorded by fusebox_record_profile.py on cpu, ...",
     "forward_us": 5200.0, "backward_us": 10400.0,
     "tensors": [{"name": "fc2.bias", "shape": [10], "dtype": "float",
                  "ready_us": 12.5}, ...]}

Library use::

    from fusebox.record_profile import record_profile, write_profile
    profile = record_profile(model, lambda: (x, y),
                             loss_fn=torch.nn.functional.cross_entropy,
                             model_name="mymodel")
    write_profile(profile, "mymodel.json")

Command line (needs a Python that can import torch, e.g. /usr/bin/python3 on
Debian): the console script ``fusebox-record-profile`` (after ``pip install``),
``python3 -m fusebox.record_profile``, or, from a source checkout,
``plugins/torch/python/fusebox_record_profile.py`` (a thin wrapper)::

    OMP_NUM_THREADS=4 fusebox-record-profile --model cnn \\
        --batch 32 --iterations 10 --warmup 3 -o cnn.json

This module imports torch only when it records (``--help`` works without it),
and nothing from the rest of the package (no compiled extension).

How ready times are taken: a hook is registered on every parameter with
``Tensor.register_hook``; for a leaf tensor it fires when autograd has
computed that parameter's gradient.  On CPU the hook reads
``time.perf_counter_ns``.  On CUDA the hook records a CUDA event on the
current (backward) stream instead, so the time is when the gradient kernel
finishes on the device rather than when it was launched; forward and backward
durations are bracketed by ``torch.cuda.synchronize``.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

__all__ = ["FORMAT", "VERSION", "TOOL_NAME", "BUILTIN_MODELS", "dtype_name",
           "record_profile", "validate_profile", "write_profile", "build_model",
           "make_parser", "main"]

FORMAT = "fusebox-profile"
VERSION = 1
# Named in every profile's "description" (kept as it was before the recorder
# moved into the package, so that recorded files read the same).
TOOL_NAME = "fusebox_record_profile.py"

_DTYPE_NAMES = None  # filled lazily so that `--help` works without torch


def _dtype_names():
    global _DTYPE_NAMES
    if _DTYPE_NAMES is None:
        import torch
        _DTYPE_NAMES = {
            torch.float32: "float",
            torch.float64: "double",
            torch.float16: "half",
            torch.bfloat16: "bfloat16",
        }
    return _DTYPE_NAMES


def dtype_name(dtype):
    """Profile name of a torch dtype ("float", "double", "half", "bfloat16")."""
    names = _dtype_names()
    if dtype not in names:
        raise ValueError(
            "unsupported parameter dtype %s; a fusebox profile supports %s"
            % (dtype, ", ".join(str(d) for d in names)))
    return names[dtype]


# --------------------------------------------------------------------------
# Recording
# --------------------------------------------------------------------------

def _to_device(obj, device):
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_to_device(o, device) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def _split_batch(batch):
    """(inputs, target) from what make_batch() returned.

    A 2-element tuple or list is read as (inputs, target); anything else is
    the inputs alone.  To pass several positional inputs without a target,
    return ((x1, x2), None).
    """
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields") \
            and len(batch) == 2:
        return batch[0], batch[1]
    return batch, None


def _call_model(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)) and not hasattr(inputs, "_fields"):
        return model(*inputs)
    return model(inputs)


def _default_loss(output):
    """Sum of all output elements, in float32; handles tuples/dicts of outputs."""
    import torch
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        parts = [_default_loss(o) for o in output
                 if isinstance(o, (torch.Tensor, tuple, list, dict))]
        parts = [p for p in parts if p is not None]
        if parts:
            return sum(parts[1:], parts[0])
        return None
    return None


def _batch_size(inputs):
    import torch
    if isinstance(inputs, torch.Tensor):
        return int(inputs.shape[0]) if inputs.dim() > 0 else None
    if isinstance(inputs, dict):
        inputs = list(inputs.values())
    if isinstance(inputs, (tuple, list)):
        for item in inputs:
            size = _batch_size(item)
            if size is not None:
                return size
    return None


def _median(values):
    return float(statistics.median(values))


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("%s must be an int, got %r" % (name, value))
    if value < minimum:
        raise ValueError("%s must be >= %d, got %d" % (name, minimum, value))


def record_profile(model, make_batch, loss_fn=None, iterations=10, warmup=3,
                   device=None, model_name="model", batch_size=None,
                   description=None):
    """Run forward+backward on `model` and return a fusebox-profile v1 dict.

    model:       a torch.nn.Module; it is put in train mode and, when `device`
                 is given, moved there.
    make_batch:  callable returning the inputs, or an (inputs, target) pair.
                 Inputs may be a tensor (model(x)), a tuple/list (model(*x))
                 or a dict (model(**x)); tensors are moved to the device.
    loss_fn:     None -> output.float().sum();  otherwise
                 loss_fn(output, target), or loss_fn(output) if there is no
                 target.
    iterations:  measured iterations (>= 1); every time is their median.
    warmup:      unrecorded iterations run first (>= 0).
    device:      torch.device or string ("cpu", "cuda", "cuda:1"); None uses
                 the device of the model's first parameter.
    model_name:  the profile's "model" field.
    batch_size:  for the description only; None infers it from dim 0 of the
                 first input tensor.
    description: overrides the generated description.

    Parameters that do not require grad, or never receive a gradient, are
    left out.  Raises ValueError when no parameter receives a gradient.
    """
    import torch

    _check_int("iterations", iterations, 1)
    _check_int("warmup", warmup, 0)
    if not callable(make_batch):
        raise TypeError("make_batch must be callable")
    if not model_name or not isinstance(model_name, str):
        raise ValueError("model_name must be a non-empty string")

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no parameters that require grad")

    if device is None:
        device = params[0][1].device
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device %s requested but CUDA is not available "
                           "in this torch build" % device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError("unsupported device %s (use cpu or cuda)" % device)
    model.to(device)
    model.train()
    # Re-read after .to(): parameters are the same objects for modules, but be
    # safe if the model replaced them.
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    use_cuda = device.type == "cuda"

    def sync():
        if use_cuda:
            torch.cuda.synchronize(device)

    # Per-iteration state the hooks write into; None while not recording.
    state = {"marks": None}

    def make_hook(name):
        def hook(grad):
            marks = state["marks"]
            if marks is not None:
                if use_cuda:
                    ev = torch.cuda.Event(enable_timing=True)
                    ev.record()
                    marks[name] = ev
                else:
                    # A leaf's hook fires once per backward; should it fire
                    # again, the gradient is complete only at the last call.
                    marks[name] = time.perf_counter_ns()
            return None
        return hook

    handles = [p.register_hook(make_hook(n)) for n, p in params]

    forward_ns, backward_ns = [], []
    ready = {}          # name -> list of ready times (ns) per measured iter
    first_order = {}    # name -> rank in the first measured iteration seen
    inferred_batch = None
    try:
        with torch.enable_grad():
            for it in range(warmup + iterations):
                measured = it >= warmup
                inputs, target = _split_batch(make_batch())
                inputs = _to_device(inputs, device)
                target = _to_device(target, device)
                if inferred_batch is None:
                    inferred_batch = _batch_size(inputs)
                model.zero_grad(set_to_none=True)

                sync()
                if use_cuda:
                    f0 = torch.cuda.Event(enable_timing=True)
                    f0.record()
                t_f0 = time.perf_counter_ns()
                output = _call_model(model, inputs)
                if loss_fn is None:
                    loss = _default_loss(output)
                    if loss is None:
                        raise ValueError("model output has no tensors; pass "
                                         "loss_fn")
                elif target is None:
                    loss = loss_fn(output)
                else:
                    loss = loss_fn(output, target)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise ValueError("loss must be a scalar tensor, got %r"
                                     % (type(loss),))
                sync()
                t_f1 = time.perf_counter_ns()

                marks = {} if measured else None
                state["marks"] = marks
                if use_cuda:
                    b0 = torch.cuda.Event(enable_timing=True)
                    b0.record()
                t_b0 = time.perf_counter_ns()
                loss.backward()
                sync()
                t_b1 = time.perf_counter_ns()
                state["marks"] = None
                del output, loss

                if not measured:
                    continue
                if use_cuda:
                    # Event times (device side) are consistent with each
                    # other; f0..b0 spans the forward, b0..end the backward.
                    b1 = torch.cuda.Event(enable_timing=True)
                    b1.record()
                    b1.synchronize()
                    fwd = f0.elapsed_time(b0) * 1e6
                    bwd = b0.elapsed_time(b1) * 1e6
                    times = {n: max(0.0, b0.elapsed_time(ev) * 1e6)
                             for n, ev in marks.items()}
                else:
                    fwd = t_f1 - t_f0
                    bwd = t_b1 - t_b0
                    times = {n: t - t_b0 for n, t in marks.items()}
                forward_ns.append(fwd)
                backward_ns.append(bwd)
                # Order of firing in this iteration, for tie-breaking.
                for n in sorted(times, key=lambda k: times[k]):
                    if n not in first_order:
                        first_order[n] = len(first_order)
                for n, t in times.items():
                    ready.setdefault(n, []).append(t)
    finally:
        state["marks"] = None
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)

    if not ready:
        raise ValueError("no parameter received a gradient; does the loss "
                         "depend on the model's parameters?")

    return _profile_dict(params, ready, first_order, forward_ns, backward_ns, device,
                         model_name=model_name, description=description,
                         batch_size=batch_size if batch_size is not None else inferred_batch,
                         iterations=iterations, warmup=warmup)


def _profile_dict(params, ready, first_order, forward_ns, backward_ns, device, *, model_name,
                  description, batch_size, iterations, warmup):
    """The fusebox-profile v1 dict from record_profile's measurements: medians,
    tensors in ready order (ties by first firing)."""
    import torch

    forward_us = _median(forward_ns) / 1e3
    backward_us = _median(backward_ns) / 1e3
    by_name = dict(params)
    order = sorted(ready, key=lambda n: (_median(ready[n]), first_order[n]))
    tensors = []
    for n in order:
        p = by_name[n]
        # Rounding and clamping are monotone, so the order stays sorted.
        r = min(round(_median(ready[n]) / 1e3, 3), backward_us)
        tensors.append({"name": n, "shape": [int(s) for s in p.shape],
                        "dtype": dtype_name(p.dtype), "ready_us": r})

    if description is None:
        description = "recorded by %s on %s, torch %s, %smedian of %d " \
            "iteration%s after %d warm-up" % (
                TOOL_NAME, _device_label(device), torch.__version__,
                "batch %d, " % batch_size if batch_size else "",
                iterations, "" if iterations == 1 else "s", warmup)

    return {
        "format": FORMAT,
        "version": VERSION,
        "model": model_name,
        "description": description,
        "forward_us": round(forward_us, 3),
        "backward_us": round(backward_us, 3),
        "tensors": tensors,
    }


def _device_label(device):
    import torch
    if device.type == "cuda":
        try:
            return "cuda (%s)" % torch.cuda.get_device_name(device)
        except Exception:  # pragma: no cover - informational only
            return "cuda"
    return str(device)


# --------------------------------------------------------------------------
# Validation and output
# --------------------------------------------------------------------------

def validate_profile(profile):
    """Raise ValueError if `profile` is not a well-formed fusebox-profile v1.

    Mirrors the C++ loader's checks: exact key sets, types, non-negative
    times, non-decreasing ready_us within [0, backward_us], unique names.
    """
    def fail(msg):
        raise ValueError("invalid fusebox profile: " + msg)

    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) \
            and x == x and x not in (float("inf"), float("-inf"))

    if not isinstance(profile, dict):
        fail("top level must be an object")
    keys = {"format", "version", "model", "description", "forward_us",
            "backward_us", "tensors"}
    if set(profile) != keys:
        fail("keys must be %s, got %s" % (sorted(keys), sorted(profile)))
    if profile["format"] != FORMAT:
        fail("format must be %r" % FORMAT)
    if profile["version"] != VERSION or isinstance(profile["version"], bool):
        fail("version must be %d" % VERSION)
    for k in ("model", "description"):
        if not isinstance(profile[k], str):
            fail("%s must be a string" % k)
    if not profile["model"]:
        fail("model must be non-empty")
    for k in ("forward_us", "backward_us"):
        if not number(profile[k]) or profile[k] < 0:
            fail("%s must be a non-negative number" % k)
    tensors = profile["tensors"]
    if not isinstance(tensors, list) or not tensors:
        fail("tensors must be a non-empty list")
    seen = set()
    prev = 0.0
    for i, t in enumerate(tensors):
        where = "tensors[%d]" % i
        if not isinstance(t, dict) or set(t) != {"name", "shape", "dtype",
                                                 "ready_us"}:
            fail("%s must have exactly name, shape, dtype, ready_us" % where)
        if not isinstance(t["name"], str) or not t["name"]:
            fail("%s.name must be a non-empty string" % where)
        if t["name"] in seen:
            fail("%s.name %r is duplicated" % (where, t["name"]))
        seen.add(t["name"])
        if not isinstance(t["shape"], list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0
                for d in t["shape"]):
            fail("%s.shape must be a list of non-negative ints" % where)
        if t["dtype"] not in ("float", "double", "half", "bfloat16"):
            fail("%s.dtype %r is not one of float, double, half, bfloat16"
                 % (where, t["dtype"]))
        r = t["ready_us"]
        if not number(r) or r < 0:
            fail("%s.ready_us must be a non-negative number" % where)
        if r < prev:
            fail("%s.ready_us %g is before the previous tensor's %g"
                 % (where, r, prev))
        if r > profile["backward_us"]:
            fail("%s.ready_us %g exceeds backward_us %g"
                 % (where, r, profile["backward_us"]))
        prev = r


def write_profile(profile, path):
    """Write `profile` as JSON to `path` atomically (temp file + os.replace).

    The profile is validated first; on any error `path` is left untouched.
    """
    validate_profile(profile)
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory,
                               prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(profile, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# --------------------------------------------------------------------------
# Built-in models for the command line
# --------------------------------------------------------------------------

BUILTIN_MODELS = ("mlp", "cnn", "transformer")


def build_model(name, image_size=224):
    """(model, make_batch_fn(batch) -> (inputs, target), loss_fn) for `name`.

    `name` is one of BUILTIN_MODELS or "torchvision:<model name>".
    """
    import torch
    from torch import nn
    import torch.nn.functional as F

    if name == "mlp":
        model = nn.Sequential()
        model.add_module("fc1", nn.Linear(784, 256))
        model.add_module("relu1", nn.ReLU())
        model.add_module("fc2", nn.Linear(256, 128))
        model.add_module("relu2", nn.ReLU())
        model.add_module("fc3", nn.Linear(128, 10))

        def make(batch):
            return torch.randn(batch, 784), torch.randint(0, 10, (batch,))
        return model, make, F.cross_entropy

    if name == "cnn":
        model = nn.Sequential()
        model.add_module("conv1", nn.Conv2d(3, 16, 3, padding=1, bias=False))
        model.add_module("bn1", nn.BatchNorm2d(16))
        model.add_module("relu1", nn.ReLU())
        model.add_module("conv2", nn.Conv2d(16, 32, 3, padding=1, bias=False))
        model.add_module("bn2", nn.BatchNorm2d(32))
        model.add_module("relu2", nn.ReLU())
        model.add_module("pool", nn.MaxPool2d(2))
        model.add_module("conv3", nn.Conv2d(32, 64, 3, padding=1, bias=False))
        model.add_module("bn3", nn.BatchNorm2d(64))
        model.add_module("relu3", nn.ReLU())
        model.add_module("gap", nn.AdaptiveAvgPool2d(1))
        model.add_module("flatten", nn.Flatten())
        model.add_module("fc", nn.Linear(64, 10))

        def make(batch):
            return (torch.randn(batch, 3, 32, 32),
                    torch.randint(0, 10, (batch,)))
        return model, make, F.cross_entropy

    if name == "transformer":
        class TinyTransformer(nn.Module):
            def __init__(self, vocab=1000, d_model=64, nhead=4, ff=256,
                         classes=10):
                super().__init__()
                self.embed = nn.Embedding(vocab, d_model)
                self.encoder = nn.TransformerEncoderLayer(
                    d_model, nhead, dim_feedforward=ff, dropout=0.1,
                    batch_first=True)
                self.head = nn.Linear(d_model, classes)

            def forward(self, tokens):
                h = self.encoder(self.embed(tokens))
                return self.head(h.mean(dim=1))

        model = TinyTransformer()

        def make(batch):
            return (torch.randint(0, 1000, (batch, 32)),
                    torch.randint(0, 10, (batch,)))
        return model, make, F.cross_entropy

    if name.startswith("torchvision:"):
        arch = name[len("torchvision:"):]
        if not arch:
            raise ValueError("--model torchvision:<name> needs a model name, "
                             "e.g. torchvision:resnet18")
        try:
            import torchvision
        except ImportError as e:
            raise RuntimeError(
                "--model %s needs torchvision, which this Python (%s) cannot "
                "import (%s); install torchvision (Debian: python3-torchvision)"
                " or use one of the built-in models: %s"
                % (name, sys.executable, e, ", ".join(BUILTIN_MODELS)))
        models = torchvision.models
        if hasattr(models, "list_models"):  # torchvision >= 0.15
            if arch not in models.list_models():
                raise ValueError("torchvision %s has no model %r"
                                 % (torchvision.__version__, arch))
            model = models.get_model(arch, weights=None)
        else:
            fn = getattr(models, arch, None)
            if fn is None or isinstance(fn, type) or not callable(fn) \
                    or arch.startswith("_"):
                raise ValueError("torchvision %s has no model %r"
                                 % (torchvision.__version__, arch))
            model = fn()  # random weights: pretrained defaults to False
        size = image_size
        if arch.startswith("inception") and size < 299:
            size = 299

        def make(batch):
            return (torch.randn(batch, 3, size, size),
                    torch.randint(0, 10, (batch,)))

        def loss(output, target):
            # Train-mode googlenet/inception return (logits, aux...) tuples.
            if isinstance(output, tuple):
                output = output[0]
            if isinstance(output, dict):
                output = output.get("out", next(iter(output.values())))
            if output.dim() != 2:
                return output.float().sum()
            return F.cross_entropy(output, target % output.shape[1])
        return model, make, loss

    raise ValueError("unknown model %r; choose one of %s or "
                     "torchvision:<name>" % (name, ", ".join(BUILTIN_MODELS)))


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

def _int_at_least(minimum, what):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                "%s must be an integer, got %r" % (what, text))
        if value < minimum:
            raise argparse.ArgumentTypeError(
                "%s must be >= %d, got %d" % (what, minimum, value))
        return value
    return parse


def _model_arg(text):
    if text in BUILTIN_MODELS:
        return text
    if text.startswith("torchvision:") and len(text) > len("torchvision:"):
        return text
    raise argparse.ArgumentTypeError(
        "unknown model %r; choose one of %s, or torchvision:<name>"
        % (text, ", ".join(BUILTIN_MODELS)))


def _prog():
    """The command's name in usage lines: how it was started."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if name in ("", "-c", "-m", "__main__.py", "record_profile.py"):
        return "python3 -m fusebox.record_profile"
    return name  # fusebox-record-profile, fusebox_record_profile.py


def make_parser(prog=None):
    p = argparse.ArgumentParser(
        prog=prog or _prog(),
        description="Record a fusebox gradient profile (fusebox-profile v1 "
        "JSON) from a PyTorch model: the order and time at which each "
        "parameter's gradient becomes ready in backward, plus forward and "
        "backward durations (medians over measured iterations).",
        epilog="Built-in models: mlp (3 Linear layers), cnn (3 conv+BatchNorm "
        "blocks), transformer (embedding + nn.TransformerEncoderLayer + "
        "head). torchvision:<name> (e.g. torchvision:resnet18) needs "
        "torchvision. Set OMP_NUM_THREADS or --threads for stable CPU timings.")
    p.add_argument("--model", required=True, type=_model_arg,
                   metavar="{mlp,cnn,transformer,torchvision:<name>}",
                   help="model to profile")
    p.add_argument("--batch", type=_int_at_least(1, "--batch"), default=32,
                   help="batch size (default 32)")
    p.add_argument("--iterations", type=_int_at_least(1, "--iterations"),
                   default=10, help="measured iterations; times are their "
                   "median (default 10)")
    p.add_argument("--warmup", type=_int_at_least(0, "--warmup"), default=3,
                   help="unrecorded warm-up iterations (default 3)")
    p.add_argument("-o", "--output", required=True,
                   help="profile JSON to write (atomically)")
    p.add_argument("--device", default="cpu",
                   help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--model-name", default=None,
                   help="value of the profile's \"model\" field (default: "
                   "the --model argument)")
    p.add_argument("--image-size", type=_int_at_least(32, "--image-size"),
                   default=224, help="input height/width for torchvision "
                   "models (default 224; inception uses >= 299)")
    p.add_argument("--threads", type=_int_at_least(1, "--threads"),
                   default=None, help="torch.set_num_threads (default: "
                   "torch's choice, i.e. OMP_NUM_THREADS)")
    p.add_argument("--seed", type=int, default=0,
                   help="torch.manual_seed for weights and inputs (default 0)")
    return p


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)

    dev = args.device
    if not (dev == "cpu" or dev == "cuda" or
            (dev.startswith("cuda:") and dev[5:].isdigit())):
        parser.error("--device must be cpu, cuda or cuda:N, got %r" % dev)
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        parser.error("output directory %s does not exist" % out_dir)

    try:
        import torch
    except ImportError as e:
        print("error: cannot import torch with %s (%s); on Debian run this "
              "with /usr/bin/python3" % (sys.executable, e), file=sys.stderr)
        return 2
    if dev.startswith("cuda"):
        if not torch.cuda.is_available():
            print("error: --device %s requested but CUDA is not available in "
                  "torch %s" % (dev, torch.__version__), file=sys.stderr)
            return 2
        index = torch.device(dev).index
        if index is not None and index >= torch.cuda.device_count():
            print("error: --device %s but only %d CUDA device(s)"
                  % (dev, torch.cuda.device_count()), file=sys.stderr)
            return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    try:
        model, make, loss_fn = build_model(args.model, args.image_size)
    except (RuntimeError, ValueError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 2
    batch = make(args.batch)  # one fixed batch, regenerated never

    profile = record_profile(
        model, lambda: batch, loss_fn=loss_fn, iterations=args.iterations,
        warmup=args.warmup, device=dev,
        model_name=args.model_name or args.model, batch_size=args.batch)
    write_profile(profile, args.output)
    print("wrote %s: %d tensors, forward %.1f us, backward %.1f us"
          % (args.output, len(profile["tensors"]), profile["forward_us"],
             profile["backward_us"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
