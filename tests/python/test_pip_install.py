"""`pip install .` end to end: a fresh virtual environment over the system
Python (its torch visible), an offline install of this source tree (setup.py
drives CMake and compiles fusebox.torch._C), then, from that environment only:
the imports, fusebox.__version__ against CMakeLists.txt, the installed
module's linkage, the console script fusebox-record-profile, and 2 ranks of
DDP (gloo, CPU) training with fusebox.torch.register ending with identical
parameters.

Slow (a full compile of the module and what it links): skipped unless
FUSEBOX_PIP_TEST=1.

    FUSEBOX_PIP_TEST=1 /usr/bin/python3 -m pytest -q tests/python/test_pip_install.py

FUSEBOX_SYSTEM_PYTHON: the Python that makes the venv (default /usr/bin/python3).
FUSEBOX_PIP_BUILD_BASE: setup.py's build directory (default: a fresh one
under pytest's temporary directory; name a lasting one to rebuild only what
changed on the next run).
CMAKE_BUILD_PARALLEL_LEVEL: compile jobs (default 2).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from ports import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SYSTEM_PYTHON = os.environ.get("FUSEBOX_SYSTEM_PYTHON") or "/usr/bin/python3"
INSTALL_TIMEOUT_S = 3600
RUN_TIMEOUT_S = 300
DDP_STEPS = 12

pytestmark = pytest.mark.skipif(
    os.environ.get("FUSEBOX_PIP_TEST") != "1",
    reason="slow: compiles fusebox.torch._C in a fresh venv (pip install .); "
           "set FUSEBOX_PIP_TEST=1 to run it")


def cmake_project_version():
    with open(os.path.join(REPO, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"^\s*project\s*\(\s*fusebox\s[^)]*?\bVERSION\s+([0-9.]+)", f.read(),
                      re.MULTILINE | re.IGNORECASE)
    assert m, "no project(fusebox VERSION ...) in CMakeLists.txt"
    return m.group(1)



def clean_env(**extra):
    """The environment without anything that would find fusebox elsewhere
    (PYTHONPATH, a user site) or let pip go online."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
    env.update(PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1",
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(extra)
    return env


def tail(text, n=6000):
    return text if len(text) <= n else "...\n" + text[-n:]


class Installed:
    def __init__(self, venv, work, build_base, seconds, log):
        self.venv, self.work, self.build_base = venv, work, build_base
        self.seconds, self.log = seconds, log
        self.python = os.path.join(venv, "bin", "python")

    def run(self, args, timeout=RUN_TIMEOUT_S, **env):
        """Runs args with the venv's bin/ first on PATH, from a directory
        outside the source tree, PYTHONPATH cleared."""
        path = os.path.join(self.venv, "bin") + os.pathsep + os.environ.get("PATH", "")
        return subprocess.run(args, cwd=self.work, env=clean_env(PATH=path, **env),
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("pip-install"))
    venv = os.path.join(base, "venv")
    work = os.path.join(base, "work")
    os.makedirs(work)
    own_build = not os.environ.get("FUSEBOX_PIP_BUILD_BASE")
    build_base = os.environ.get("FUSEBOX_PIP_BUILD_BASE") or os.path.join(base, "build")
    p = subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", venv],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, "venv failed:\n" + tail(p.stdout + p.stderr)

    env = clean_env(FUSEBOX_BUILD_BASE=build_base)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    log_path = os.path.join(base, "pip-install.log")
    cmd = [os.path.join(venv, "bin", "pip"), "install", "-v", "--no-build-isolation",
           "--no-deps", REPO]
    start = time.monotonic()
    with open(log_path, "w") as log:
        # A session of its own: on a timeout the compilers go too.
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    seconds = time.monotonic() - start
    with open(log_path, errors="replace") as f:
        log = f.read()
    if rc != 0:
        pytest.fail("%s after %.0f s: %s\n--- pip output (tail; whole log: %s) ---\n%s"
                    % ("pip install timed out" if rc is None else "pip install exited %d" % rc,
                       seconds, " ".join(cmd), log_path, tail(log)))
    yield Installed(venv, work, build_base, seconds, log)
    if own_build:
        shutil.rmtree(build_base, ignore_errors=True)  # the CMake tree and its objects


def test_install_succeeds(installed, capsys):
    with capsys.disabled():
        print("\n[test_pip_install] pip install --no-build-isolation . took %.0f s"
              % installed.seconds)
    assert "Successfully installed fusebox-" in installed.log, tail(installed.log)


PROBE = r'''
import importlib.metadata, json, os
import fusebox, fusebox.torch, fusebox.record_profile
print(json.dumps({"version": fusebox.__version__,
                  "dist_version": importlib.metadata.version("fusebox"),
                  "fusebox": fusebox.__file__,
                  "ext": fusebox.torch._C.__file__,
                  "record_profile": fusebox.record_profile.__file__,
                  "register": callable(fusebox.torch.register)}))
'''


def probe(installed):
    p = installed.run([installed.python, "-c", PROBE])
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_imports_come_from_the_venv_and_version_is_cmakes(installed):
    info = probe(installed)
    venv = os.path.realpath(installed.venv)
    for key in ("fusebox", "ext", "record_profile"):
        assert os.path.realpath(info[key]).startswith(venv + os.sep), (key, info[key])
    assert info["register"]
    version = cmake_project_version()
    assert info["version"] == version, (info["version"], version)
    assert info["dist_version"] == version, (info["dist_version"], version)


def test_installed_extension_links(installed):
    ext = probe(installed)["ext"]
    if not shutil.which("ldd"):
        pytest.skip("no ldd")
    p = subprocess.run(["ldd", ext], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "not found" not in p.stdout, p.stdout
    assert re.search(r"libtorch_python\.so", p.stdout), p.stdout
    if shutil.which("readelf"):
        d = subprocess.run(["readelf", "-d", ext], capture_output=True, text=True,
                           timeout=60).stdout
        # Nothing points back into the build tree (it may be deleted).
        for line in d.splitlines():
            if "RPATH" in line or "RUNPATH" in line:
                for tree in (REPO, installed.build_base, os.path.dirname(installed.work)):
                    assert tree not in line, line


def test_console_script_records_a_profile(installed):
    script = os.path.join(installed.venv, "bin", "fusebox-record-profile")
    assert os.access(script, os.X_OK), script
    p = installed.run([script, "--help"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "usage: fusebox-record-profile" in p.stdout, p.stdout
    out = os.path.join(installed.work, "mlp.json")
    p = installed.run([script, "--model", "mlp", "--batch", "4", "--iterations", "2",
                       "--warmup", "0", "--threads", "1", "-o", out])
    assert p.returncode == 0, p.stdout + p.stderr
    with open(out) as f:
        profile = json.load(f)
    assert profile["format"] == "fusebox-profile" and profile["model"] == "mlp"
    assert [t["name"] for t in profile["tensors"]][:2] in (["fc3.weight", "fc3.bias"],
                                                           ["fc3.bias", "fc3.weight"])


WORKER = r'''
import hashlib, json, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import fusebox, fusebox.torch

def digest(module):
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
torch.manual_seed(0)  # same initial weights on every rank
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                          torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
model = DDP(net)
initial = digest(model)
handle = fusebox.torch.register(model, cache_dir=False)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(1000 + rank)  # different batches per rank
for step in range(int(sys.argv[1])):
    x, y = torch.randn(8, 16, generator=data), torch.randn(8, 4, generator=data)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print("RESULT " + json.dumps({"rank": rank, "initial": initial, "final": digest(model),
                              "state": handle.state, "fusebox": fusebox.__file__}))
dist.destroy_process_group()
'''


def test_two_rank_ddp_training_with_the_hook(installed):
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2",
               LOCAL_WORLD_SIZE="2")
    path = os.path.join(installed.venv, "bin") + os.pathsep + os.environ.get("PATH", "")
    procs = []
    for rank in range(2):
        procs.append(subprocess.Popen(
            [installed.python, "-c", WORKER, str(DDP_STEPS)], cwd=installed.work,
            env=clean_env(PATH=path, RANK=str(rank), LOCAL_RANK=str(rank), **env),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=RUN_TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("DDP ranks hung (> %d s)" % RUN_TIMEOUT_S)
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, "rank %d exited %d:\n%s" % (rank, p.returncode, tail(out))
    results = [json.loads(out.split("RESULT ", 1)[1].splitlines()[0]) for out in outs]
    venv = os.path.realpath(installed.venv)
    for res in results:
        assert os.path.realpath(res["fusebox"]).startswith(venv + os.sep), res
        assert res["final"] != res["initial"], "the parameters did not change"
        # Past the two learning steps, the hook is profiling or tuning.
        assert res["state"] in ("profiling", "screening", "verifying", "tuned"), res
    assert results[0]["initial"] == results[1]["initial"]
    assert results[0]["final"] == results[1]["final"], "ranks' parameters differ: %s" % results
