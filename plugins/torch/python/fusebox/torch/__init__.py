"""fusebox as a PyTorch DDP communication hook: one line in a training script.

    model = torch.nn.parallel.DistributedDataParallel(net)
    handle = fusebox.torch.register(model)   # every rank, before the first backward
    ...train as usual...
    print(handle.state, handle.plan["bucket_elements"], handle.stats()[-1])

The hook learns the order in which gradients become ready from DDP's first two
iterations, then chooses DDP's buckets. The baseline is the DDP the user built
(its bucket_cap_mb): it measures that, DDP's default (25 MiB), the caps users set
by hand (1, 5, 100 MiB) and the planner's best plans in whole iterations,
interleaved, and replaces the user's buckets only when a candidate is faster
with 95% confidence (or applies the plan the policy cache remembers, after a
short interleaved check against the user's buckets). FUSEBOX_DISABLE=1 in the
environment makes register() do nothing: the script runs as plain DDP.
The chosen plan is installed as DDP's own bucket assignment. By default
(communicator="ddp") DDP then reduces its buckets itself, exactly as it does
without fusebox: no communication hook, nothing per bucket, so results are
plain DDP's bit for bit and a plan costs what DDP with those buckets costs.
communicator="ucx" (or "process_group") reduces each DDP bucket in place
through a fusebox communicator from a communication hook instead.
"""
import atexit
import contextlib
import logging
import os
import re
import time
import weakref

import torch  # loads libtorch before the extension
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import _C

__all__ = ["register", "Handle"]

# Every message of the hook goes to this logger: warnings show by default
# (Python's last-resort handler, or the application's), the tuner's progress
# at INFO. FUSEBOX_LOG_LEVEL (error, warning, info, debug) or verbose=True
# sets its level and, when nothing else would print it, a stderr handler.
logger = logging.getLogger("fusebox")

_LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO,
           "debug": logging.DEBUG}
# The two lines a user sees by default (what tuning cost, what the kept plan
# saves: at the end of tuning and at exit), between INFO and WARNING.
SUMMARY = logging.INFO + 5
if logging.getLevelName(SUMMARY) == "Level %d" % SUMMARY:
    logging.addLevelName(SUMMARY, "SUMMARY")


def _configure_logger(verbose):
    env = os.environ.get("FUSEBOX_LOG_LEVEL", "").strip().lower()
    if env and env not in _LEVELS:
        raise ValueError("FUSEBOX_LOG_LEVEL must be one of %s, got %r"
                         % (", ".join(_LEVELS), env))
    level = _LEVELS[env] if env else (logging.INFO if verbose else SUMMARY)
    if not env and not verbose and logger.getEffectiveLevel() <= level:
        return  # the application already shows these lines: leave its setting
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)
    if not logger.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[fusebox] %(levelname)s: %(message)s"))
        logger.addHandler(handler)


def _drain_log(hook, rank):
    """Hands the hook's queued messages to the logger (Note [Messages into
    Python logging] in module.cc: they are queued on whatever thread made
    them and emitted here, on a Python thread)."""
    for level, line in hook.drain_log():
        if level >= logging.WARNING:
            line = line.replace("warning: ", "", 1)  # the level says it
        logger.log(level, "rank %d: %s", rank, line)



