"""fusebox as a PyTorch DDP communication hook: one line in a training script.

    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=1)
    handle = fusebox.torch.register(model)   # every rank, before the first backward
    ...train as usual...
    print(handle.state, handle.plan["bucket_elements"], handle.stats()[-1])

The hook learns DDP's bucket layout in the first iterations (DDP rebuilds its
buckets after the first one), then tunes the bucket plan online for this model
and world size (or applies the plan the policy cache remembers), and reduces
every later iteration through the fusebox engine. Small DDP buckets are
coalesced and large ones split: set ``bucket_cap_mb`` small to let fusebox
decide the whole layout. Results match plain DDP's (bit for bit on two ranks).
"""
import os

import torch  # loads libtorch before the extension
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import _C

__all__ = ["register", "Handle"]

_DEFAULT_CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "fusebox")


class Handle:
    """What ``register`` returns: the hook's plan, tuning state and statistics."""

    def __init__(self, hook, group):
        self._hook = hook
        self.process_group = group

    def snapshot(self):
        """Everything below in one dict (one consistent copy)."""
        return self._hook.snapshot()

    @property
    def state(self):
        """'learning' (DDP's bucket layout not known yet: plain allreduce per
        DDP bucket), 'measuring' (tuning), 'tuned', or 'fixed' (plan=...)."""
        return self.snapshot()["phase"]

    @property
    def plan(self):
        """The plan in use: {'name', 'buckets': [[(ddp_bucket, offset, count)...]...],
        'bucket_elements', 'hash'}, or None while learning."""
        return self.snapshot()["plan"]

    @property
    def layout(self):
        """Elements per DDP bucket, as fusebox sees them."""
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
        communicator="ucx", which keeps no call log)."""
        return self.snapshot()["last_allreduce_counts"]

    def stats(self):
        """Per fused iteration: iteration_ms (first DDP bucket ready to all
        reduced), backward_ms, exposed_ms (communication left after the last
        bucket was ready), comm_ms, copy_in_ms, copy_back_ms, buckets."""
        return self.snapshot()["stats"]

    def write_timeline(self, path):
        """Writes this rank's timeline (chrome://tracing JSON); needs
        register(..., timeline=True)."""
        self._hook.write_timeline(os.fspath(path))


def _group_ranks(group):
    if group is None or group == dist.GroupMember.WORLD:
        return None
    return sorted(dist.distributed_c10d._pg_group_ranks[group].keys())


def register(ddp_model, *, cache_dir=None, plan=None, communicator="process_group",
             process_group=None, network="local",
             ranks_per_node=None, candidates=4, warmup_iterations=1, measure_iterations=5,
             drift_window=50, max_in_flight=4, timeout_s=300.0, timeline=False, verbose=False):
    """Registers the fusebox communication hook on a DistributedDataParallel model.

    Call it on every rank, after constructing DDP and before the first backward.

    cache_dir: the policy cache (default: $FUSEBOX_CACHE_DIR, else
        ~/.cache/fusebox); False disables it. A cluster size seen before is not
        tuned again.
    plan: None to tune; or a fixed plan: "ddp", "per-tensor", or a plan JSON file.
    communicator: what fusebox reduces through. "process_group" (default): a
        torch process group (see process_group). "ucx": fusebox's UCX
        communicator (shared memory on one host, TCP or RDMA between hosts),
        bootstrapped from torch's own store; DDP must span the default group.
    process_group: with communicator="process_group", the group fusebox
        reduces through. Default: a new group of DDP's backend over DDP's
        ranks (fusebox's collectives must not interleave with DDP's own on
        one group).
    network: names the network in the cache key (e.g. "ib-400g", "25gbe").
    ranks_per_node: default $LOCAL_WORLD_SIZE, else all ranks on one node.
    candidates, warmup_iterations, measure_iterations: tuning effort (plans
        measured besides DDP's default; iterations per plan).
    drift_window: iterations per drift check (0: never retune).
    max_in_flight: fused allreduces in flight at once.
    timeout_s: the longest wait for any one iteration's communication, for the rendezvous, and
        for each collective (a stuck one fails naming the rank it waited for).
    timeline: record a timeline (see Handle.write_timeline).
    verbose: print the tuner's progress on stderr.
    """
    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError("fusebox.torch.register expects a torch.nn.parallel."
                        "DistributedDataParallel model, got %s" % type(ddp_model).__name__)
    if getattr(ddp_model, "_fusebox_handle", None) is not None:
        raise RuntimeError("fusebox.torch.register: this DistributedDataParallel model already "
                           "has the fusebox hook (register once per model)")
    if not dist.is_initialized():
        raise RuntimeError("fusebox.torch.register: torch.distributed is not initialized")
    if plan is not None and not isinstance(plan, (str, os.PathLike)):
        raise TypeError("plan must be None, 'ddp', 'per-tensor' or a plan file path")
    for name, value, low in (("candidates", candidates, 0), ("warmup_iterations", warmup_iterations, 0),
                             ("measure_iterations", measure_iterations, 1),
                             ("drift_window", drift_window, 0), ("max_in_flight", max_in_flight, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError("%s must be an integer >= %d, got %r" % (name, low, value))
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 86400):
        raise ValueError("timeout_s must be in (0, 86400], got %r" % (timeout_s,))
    if cache_dir is None:
        cache_dir = os.environ.get("FUSEBOX_CACHE_DIR") or _DEFAULT_CACHE
    elif cache_dir is False:
        cache_dir = ""
    if ranks_per_node is None:
        ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    store = None
    if communicator == "process_group":
        group = process_group
        if group is None:
            ddp_group = ddp_model.process_group
            group = dist.new_group(ranks=_group_ranks(ddp_group),
                                   backend=dist.get_backend(ddp_group))
    elif communicator == "ucx":
        if process_group is not None:
            raise ValueError("process_group applies to communicator='process_group' only")
        group = ddp_model.process_group
        if _group_ranks(group) is not None:
            raise ValueError("communicator='ucx' needs DDP over the default process group "
                             "(its ranks are the store's ranks)")
        store = dist.distributed_c10d._get_default_store()
    elif communicator == "nccl":
        raise ValueError("communicator='nccl' is not available yet: the hook takes CPU "
                         "gradients only (see plugins/torch/README.md, Known gaps)")
    else:
        raise ValueError("communicator must be 'process_group' or 'ucx', got %r"
                         % (communicator,))
    options = {
        "plan": os.fspath(plan) if plan is not None else "",
        "cache_dir": os.fspath(cache_dir),
        "network": str(network),
        "ranks_per_node": int(ranks_per_node),
        "model_label": type(ddp_model.module).__name__,
        "candidates": candidates,
        "warmup_iterations": warmup_iterations,
        "measure_iterations": measure_iterations,
        "drift_window": drift_window,
        "max_in_flight": max_in_flight,
        "timeout_s": float(timeout_s),
        "timeline": bool(timeline),
        "verbose": bool(verbose),
        "communicator": communicator,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
    }
    hook = _C._register(ddp_model.reducer, group, options, store)
    handle = Handle(hook, group)
    ddp_model._fusebox_handle = handle
    return handle
