"""Launchers, end to end: an unmodified DDP training script (env:// rendezvous) under
fusebox-run; a DDP script with the hook under mpirun and under torchrun's environment; and
fusebox's own tools under torchrun's environment, where torch's agent store already holds
MASTER_PORT (reproduced by hand, as torch's elastic agent sets it: Debian's torchrun 1.13 itself
fails on Python 3.11).
"""
import os
import shutil
import subprocess
import sys

import pytest

from ports import free_port

PYDIR = os.environ.get("FUSEBOX_PYTHON_DIR")
RUN = os.environ.get("FUSEBOX_RUN")
PERF = os.environ.get("FUSEBOX_PERF")

pytestmark = pytest.mark.skipif(not (PYDIR and RUN and PERF),
                                reason="FUSEBOX_PYTHON_DIR, FUSEBOX_RUN, FUSEBOX_PERF not set")

# What a user writes: no fusebox-specific rendezvous, torch's env:// defaults.
TRAIN = r'''
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import fusebox.torch
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
handle = fusebox.torch.register(model, cache_dir=False, candidates=0, screening_blocks=1,
                                verify_pairs=5)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(12):
    g = torch.Generator().manual_seed(100 * step + dist.get_rank())
    opt.zero_grad()
    model(torch.randn(8, 16, generator=g)).sum().backward()
    opt.step()
# Every rank holds the same parameters after training (DDP averaged them).
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, flat)
assert all(torch.equal(gathered[0], t) for t in gathered), "ranks diverged"
print("TRAINED rank", dist.get_rank(), "of", dist.get_world_size(), "phase", handle.state,
      "MASTER_PORT", os.environ["MASTER_PORT"], "store", os.environ["FUSEBOX_STORE_PORT"])
'''



def test_fusebox_run_starts_an_unmodified_ddp_script():
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=PYDIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([RUN, "-n", "2", "--timeout", "240", "--", sys.executable, "-c", TRAIN],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for r in (0, 1):
        assert "TRAINED rank %d of 2 phase" % r in p.stdout, p.stdout
    # torch's port and fusebox's store's are different ports.
    line = [l for l in p.stdout.splitlines() if "TRAINED rank 0" in l][0].split()
    assert line[line.index("MASTER_PORT") + 1] != line[line.index("store") + 1]


def run_under_torchruns_agent_store(cmd, timeout, **extra_env):
    """Runs `cmd` as 2 workers in the environment torchrun's elastic agent gives them (as
    torch's _start_workers sets it), with the agent's TCPStore on MASTER_PORT; returns
    [(returncode, output)] by rank."""
    import torch.distributed as dist
    from datetime import timedelta
    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=60),
                          wait_for_workers=False)
    try:
        procs = []
        for r in range(2):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                       LOCAL_WORLD_SIZE="2", GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
                       TORCHELASTIC_RUN_ID="fusebox-test", TORCHELASTIC_RESTART_COUNT="0",
                       TORCHELASTIC_MAX_RESTARTS="0", **extra_env)
            for k in ("FUSEBOX_STORE_ADDR", "FUSEBOX_STORE_PORT", "FUSEBOX_AGENT_STORE"):
                env.pop(k, None)
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
        return [(p.returncode, out) for p, out in zip(procs, outs)]
    finally:
        del agent


def test_fusebox_tools_run_under_torchruns_agent_store():
    """torchrun's agent hosts torch's TCPStore on MASTER_PORT and tells the workers so
    (TORCHELASTIC_USE_AGENT_STORE=True); fusebox-perf must not try to host its own
    store there."""
    results = run_under_torchruns_agent_store(
        [PERF, "allreduce", "-b", "8", "-e", "64K", "-f", "64", "-n", "3", "-w", "1",
         "--launch", "0"], timeout=180)
    for rc, out in results:
        assert rc == 0, out[-3000:]
    assert "Out of bounds values : 0 OK" in results[0][1], results[0][1]


# A DDP script with the hook that trains twice, plain and hooked, and checks that the two agree
# bit for bit. Under mpirun it takes its rank and world from OpenMPI's variables (torch does not
# read them) and MASTER_ADDR/MASTER_PORT from `mpirun -x`; fusebox must not mistake the OpenMPI
# environment for a launch of its own: communicator="ucx" bootstraps from torch's store.
TRAIN_HOOKED = r'''
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import fusebox.torch
if "RANK" not in os.environ:  # under mpirun
    os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
    os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
dist.init_process_group("gloo")
communicator = sys.argv[1]

def train(hooked):
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4)), bucket_cap_mb=0.001)
    if hooked:
        fusebox.torch.register(model, cache_dir=False, communicator=communicator,
                               candidates=0, screening_blocks=1, verify_pairs=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(12):
        # Integer-valued data and weights scaled so that sums are exact in float32.
        g = torch.Generator().manual_seed(100 * step + dist.get_rank())
        opt.zero_grad()
        model(torch.randint(-4, 5, (8, 16), generator=g).float()).sum().backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])

plain = train(False)
fused = train(True)
gathered = [torch.zeros_like(fused) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, fused)
assert all(torch.equal(gathered[0], t) for t in gathered), "ranks diverged"
assert torch.equal(plain, fused), "the hook changed the result: max |diff| %g" % (
    (plain - fused).abs().max().item())
sys.stdout.write("TRAINED %s rank %d of %d\n" % (communicator, dist.get_rank(),
                                                  dist.get_world_size()))
sys.stdout.flush()
'''


@pytest.mark.parametrize("communicator", ["ddp", "ucx"])
def test_a_ddp_script_with_the_hook_under_torchruns_agent_store(communicator):
    """torch's env:// joins the agent's store, and the hook (communicator="ucx" bootstraps
    from that store) trains bit for bit like plain DDP."""
    results = run_under_torchruns_agent_store(
        [sys.executable, "-c", TRAIN_HOOKED, communicator], timeout=240, OMP_NUM_THREADS="1",
        PYTHONPATH=PYDIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for r, (rc, out) in enumerate(results):
        assert rc == 0, out[-3000:]
        assert "TRAINED %s rank %d of 2" % (communicator, r) in out, out


@pytest.mark.parametrize("communicator", ["ddp", "ucx"])
def test_a_ddp_script_with_the_hook_under_mpirun(communicator):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun")
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()),
               PYTHONPATH=PYDIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "FUSEBOX_STORE_ADDR", "FUSEBOX_STORE_PORT",
              "FUSEBOX_AGENT_STORE"):
        env.pop(k, None)
    p = subprocess.run([mpirun, "-np", "2", "--oversubscribe", "-x", "MASTER_ADDR", "-x",
                        "MASTER_PORT", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
                        sys.executable, "-c", TRAIN_HOOKED, communicator],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for r in (0, 1):
        assert "TRAINED %s rank %d of 2" % (communicator, r) in p.stdout, p.stdout