class Handle:
    """What ``register`` returns: the hook's plan, tuning state and statistics."""

    def __init__(self, hook, group, rank):
        self._hook = hook
        self._rank = rank
        self.process_group = group
        self._grad_hooks = None

    def snapshot(self):
        """Everything below in one dict (one consistent copy)."""
        _drain_log(self._hook, self._rank)
        return self._hook.snapshot()

    @property
    def state(self):
        """'learning' (the gradient ready order not known yet: plain allreduce
        per DDP bucket), 'profiling', 'screening', 'verifying' (tuning),
        'tuned', or 'fixed' (plan=...)."""
        return self.snapshot()["phase"]

    @property
    def plan(self):
        """The plan DDP runs (its bucket assignment): {'name', 'buckets':
        [[(parameter position in ready order, offset, count)...]...],
        'bucket_elements', 'hash'}, or None while learning."""
        return self.snapshot()["plan"]

    @property
    def layout(self):
        """Elements per parameter, in the order their gradients become ready
        (see snapshot()["names"]); empty while learning."""
        return self.snapshot()["layout"]

    @property
    def cache_hit(self):
        return self.snapshot()["cache_hit"]

    @property
    def tuning_iterations(self):
        return self.snapshot()["tuning_iterations"]

    @property
    def last_allreduce_counts(self):
        """Element counts of the allreduce calls the last fused iteration
        issued through the process group, in order (empty with
        communicator="ucx", which keeps no call log, and with "ddp", where
        DDP's own buckets are the calls)."""
        return self.snapshot()["last_allreduce_counts"]

    def stats(self):
        """Per iteration under fusebox: iteration_ms (the whole step: one
        forward start to the next), backward_ms (forward start to the last
        bucket ready), exposed_ms (communication left after it), comm_ms,
        buckets."""
        return self.snapshot()["stats"]

    @property
    def decision(self):
        """Why the plan in use was kept (the tuner's verdict, with its
        confidence bound, naming the baseline: "kept your DDP buckets
        (5 MiB)"), or '' while tuning."""
        return self.snapshot()["decision"]

    @property
    def summary(self):
        """'tuning took X s; the kept plan saves Y ms a step (Z s so far)'
        once a plan other than the user's own buckets is kept, else ''. Logged
        at the end of tuning and at exit (rank 0)."""
        return self.snapshot()["summary"]

    def write_timeline(self, path):
        """Writes this rank's timeline (chrome://tracing JSON); needs
        register(..., timeline=True)."""
        self._hook.write_timeline(os.fspath(path))

    @contextlib.contextmanager
    def paused(self):
        """Time between two training steps that is not training: evaluation,
        a checkpoint, a wait you know of. fusebox times a step from one
        forward to the next, so such time would count against the plan that
        ran before it, in tuning and in the regression checks::

            with handle.paused():
                evaluate(model)

        Use it between a step's optimizer step and the next forward, on every
        rank. Needs communicator="ddp" (the default)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._hook.exclude_from_step((time.perf_counter() - start) * 1e6)


def _group_ranks(group):
    if group is None or group == dist.GroupMember.WORLD:
        return None
    return sorted(dist.distributed_c10d._pg_group_ranks[group].keys())


def _check_devices(communicator, device_types):
    """The refusal, at registration, of parameters the chosen communicator
    cannot reduce: only communicator="ddp" (DDP reduces its own buckets, on
    whatever device they live) takes parameters that are not on the CPU."""
    others = sorted(set(device_types) - {"cpu"})
    if others and communicator != "ddp":
        raise ValueError(
            "communicator=%r reduces DDP's buckets through fusebox, which takes CPU gradients "
            "only; the model has %s parameters. Use communicator='ddp' (the default): DDP "
            "reduces its own buckets through its process group (NCCL on GPUs) on the plan "
            "fusebox chooses" % (communicator, " and ".join(others)))


def _device_sync(params):
    """What makes host time stamps at a step's start device times: a CUDA
    synchronise of the model's device (None for a CPU model). Called only at
    the step boundaries the tuner measures (Note [Timing without stalling
    the device] in autotune/tuner.h)."""
    for p in params:
        if p.is_cuda:
            device = p.device
            return lambda: torch.cuda.synchronize(device)
    return None


_CALIBRATION_WORKING_SET = 64 << 20


def _allreduce_timer(group, params, record=None):
    """The tuner's calibration through `group`, the process group DDP reduces
    its buckets on (TunerOptions::measure_allreduce in autotune/tuner.h), on
    the model's device: (sizes in bytes, reps) -> (world, [microseconds per
    size]). Per size one warm-up and `reps` timed fp32 averaging allreduces,
    each after a one-element allreduce that lines the ranks up; a
    repetition is the slowest rank's time, a size's time the median of its
    repetitions: the same figures on every rank. The calls walk a buffer as
    large as the gradients (up to 64 MiB), so that their data is out of
    cache as a bucket's is. It runs at a step boundary on the training
    thread, where DDP has no collective of its own in flight on the group.
    `record`: a list that gets (sizes, reps, times) per call (tests)."""
    device = next((p.device for p in params), torch.device("cpu"))
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def measure(sizes, reps):
        import time
        largest = max(sizes)
        working = max(largest, min(grad_bytes, _CALIBRATION_WORKING_SET))
        buf = torch.zeros((working + 3) // 4, dtype=torch.float32, device=device)
        line_up = torch.zeros(1, device=device)
        world = dist.get_world_size(group)
        times = torch.zeros(len(sizes), max(reps, 1), dtype=torch.float64, device=device)
        offset = 0
        for i, size in enumerate(sizes):
            n = size // 4
            for rep in range(reps + 1):
                if offset + n > buf.numel():
                    offset = 0
                chunk = buf[offset:offset + n]
                offset += (n + 1023) // 1024 * 1024  # the next page-aligned part
                dist.all_reduce(line_up, group=group)
                sync()
                t0 = time.perf_counter()
                dist.all_reduce(chunk, group=group)
                chunk.div_(world)
                sync()
                if rep > 0:
                    times[i, rep - 1] = (time.perf_counter() - t0) * 1e6
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
        # The median of an even count is the mean of the middle two, as the
        # C++ measurement's is (torch.median would take the lower).
        medians = [float(v) for v in times[:, :reps].quantile(0.5, dim=1).cpu()]
        if record is not None:
            record.append((list(sizes), reps, medians))
        return world, medians

    return measure


class _DisabledHandle:
    """What ``register`` returns where it registers nothing (FUSEBOX_DISABLE
    set, or a DDP fusebox declines): the model is plain DDP. `decision` says
    why."""

    state = "disabled"
    plan = None
    layout = []
    cache_hit = False
    tuning_iterations = 0
    last_allreduce_counts = []
    summary = ""
    process_group = None

    def __init__(self, why):
        self.decision = why

    def snapshot(self):
        return {"phase": self.state, "decision": self.decision}

    def stats(self):
        return []

    def write_timeline(self, path):
        raise RuntimeError("fusebox registered nothing (%s): no timeline" % self.decision)

    @contextlib.contextmanager
    def paused(self):
        yield  # nothing is timed


def _compiled(module):
    """Whether `module` is torch.compile's wrapper (torch 2.x's
    OptimizedModule; matched by name and its `_orig_mod` where torch has no
    torch._dynamo)."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule
        if isinstance(module, OptimizedModule):
            return True
    except ImportError:
        pass
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


