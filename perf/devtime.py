#!/usr/bin/env python3
"""A device-time model: a torch module that behaves, in time, like a fusebox gradient profile.

    COMPUTE IS EMULATED DEVICE TIME: THE HOST SLEEPS.
    COMMUNICATION IS REAL: DDP's allreduce over its process group.

On a GPU the kernels of forward and backward run on the device while the host's
cores are nearly idle, free for DDP's communication. On a CPU-only machine a real
model's compute takes those same cores away from communication, so a CPU
benchmark measures a different regime. DeviceTimeModel puts the GPU regime back
on a CPU-only machine: each layer's forward and backward take the profile's
device time (times compute_scale) by sleeping, which releases the GIL and the
core, while DDP's reducer, its hooks and its process group run for real on the
host. Numbers measured with it are EMULATED and must be labelled as such
(e.g. "emulated device time, resnet50 profile, compute x0.1, params x0.01").

Model, built from a profile (autotune/profiles/README.md; autotune/profile.cc for
the fields: model, forward_us, backward_us, tensors[i].name/shape/dtype/ready_us):

- Parameters: one per profile tensor, same dtype. With param_scale 1 it has the
  profile's shape; otherwise it is flat with max(1, round(n * param_scale))
  elements (round half up; an empty tensor stays empty), so sizes keep their
  ratios up to rounding and the largest tensor stays the largest.
  named_parameters() gives the profile's names where they nest as module paths
  (they do in every shipped profile), else "tensor<i>" for the i-th profile
  tensor; named_parameters_in_ready_order() always gives (profile name, parameter).
- Ready order: forward applies one autograd Function per tensor, in the reverse of
  the profile's order, so backward visits them in the profile's order: the
  first-ready tensor belongs to the last Function of the forward. Autograd runs a
  parameter's AccumulateGrad (and so DDP's hook) before the next Function's
  backward, so gradients become ready exactly in the profile's order, one by
  one, also within a group of tensors that share a ready_us. If the profile's
  backward goes on after its last-ready tensor (ready_us < backward_us), a
  parameterless "stem" Function at the start of the forward takes that tail.
- Times (all times below are times compute_scale): a "layer" is a group of
  consecutive tensors with the same ready_us. Backward: the group is ready at its
  ready_us after the start of backward (the start of the first Function's
  backward); each Function computes its gradient, then sleeps until that
  deadline. Forward: the group's forward takes forward_us split in proportion to
  its backward time (ready_us minus the previous group's ready_us: in the
  shipped profiles' compute model backward is 2x forward layer by layer, so this
  is each layer's own forward time), and each Function sleeps until the end of
  its group's forward, counted from the start of the forward. The deadlines are
  absolute, so the host's own work between them (autograd, DDP's hooks, bucket
  copies, launching allreduces) overlaps the emulated device time as it would on a
  GPU, and shows only where it takes longer than the device time; sleeping late
  never accumulates.
- Timer: deadlines are read from time.perf_counter (CLOCK_MONOTONIC, 1 ns) and
  reached with one time.sleep each (clock_nanosleep on Linux with Python 3.11+).
  A sleep wakes late by the thread's timer slack (50 us by default) plus the
  wake-up latency: typically 50 to 150 us, milliseconds on a loaded machine
  (measure_sleep_overshoot() measures it; the CLI prints it). So each sleep asks
  to end sleep_margin_s() early (that lateness, measured once per process, at
  most 1 ms), and a Function with less than that left does not sleep: each
  gradient is ready within about one wake-up's jitter of its deadline, early or
  late, and layers shorter than a wake-up cost no sleep. A busy-wait would be
  more precise but would take the very core this model leaves to
  communication, so it is not used.
- Host cost: a tensor's Function costs the host about 10 us in forward and 15 to
  20 us in backward (2 shared cores, torch 1.13). Where a layer's scaled device
  time is shorter, the step is host-bound (resnet50 at compute_scale 0.1: wall
  about 2 ms forward, 3 ms backward against 1.3 and 2.7 ms of device time);
  the CLI shows wall against device times, so pick compute_scale where they agree.
- Gradients are synthetic, deterministic and cheap (one pass writing the
  gradient): for the i-th profile tensor p,
      grad(p) = ALPHA * p + c_i * sum(grad_output),
  with c_i a fixed per-tensor constant; grad_output depends on the input, so
  ranks with different batches get different gradients, which DDP averages.
  They are not the derivative of the forward (computing one would be real compute).
  The forward is output = input + sum_i PROBE * p_i[0] (the first element of every
  parameter), so the loss changes as the parameters are trained, at O(1) cost per
  tensor.

Usage (e.g. the DDP benchmarks):

    model = DeviceTimeModel.from_profile("resnet50", compute_scale=1.0, param_scale=0.01)
    ddp = DistributedDataParallel(model)
    loss = model.loss(ddp(model.make_batch(rank, step)))
    loss.backward()

CLI: a single-process forward/backward against the stated device times:

    /usr/bin/python3 perf/devtime.py --profile resnet50 --compute-scale 0.1 --param-scale 0.01 --steps 5
"""
import argparse
import math
import statistics
import sys
import time

