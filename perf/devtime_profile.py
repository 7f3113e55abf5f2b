"""Fusebox gradient profiles for the device-time model (perf/devtime.py), without torch: the
shipped ones by name, reading and checking one (the fields autotune/profile.cc reads; every
error names the field), and the element count of a tensor under a parameter scale."""
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
PROFILES_DIR = os.path.normpath(os.path.join(HERE, "..", "autotune", "profiles"))
# The gradient types a profile may name (perf/devtime.py maps them to torch's).
GRADIENT_DTYPES = ("float", "float32", "double", "float64", "half", "float16", "bfloat16",
                   "bf16")
_MAX_US = 1e10  # autotune/profile.h kMaxProfileMicros


def shipped_profiles():
    """Names of the profiles in autotune/profiles/ ("resnet50", ...)."""
    try:
        return sorted(f[:-5] for f in os.listdir(PROFILES_DIR) if f.endswith(".json"))
    except OSError:
        return []


def scaled_numel(numel, param_scale):
    """Elements of a profile tensor of `numel` elements under param_scale."""
    if numel == 0:
        return 0
    return max(1, int(math.floor(numel * param_scale + 0.5)))


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_time(field, v, positive):
    if not _number(v):
        raise ValueError("%s: expected a number, got %r" % (field, v))
    if not math.isfinite(v):
        raise ValueError("%s: %r is not finite" % (field, v))
    if v < 0 or (positive and v == 0):
        raise ValueError("%s: %r is not %s" % (field, v, "positive" if positive else ">= 0"))
    if v > _MAX_US:
        raise ValueError("%s: %r us is absurd (more than %g us)" % (field, v, _MAX_US))
    return float(v)


def validate_profile(p):
    """Checks a parsed profile (the fields autotune/profile.cc reads); raises
    ValueError naming the field. Returns p."""
    if not isinstance(p, dict):
        raise ValueError("profile: expected a JSON object, got %s" % type(p).__name__)
    if p.get("format") != "fusebox-profile":
        raise ValueError("format: expected \"fusebox-profile\", got %r" % p.get("format"))
    if p.get("version") != 1:
        raise ValueError("version: %r is not supported (this reader knows version 1)"
                         % p.get("version"))
    if not isinstance(p.get("model"), str) or not p["model"]:
        raise ValueError("model: expected a non-empty string")
    _check_time("forward_us", p.get("forward_us"), positive=True)
    backward = _check_time("backward_us", p.get("backward_us"), positive=True)
    tensors = p.get("tensors")
    if not isinstance(tensors, list):
        raise ValueError("tensors: expected an array")
    if not tensors:
        raise ValueError("tensors: empty (a device-time model needs at least one tensor)")
    names = set()
    last = 0.0
    for i, t in enumerate(tensors):
        path = "tensors[%d]" % i
        if not isinstance(t, dict):
            raise ValueError("%s: expected an object" % path)
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("%s.name: expected a non-empty string" % path)
        if name in names:
            raise ValueError("%s.name: \"%s\" appears more than once" % (path, name))
        names.add(name)
        shape = t.get("shape")
        if not isinstance(shape, list) or len(shape) > 8:
            raise ValueError("%s.shape: expected an array of at most 8 integers" % path)
        for d, n in enumerate(shape):
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError("%s.shape[%d]: expected an integer >= 0, got %r" % (path, d, n))
        if t.get("dtype") not in GRADIENT_DTYPES:
            raise ValueError("%s.dtype: %r is not a gradient type (expected float, double, "
                             "half or bfloat16)" % (path, t.get("dtype")))
        ready = _check_time("%s.ready_us" % path, t.get("ready_us"), positive=False)
        if ready > backward:
            raise ValueError("%s.ready_us: %g is later than backward_us = %g"
                             % (path, ready, backward))
        if ready < last:
            raise ValueError("%s.ready_us: %g is earlier than tensors[%d].ready_us = %g"
                             % (path, ready, i - 1, last))
        last = ready
    return p


def load_profile(path_or_name):
    """A profile from a file, or a shipped one by name ("resnet50"). ValueError
    naming path_or_name where it is neither."""
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise ValueError("path_or_name: expected a path or a profile name, got %r"
                         % (path_or_name,))
    path = os.fspath(path_or_name)
    if not os.path.isfile(path):
        shipped = shipped_profiles()
        if path not in shipped:
            raise ValueError("path_or_name: unknown profile %r: not a file, nor a shipped "
                             "profile (%s)" % (path, ", ".join(shipped) or "none found"))
        path = os.path.join(PROFILES_DIR, path + ".json")
    try:
        with open(path, encoding="utf-8") as f:
            profile = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError("path_or_name: cannot read profile %s: %s" % (path, e)) from None
    try:
        return validate_profile(profile)
    except ValueError as e:
        raise ValueError("path_or_name: %s: %s" % (path, e)) from None