_COMPILED = ("is compiled with torch.compile, whose DDP optimizer splits the graph at DDP's "
             "bucket boundaries as DDP was built; fusebox changes those boundaries, so it "
             "declines")


def _declined(ddp_model):
    """Why fusebox leaves this DDP alone (it then runs as plain DDP), or None.
    (A model compiled around DDP, torch.compile(ddp), is declined in register.)"""
    if getattr(ddp_model, "static_graph", False):
        return ("DDP was built with static_graph=True, which fixes its buckets after the first "
                "iteration; fusebox chooses buckets by changing them, so it declines")
    if _compiled(ddp_model.module):
        return "the module under DDP " + _COMPILED
    return None


_KEY_LABEL = re.compile(r"[A-Za-z0-9._:+-]{1,128}")


def _device_kind(params):
    """"cpu", or the accelerator's type and model: "cuda-h100-80gb-hbm3"."""
    for p in params:
        if p.device.type == "cpu":
            continue
        kind = p.device.type
        if p.is_cuda:
            name = re.sub(r"[^a-z0-9.]+", "-", torch.cuda.get_device_name(p.device).lower())
            name = re.sub(r"^(nvidia|tesla)-", "", name.strip("-"))[:40].strip("-")
            kind = "cuda-" + name if name else "cuda"
        return kind
    return "cpu"