import torch
from torch import nn

from devtime_profile import (  # noqa: F401  perf/devtime_profile.py: this module's API too
    _number, load_profile, scaled_numel, shipped_profiles, validate_profile)

BATCH = 4   # make_batch's input: BATCH x WIDTH float32
WIDTH = 8
ALPHA = 1e-2   # grad(p) = ALPHA * p + c_i * sum(grad_output)
PROBE = 1e-3   # output = input + PROBE * sum_i p_i[0]

_DTYPES = {"float": torch.float32, "float32": torch.float32,
           "double": torch.float64, "float64": torch.float64,
           "half": torch.float16, "float16": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_margin_s = None


def sleep_margin_s():
    """How much earlier than a deadline _sleep_until asks to wake: the median
    lateness of 11 sleeps of 100 us, measured once per process (at most 1 ms)."""
    global _margin_s
    if _margin_s is None:
        late = []
        for _ in range(11):
            t0 = time.perf_counter()
            time.sleep(1e-4)
            late.append(time.perf_counter() - t0 - 1e-4)
        _margin_s = min(max(statistics.median(late), 0.0), 1e-3)
    return _margin_s


def _sleep_until(deadline):
    """Sleeps until about `deadline` (time.perf_counter): one sleep, asked to end
    sleep_margin_s() early to make up for the wake-up's lateness, and none when
    less than that is left. Each call so ends within about one wake-up's jitter
    of its deadline, early or late, and short layers cost no sleep (a sleep
    per 10 us layer would wake late every time, and the lateness would add up)."""
    left = deadline - time.perf_counter() - _margin_s
    if left > 0:
        time.sleep(left)


def measure_sleep_overshoot(samples=20, interval_s=0.001):
    """How late time.sleep(interval_s) wakes here: (median, max) in seconds."""
    late = []
    for _ in range(samples):
        t0 = time.perf_counter()
        time.sleep(interval_s)
        late.append(time.perf_counter() - t0 - interval_s)
    return statistics.median(late), max(late)


class _Clock:
    """One forward's time origins: the forward's start, and the backward's
    (set by the first Function that backward reaches)."""
    __slots__ = ("forward_start", "backward_start", "grad_sum")

    def __init__(self):
        self.forward_start = time.perf_counter()
        self.backward_start = None
        self.grad_sum = None


class _Step:
    """One Function of the forward: its deadlines (seconds after the forward's
    and the backward's start) and its gradient constant."""
    __slots__ = ("forward_end_s", "backward_end_s", "first_in_backward", "coeff")

    def __init__(self, forward_end_s, backward_end_s, first_in_backward, coeff):
        self.forward_end_s = forward_end_s
        self.backward_end_s = backward_end_s
        self.first_in_backward = first_in_backward
        self.coeff = coeff


class _Layer(torch.autograd.Function):
    """One profile tensor: forward sleeps until its group's forward ends;
    backward computes the synthetic gradient, then sleeps until its ready time."""

    @staticmethod
    def forward(ctx, x, clock, step, p):
        ctx.clock = clock
        ctx.step = step
        ctx.save_for_backward(p)
        y = torch.add(x, p.reshape(-1)[0], alpha=PROBE) if p.numel() else x.clone()
        _sleep_until(clock.forward_start + step.forward_end_s)
        return y

    @staticmethod
    def backward(ctx, g):
        clock, step = ctx.clock, ctx.step
        if step.first_in_backward or clock.backward_start is None:
            clock.backward_start = time.perf_counter()
            # Every Function passes grad_output on unchanged (its forward adds
            # a constant), so its sum is the same for all of them.
            clock.grad_sum = g.sum()
        (p,) = ctx.saved_tensors
        grad = torch.add(clock.grad_sum * step.coeff, p, alpha=ALPHA)
        _sleep_until(clock.backward_start + step.backward_end_s)
        return (g if ctx.needs_input_grad[0] else None), None, None, grad


class _Stem(torch.autograd.Function):
    """The profile's backward after its last-ready tensor (no parameters)."""

    @staticmethod
    def forward(ctx, x, clock, step):
        ctx.clock = clock
        ctx.step = step
        _sleep_until(clock.forward_start + step.forward_end_s)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        clock, step = ctx.clock, ctx.step
        if clock.backward_start is None:  # only with no tensors, which the model rejects
            clock.backward_start = time.perf_counter()
        _sleep_until(clock.backward_start + step.backward_end_s)
        return g, None, None


def _nest(root, name, param):
    """Registers param under root at the module path `name` ("a.b.weight");
    False where the name does not make a module path."""
    parts = name.split(".")
    if any(not part for part in parts):
        return False
    mod = root
    for part in parts[:-1]:
        child = mod._modules.get(part)
        if child is None:
            if part in mod._parameters or hasattr(mod, part):
                return False
            child = nn.Module()
            mod.add_module(part, child)
        mod = child
    leaf = parts[-1]
    if leaf in mod._parameters or leaf in mod._modules or hasattr(mod, leaf):
        return False
    mod.register_parameter(leaf, param)
    return True


class DeviceTimeModel(nn.Module):
    """A module whose compute is EMULATED device time (the host sleeps) and whose
    parameters are a fusebox gradient profile's tensors; DDP's communication over
    it is REAL. Exists to measure the GPU regime (compute on the device, the
    host's cores free for communication) on a CPU-only machine; numbers from it
    must be labelled as emulated. See the module docstring for the arrangement."""

    def __init__(self, profile, compute_scale=1.0, param_scale=1.0, seed=0):
        """profile: a parsed profile (dict); see from_profile for files and names."""
        super().__init__()
        if not _number(compute_scale) or not math.isfinite(compute_scale) or compute_scale < 0:
            raise ValueError("compute_scale: expected a finite number >= 0, got %r"
                             % (compute_scale,))
        if not _number(param_scale) or not math.isfinite(param_scale) or param_scale <= 0:
            raise ValueError("param_scale: expected a finite number > 0, got %r"
                             % (param_scale,))
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError("seed: expected an integer, got %r" % (seed,))
        validate_profile(profile)
        sleep_margin_s()  # calibrated here, not in the first timed step
        self.profile_name = profile["model"]
        self.compute_scale = float(compute_scale)
        self.param_scale = float(param_scale)
        self.seed = seed
        self._forward_us = float(profile["forward_us"])
        self._backward_us = float(profile["backward_us"])
        tensors = profile["tensors"]
        self.tensor_names = [t["name"] for t in tensors]   # profile (= ready) order
        self.profile_ready_us = [float(t["ready_us"]) for t in tensors]
        self._shapes = [list(t["shape"]) for t in tensors]
        self._dtypes = [_DTYPES[t["dtype"]] for t in tensors]
        self._numel = [math.prod(s) for s in self._shapes]

        # Deadlines. Group start: the ready_us of the previous group (0 for the
        # first). forward_end(group) = F * (B - start) / B in forward order.
        scale_s = self.compute_scale * 1e-6
        F, B = self._forward_us, self._backward_us
        group_start = []
        start, prev = 0.0, None
        for r in self.profile_ready_us:
            if prev is not None and r != prev:
                start = prev
            group_start.append(start)
            prev = r
        self.profile_layers = len(set(self.profile_ready_us))
        self.profile_tail_us = B - self.profile_ready_us[-1]
        self._steps = [_Step(forward_end_s=F * (B - group_start[i]) / B * scale_s,
                             backward_end_s=self.profile_ready_us[i] * scale_s,
                             first_in_backward=(i == 0),
                             coeff=1.0 + (i % 8) / 8.0)
                       for i in range(len(tensors))]
        self._stem = (_Step(forward_end_s=F * self.profile_tail_us / B * scale_s,
                            backward_end_s=B * scale_s, first_in_backward=False, coeff=0.0)
                      if self.profile_tail_us > 0 else None)

        # Parameters, created in forward order (the reverse of the profile's).
        gen = torch.Generator().manual_seed(seed)
        params = [None] * len(tensors)
        for i in reversed(range(len(tensors))):
            if self.param_scale == 1.0:
                shape = self._shapes[i]
            else:
                shape = [scaled_numel(self._numel[i], self.param_scale)]
            data = torch.empty(shape, dtype=self._dtypes[i])
            if data.numel():
                data.uniform_(-0.05, 0.05, generator=gen)
            params[i] = nn.Parameter(data)
        self._ready_params = params   # a plain list: not registered twice
        tree = nn.Module()
        nested = all(_nest(tree, self.tensor_names[i], params[i])
                     for i in reversed(range(len(params))))
        if nested and not any(hasattr(self, n) for n in list(tree._modules) + list(tree._parameters)):
            for n, p in tree._parameters.items():
                self.register_parameter(n, p)
            for n, m in tree._modules.items():
                self.add_module(n, m)
            self.parameter_names = list(self.tensor_names)
        else:
            for i in reversed(range(len(params))):
                self.register_parameter("tensor%d" % i, params[i])
            self.parameter_names = ["tensor%d" % i for i in range(len(params))]

    @classmethod
    def from_profile(cls, path_or_name, compute_scale=1.0, param_scale=1.0, seed=0):
        """From a profile file (shipped or recorded) or a shipped profile's name
        ("resnet50": autotune/profiles/resnet50.json)."""
        return cls(load_profile(path_or_name), compute_scale=compute_scale,
                   param_scale=param_scale, seed=seed)

    def named_parameters_in_ready_order(self):
        """[(profile name, parameter)] in the profile's (backward-ready) order."""
        return list(zip(self.tensor_names, self._ready_params))

    def device_ready_s(self):
        """Each tensor's emulated ready time, seconds after backward starts."""
        return [s.backward_end_s for s in self._steps]

    def device_forward_s(self):
        return self._forward_us * self.compute_scale * 1e-6

    def device_backward_s(self):
        return self._backward_us * self.compute_scale * 1e-6

    def timed_step(self, rank, step):
        """One forward and backward on make_batch(rank, step), gradients
        zeroed first; returns (forward_s, backward_s, backward_start, loss)
        by the host's clock (backward_start: time.perf_counter() at the
        start of backward, the origin of its gradients' ready times)."""
        self.zero_grad(set_to_none=True)
        x = self.make_batch(rank, step)
        t0 = time.perf_counter()
        out = self(x)
        t1 = time.perf_counter()
        loss = self.loss(out)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        return t1 - t0, t3 - t2, t2, loss

    def make_batch(self, rank, step):
        """A small deterministic input (BATCH x WIDTH float32) for `rank` at
        `step`: different ranks and steps get different batches."""
        g = torch.Generator().manual_seed(1_000_003 * rank + 7919 * self.seed + step)
        return torch.randn(BATCH, WIDTH, generator=g)

    @staticmethod
    def loss(output):
        """The scalar to call backward on: mean of the squared output."""
        return output.float().square().mean()

    def forward(self, x):
        clock = _Clock()
        if self._stem is not None:
            x = _Stem.apply(x.detach().requires_grad_(True), clock, self._stem)
        for i in reversed(range(len(self._steps))):
            x = _Layer.apply(x, clock, self._steps[i], self._ready_params[i])
        return x

    def profile_summary(self):
        """Sizes and device times, as profiled and as this model has them."""
        itemsize = [torch.empty(0, dtype=d).element_size() for d in self._dtypes]
        scaled = [p.numel() for p in self._ready_params]
        largest = max(range(len(scaled)), key=lambda i: (self._numel[i], -i))
        return {
            "model": self.profile_name,
            "tensors": len(self.tensor_names),
            "layers": self.profile_layers,
            "compute_scale": self.compute_scale,
            "param_scale": self.param_scale,
            "param_elements": sum(self._numel),
            "param_bytes": sum(n * s for n, s in zip(self._numel, itemsize)),
            "scaled_param_elements": sum(scaled),
            "scaled_param_bytes": sum(n * s for n, s in zip(scaled, itemsize)),
            "largest_tensor": self.tensor_names[largest],
            "largest_elements": scaled[largest],
            "last_ready_tensor": self.tensor_names[-1],
            "last_ready_elements": scaled[-1],
            "profile_forward_us": self._forward_us,
            "profile_backward_us": self._backward_us,
            "backward_tail_us": self.profile_tail_us,
            "device_forward_us": self._forward_us * self.compute_scale,
            "device_backward_us": self._backward_us * self.compute_scale,
            "first_ready_device_us": self.profile_ready_us[0] * self.compute_scale,
        }


def _mib(b):
    return b / 2.0 ** 20


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Single-process forward/backward of a device-time model (EMULATED "
                    "device time: the host sleeps) against its stated device times.")
    ap.add_argument("--profile", default="resnet50",
                    help="a profile file or a shipped name (%s; default %%(default)s)"
                    % ", ".join(shipped_profiles()))
    ap.add_argument("--compute-scale", type=float, default=1.0)
    ap.add_argument("--param-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps: expected at least 1")
    try:
        model = DeviceTimeModel.from_profile(args.profile, compute_scale=args.compute_scale,
                                             param_scale=args.param_scale, seed=args.seed)
    except ValueError as e:
        ap.error(str(e))
    s = model.profile_summary()
    print("device-time model (EMULATED device time: the host sleeps; communication would be "
          "real)")
    print("profile %s: %d tensors in %d layers, %.1f MiB -> %.3f MiB of parameters "
          "(param_scale %g; %d -> %d elements)"
          % (s["model"], s["tensors"], s["layers"], _mib(s["param_bytes"]),
             _mib(s["scaled_param_bytes"]), s["param_scale"], s["param_elements"],
             s["scaled_param_elements"]))
    print("  largest %s: %d elements; last ready %s: %d elements"
          % (s["largest_tensor"], s["largest_elements"], s["last_ready_tensor"],
             s["last_ready_elements"]))
    print("  device time (compute_scale %g): forward %.3f ms, backward %.3f ms "
          "(profile %.3f / %.3f ms); first gradient ready at %.3f ms"
          % (s["compute_scale"], s["device_forward_us"] / 1e3, s["device_backward_us"] / 1e3,
             s["profile_forward_us"] / 1e3, s["profile_backward_us"] / 1e3,
             s["first_ready_device_us"] / 1e3))
    med, worst = measure_sleep_overshoot()
    print("  timer: time.sleep(1 ms) wakes %.0f us late (median of 20; max %.0f us)"
          % (med * 1e6, worst * 1e6))
    dev_f, dev_b = s["device_forward_us"] / 1e3, s["device_backward_us"] / 1e3
    print("step  forward_ms (device)  backward_ms (device)  loss")
    for step in range(args.steps):
        forward_s, backward_s, _, loss = model.timed_step(0, step)
        print("%4d  %9.3f (%8.3f)  %10.3f (%8.3f)  %.6g"
              % (step, forward_s * 1e3, dev_f, backward_s * 1e3, dev_b, loss.item()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