def _key_network(network, params):
    """The cache key's network label: the user's, with what else changes the
    answer appended: the device kind the steps run on and torch's major
    version ("local+cpu+torch1", "ib-400g+cuda-h100-80gb-hbm3+torch2")."""
    major = re.sub(r"[^0-9]", "", torch.__version__.split(".", 1)[0]) or "0"
    label = "%s+%s+torch%s" % (network, _device_kind(params), major)
    if not _KEY_LABEL.fullmatch(label):
        raise ValueError("network=%r makes the cache key label %r, which must be 1-128 of "
                         "[A-Za-z0-9._:+-]" % (network, label))
    return label


def _disabled():
    value = os.environ.get("FUSEBOX_DISABLE", "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError("FUSEBOX_DISABLE must be 1/true/yes/on or 0/false/no/off, got %r" % value)


def _ddp_buckets(ddp_model):
    """The bucket cap and first bucket size (bytes) this DDP was built with:
    the user's own buckets, fusebox's baseline and fallback. Torch 1.x always
    makes the first bucket 1 MiB; newer torch makes it the cap when the user
    set bucket_cap_mb (bucket_bytes_cap_default False)."""
    cap = int(getattr(ddp_model, "bucket_bytes_cap", 25 * 1024 * 1024))
    first = int(getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1024 * 1024))
    if getattr(ddp_model, "bucket_bytes_cap_default", True) is False:
        first = cap
    return max(cap, 1), max(min(first, cap), 1)


def _check_arguments(*, plan, seed, candidates, screening_blocks, verify_pairs, check_every,
                     check_pairs, max_in_flight, min_effect, timeout_s):
    """register's checks of its own arguments (ValueError/TypeError naming the argument)."""
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                             or not 0 < seed < 2 ** 64):
        raise ValueError("seed must be None or an integer in [1, 2**64), got %r" % (seed,))
    if plan is not None and not isinstance(plan, (str, os.PathLike)):
        raise TypeError("plan must be None, 'ddp', 'per-tensor' or a plan file path")
    for name, value, low in (("candidates", candidates, 0),
                             ("screening_blocks", screening_blocks, 1),
                             ("verify_pairs", verify_pairs, 5), ("check_every", check_every, 0),
                             ("check_pairs", check_pairs, 1), ("max_in_flight", max_in_flight, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError("%s must be an integer >= %d, got %r" % (name, low, value))
    if verify_pairs > 256:
        raise ValueError("verify_pairs must be at most 256, got %r" % (verify_pairs,))
    if not (isinstance(min_effect, (int, float)) and 0 <= min_effect < 1):
        raise ValueError("min_effect must be in [0, 1), got %r" % (min_effect,))
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 86400):
        raise ValueError("timeout_s must be in (0, 86400], got %r" % (timeout_s,))


def _communicator_group(ddp_model, communicator, process_group):
    """(group, store, backend) for register's `communicator`: the group fusebox
    agrees (or reduces) over, the store the UCX communicator bootstraps from
    (None otherwise), and the backend family the cache key names."""
    store = None
    # The backend family the cache key names: DDP's process group's, also
    # where fusebox's own agreements go through gloo.
    backend = "unknown"
    if communicator in ("ddp", "process_group"):
        group = process_group
        ddp_group = ddp_model.process_group
        if communicator == "ddp":
            backend = "torch-" + str(dist.get_backend(ddp_group))
        if group is None:
            group = dist.new_group(
                ranks=_group_ranks(ddp_group),
                backend="gloo" if communicator == "ddp" else dist.get_backend(ddp_group))
    elif communicator == "ucx":
        if process_group is not None:
            raise ValueError("process_group applies to communicator='process_group' only")
        group = ddp_model.process_group
        if _group_ranks(group) is not None:
            raise ValueError("communicator='ucx' needs DDP over the default process group "
                             "(its ranks are the store's ranks)")
        store = dist.distributed_c10d._get_default_store()
    elif communicator == "nccl":
        raise ValueError("communicator='nccl' is not available yet: fusebox's own NCCL path "
                         "through DDP's buckets is not built. For a model on GPUs use "
                         "communicator='ddp' (the default): DDP reduces through NCCL on the plan "
                         "fusebox chooses (see plugins/torch/README.md, Known gaps)")
    else:
        raise ValueError("communicator must be 'ddp', 'process_group' or 'ucx', got %r"
                         % (communicator,))
    return group, store, backend


def register(ddp_model, *, cache_dir=None, plan=None, communicator="ddp",
             process_group=None, network="local",
             ranks_per_node=None, candidates=2, screening_blocks=2, verify_pairs=36,
             min_effect=0.0, check_every=5, check_pairs=1, max_in_flight=4, timeout_s=300.0,
             timeline=False, verbose=False, seed=None):
    """Registers the fusebox communication hook on a DistributedDataParallel model.

    Call it on every rank, after constructing DDP and before the first backward.
    With FUSEBOX_DISABLE=1 in the environment it registers nothing and returns
    a handle whose state is 'disabled': the script runs as plain DDP.

    The baseline is the DDP you built: its bucket_cap_mb (and DDP's first
    bucket). fusebox keeps another plan only when it is faster than yours with
    95% confidence, falls back to yours when checks find the kept plan 3%
    slower, and names yours in handle.decision.

    cache_dir: the policy cache (default: $FUSEBOX_CACHE_DIR, else
        $XDG_CACHE_HOME/fusebox, else ~/.cache/fusebox, as for every fusebox
        tool); False disables it. A cluster size seen before is not tuned
        again, also when `fusebox-tune --cache` or `fusebox-cache import`
        put the entry there (same model, world size, ranks per node, backend
        family and network).
    plan: None to tune; or a fixed plan: "ddp", "per-tensor", or a plan JSON file.
    communicator: what reduces DDP's buckets. "ddp" (default): DDP itself,
        through its own process group; fusebox registers no communication
        hook (so another hook, if the model has one, keeps reducing) and
        only chooses the buckets. "ucx": a communication hook reduces each
        bucket through fusebox's UCX communicator (shared memory on one host,
        TCP or RDMA between hosts), bootstrapped from torch's own store; DDP
        must span the default group. "process_group": a communication hook
        reduces through a torch process group (see process_group).
    process_group: with communicator="process_group", the group fusebox
        reduces through; with "ddp", the group the tuner agrees over
        (a few bytes between steps, host tensors). Default: a new group over
        DDP's ranks (fusebox's collectives must not interleave with DDP's own
        on one group): of DDP's backend for "process_group", of gloo for
        "ddp" (the agreements are host tensors, which NCCL does not take).

    GPUs: with communicator="ddp" the model may live on a GPU (DDP over
    NCCL): DDP reduces its own buckets and fusebox chooses them. fusebox
    synchronises the model's device only at the step boundaries it measures
    (while tuning, and around each check step after the decision), so that
    those step times are the device's; every other step runs ahead as it
    would without fusebox. The other communicators take CPU models only and
    refuse others here.
    network: names the network in the cache key (e.g. "ib-400g", "25gbe"); the
        key's label adds the device kind and torch's major version
        ("ib-400g+cuda-h100+torch2"), which change the answer too. An entry
        stored by fusebox-tune --cache is found under the same full label.
    ranks_per_node: default $LOCAL_WORLD_SIZE, else all ranks on one node.
    candidates: the planner's plans measured besides your buckets, DDP's
        default (25 MiB) and the hand-set caps (1, 5, 100 MiB).
    screening_blocks: randomised blocks that run every candidate once (after
        one unmeasured warm-up visit of each).
    verify_pairs: interleaved rounds of your buckets, the best candidate and
        the runner-up of screening, at most (5 to 256): your buckets are
        replaced only by a candidate faster with 95% confidence over both
        (a signed-rank bound on its median paired gain: 98% each at the end,
        99.9% at a look every 6 rounds, where a clear winner ends
        verification early) and by more than min_effect (a fraction of the
        iteration time; 0: any gain), and of two such the faster in the same
        rounds is kept. A candidate that shows no gain at a look is dropped,
        and verification ends when none is left (Note [Stopping
        verification early] in autotune/decision.h).
    check_every, check_pairs: after the decision, one iteration of your
        buckets every check_every iterations or more (as many as keep the
        checks under 1% of the run's time; 0: never check), paired with the
        next iteration of the kept plan; the ranks share the pairs every
        check_pairs pairs, and a sequential test on them falls back to your
        buckets once the kept plan is 3% slower than them (Note [Catching
        small regressions] in autotune/regression.h).
    max_in_flight: fused allreduces in flight at once.
    timeout_s: the longest wait for any one iteration's communication, for the rendezvous, and
        for each collective (a stuck one fails naming the rank it waited for).
    timeline: record a timeline (see Handle.write_timeline; not with
        communicator="ddp", where DDP reduces).
    seed: the tuner's random order; None draws a fresh one per run, logged at
        INFO (and in handle.snapshot()["seed"]) so that a run can be replayed.
    verbose: log the tuner's progress at INFO on the "fusebox" logger (and
        print it on stderr when the application configured no logging).
        FUSEBOX_LOG_LEVEL=info does the same without changing the script.
        Warnings (an unusable cache directory, a plan rolled back) are
        logged at WARNING either way.
    """
    if _compiled(ddp_model) and isinstance(getattr(ddp_model, "_orig_mod", None),
                                           DistributedDataParallel):
        _configure_logger(verbose)
        why = "the DDP model " + _COMPILED
        logger.warning("fusebox.torch.register: %s; the model runs as plain DDP", why)
        return _DisabledHandle(why + "; plain DDP")
    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError("fusebox.torch.register expects a torch.nn.parallel."
                        "DistributedDataParallel model, got %s" % type(ddp_model).__name__)
    if _disabled():
        _configure_logger(verbose)
        logger.info("FUSEBOX_DISABLE is set: not registering; the model runs as plain DDP")
        return _DisabledHandle("fusebox is disabled (FUSEBOX_DISABLE): plain DDP")
    why = _declined(ddp_model)
    if why is not None:
        _configure_logger(verbose)
        logger.warning("fusebox.torch.register: %s; the model runs as plain DDP", why)
        return _DisabledHandle(why + "; plain DDP")
    if getattr(ddp_model, "_fusebox_handle", None) is not None:
        raise RuntimeError("fusebox.torch.register: this DistributedDataParallel model already "
                           "has the fusebox hook (register once per model)")
    if not dist.is_initialized():
        raise RuntimeError("fusebox.torch.register: torch.distributed is not initialized")
    _check_arguments(plan=plan, seed=seed, candidates=candidates,
                     screening_blocks=screening_blocks, verify_pairs=verify_pairs,
                     check_every=check_every, check_pairs=check_pairs,
                     max_in_flight=max_in_flight, min_effect=min_effect, timeout_s=timeout_s)
    if cache_dir is None:
        # The one default of every fusebox tool (autotune::DefaultCacheDir).
        cache_dir = _C._default_cache_dir()
    elif cache_dir is False:
        cache_dir = ""
    if ranks_per_node is None:
        ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    names, params = _reducer_parameters(ddp_model)
    _check_devices(communicator, (p.device.type for p in params))
    group, store, backend = _communicator_group(ddp_model, communicator, process_group)
    options = {
        "plan": os.fspath(plan) if plan is not None else "",
        "cache_dir": os.fspath(cache_dir),
        "network": _key_network(str(network), params),
        "ranks_per_node": int(ranks_per_node),
        "model_label": type(ddp_model.module).__name__,
        "candidates": candidates,
        "screening_blocks": screening_blocks,
        "verify_pairs": verify_pairs,
        "min_effect": float(min_effect),
        "check_every": check_every,
        "check_pairs": check_pairs,
        "max_in_flight": max_in_flight,
        "timeout_s": float(timeout_s),
        "timeline": bool(timeline),
        "verbose": bool(verbose),
        "communicator": communicator,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "backend": backend,
    }
    options["baseline_cap_bytes"], options["baseline_first_bucket_bytes"] = _ddp_buckets(
        ddp_model)
    if seed is not None:
        options["seed"] = seed
    calibration = []
    if communicator == "ddp":
        # The cost model is fitted on the group DDP reduces through (NCCL on
        # GPUs), not on the gloo side group fusebox agrees over.
        options["measure_allreduce"] = _allreduce_timer(ddp_model.process_group, params,
                                                        calibration)
        options["measured_on"] = "DDP's process group (%s)" % backend
    _configure_logger(verbose)
    device_sync = _device_sync(params)
    rank = dist.get_rank(group) if group is not None else dist.get_rank()
    hook = _C._register(ddp_model.reducer, group, options, store, params, names)
    handle = Handle(hook, group, rank)
    handle._calibration = calibration  # what the tuner measured through DDP's group (tests)
    _drain_log(hook, rank)

    def forward_start(module, inputs):
        # The training step starts here: the hook closes the last one and may
        # install another plan in DDP before DDP's forward runs. The device
        # is synchronised only where the tuner measures this boundary.
        if torch.is_grad_enabled() and module.require_backward_grad_sync:
            if device_sync is not None and hook.times_next_boundary():
                device_sync()
            hook.on_forward_start()
            _drain_log(hook, rank)
            if not handle._summary_logged and rank == 0:
                line = hook.summary_line()
                if line:
                    handle._summary_logged = True
                    logger.log(SUMMARY, "rank %d: %s", rank, line)
            if handle._grad_hooks is not None:
                handle._grad_hooks.update()

    handle._summary_logged = False
    # At exit, the line again (with the time saved by then), without keeping
    # the hook alive: the handler holds the handle weakly and is dropped
    # with it.
    ref = weakref.ref(handle)

    def at_exit():
        h = ref()
        line = h._hook.summary_line() if h is not None else ""
        if line and rank == 0:
            logger.log(SUMMARY, "rank %d: at exit: %s", rank, line)

    atexit.register(at_exit)
    weakref.finalize(handle, atexit.unregister, at_exit)

    handle._pre_hook = ddp_model.register_forward_pre_hook(forward_start)
    if communicator == "ddp":
        handle._grad_hooks = _GradHooks(hook, params)
        handle._grad_hooks.update()
    ddp_model._fusebox_handle = handle
    return handle


class _GradHooks:
    """Tensor hooks that tell fusebox when each gradient is ready (the native
    path, where DDP reduces): on every parameter while the ready order and
    the tuner's profile are learned, on the first and the last to be ready
    afterwards (one backward's start and end). The last one's hook also
    marks where the step's communication ends: DDP queues the autograd
    callback that waits for every bucket's allreduce after this hook runs
    (once the gradient is accumulated and its last bucket is ready), and
    callbacks run in the order they were queued, so this hook queues a
    callback that queues the mark: it runs after DDP's."""

    def __init__(self, hook, params):
        self._hook, self._params = hook, params
        self._version, self._handles = None, []

    def update(self):
        version, wanted = self._hook.grad_hooks()
        if version == self._version:
            return
        for h in self._handles:
            h.remove()
        ready, last = self._hook.on_grad_ready, self._hook.last_ready_param()
        done = self._hook.on_backward_end
        queue = torch.autograd.Variable._execution_engine.queue_callback

        def last_ready(grad, i):
            ready(i)
            queue(lambda: queue(done))

        self._handles = [self._params[i].register_hook(
            (lambda grad, i=i: last_ready(grad, i)) if i == last else
            (lambda grad, i=i: ready(i))) for i in wanted]
        self._version = version


def _reducer_parameters(ddp_model):
    """DDP's reducer parameters, in its order, with their names: what
    DistributedDataParallel._build_params_for_reducer lists (parameters that
    require grad, not ignored, each once)."""
    ignore = getattr(ddp_model, "parameters_to_ignore", ())
    seen, names, params = set(), [], []
    for module_name, module in ddp_model.module.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            full = "%s.%s" % (module_name, param_name) if module_name else param_name
            if not param.requires_grad or full in ignore or param in seen:
                continue
            seen.add(param)
            names.append(full)
            params.append(param)
    return names, params
