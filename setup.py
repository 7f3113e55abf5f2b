"""Builds the Python package `fusebox` with CMake (metadata: pyproject.toml).

    /usr/bin/python3 -m pip install --no-build-isolation .      # in a venv (see below)

The compiled module fusebox.torch._C is the CMake target fusebox_torch_python
(plugins/torch/CMakeLists.txt), built against the torch that this Python
imports and the LibTorch CMake package next to it (Debian: libtorch-dev).
setup.py configures the whole project into <build_temp>/cmake (tests off) and
builds that one target and what it links; the .so is then copied into the
package. The version is read from the top-level CMakeLists.txt
(project(fusebox VERSION x.y.z)) and written into the package as
fusebox/_version.py.

Environment:
  FUSEBOX_BUILD_BASE          setuptools' build directory (default: build-pip/ in
                              the source tree; the CMake tree is under it, so a
                              second install rebuilds only what changed)
  CMAKE_BUILD_PARALLEL_LEVEL  parallel compile jobs (default 2; build_ext -j wins)
  FUSEBOX_CMAKE_BUILD_TYPE    default Release
  FUSEBOX_CMAKE_ARGS          extra arguments for the CMake configure step
  CMAKE                       the cmake executable (default: cmake on PATH)
  CMAKE_GENERATOR             default Ninja when ninja is on PATH
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.egg_info import egg_info

ROOT = os.path.dirname(os.path.abspath(__file__))
# setuptools wants package_dir relative to the directory of setup.py.
PY_SRC = "plugins/torch/python"


def project_version():
    """x.y.z from `project(fusebox VERSION x.y.z ...)` in CMakeLists.txt."""
    path = os.path.join(ROOT, "CMakeLists.txt")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^\s*project\s*\(\s*fusebox\s[^)]*?\bVERSION\s+([0-9]+(?:\.[0-9]+)*)",
                  text, re.MULTILINE | re.IGNORECASE)
    if not m:
        raise RuntimeError("%s has no 'project(fusebox VERSION x.y.z ...)' line" % path)
    return m.group(1)


VERSION = project_version()

# Not build/: that is where scripts/build.sh keeps the CMake build.
BUILD_BASE = os.path.abspath(os.environ.get("FUSEBOX_BUILD_BASE")
                             or os.path.join(ROOT, "build-pip"))


def _cache_entries(cache_file):
    entries = {}
    try:
        with open(cache_file, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.match(r"^([A-Za-z0-9_.+-]+):[A-Z]+=(.*)$", line.rstrip("\n"))
                if m:
                    entries[m.group(1)] = m.group(2)
    except OSError:
        pass
    return entries


def _torch_cmake_prefix():
    """torch.utils.cmake_prefix_path when this Python's torch ships its CMake
    package (PyPI wheels do; Debian's python3-torch does not, and LibTorch's
    package comes from libtorch-dev instead). Asked in a child process: this
    one need not import torch."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import torch.utils; print(torch.utils.cmake_prefix_path)"],
            capture_output=True, text=True, timeout=300, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if out and os.path.isfile(os.path.join(out, "Torch", "TorchConfig.cmake")):
        return out
    return None


class CMakeExtension(Extension):
    """An extension built by a CMake target (no sources for setuptools)."""

    def __init__(self, name, target):
        super().__init__(name, sources=[])
        self.target = target


class BuildCMake(build_ext):
    def build_extension(self, ext):
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        cmake = os.environ.get("CMAKE") or shutil.which("cmake")
        if not cmake:
            raise RuntimeError("fusebox: cmake (>= 3.22) is needed to build fusebox.torch._C "
                               "(Debian: apt-get install cmake)")
        build_dir = os.path.join(os.path.abspath(self.build_temp), "cmake")
        generator = os.environ.get("CMAKE_GENERATOR") or ("Ninja" if shutil.which("ninja") else "")
        cache = _cache_entries(os.path.join(build_dir, "CMakeCache.txt"))
        home = cache.get("CMAKE_HOME_DIRECTORY")
        if cache and (not home or os.path.realpath(home) != os.path.realpath(ROOT) or
                      (generator and cache.get("CMAKE_GENERATOR") != generator)):
            shutil.rmtree(build_dir)  # another source tree or generator: start again
        os.makedirs(build_dir, exist_ok=True)

        build_type = os.environ.get("FUSEBOX_CMAKE_BUILD_TYPE") or "Release"
        configure = [cmake, "-S", ROOT, "-B", build_dir,
                     "-DCMAKE_BUILD_TYPE=" + build_type,
                     "-DBUILD_TESTING=OFF",
                     # The module is built for the Python running this build.
                     "-DFUSEBOX_SYSTEM_PYTHON=" + sys.executable]
        if generator:
            configure += ["-G", generator]
        prefix = _torch_cmake_prefix()
        if prefix:
            configure.append("-DCMAKE_PREFIX_PATH=" + prefix)
        configure += shlex.split(os.environ.get("FUSEBOX_CMAKE_ARGS", ""))
        self._run(configure)

        cache = _cache_entries(os.path.join(build_dir, "CMakeCache.txt"))
        missing = []
        if cache.get("FUSEBOX_WITH_TORCH") != "ON":
            missing.append("LibTorch's CMake package (Debian: libtorch-dev; or a torch whose "
                           "torch.utils.cmake_prefix_path holds it)")
        if cache.get("pybind11_DIR", "").endswith("NOTFOUND"):
            missing.append("pybind11's CMake package (Debian: pybind11-dev)")
        if cache.get("FUSEBOX_TORCH_PYTHON_LIB", "").endswith("NOTFOUND"):
            missing.append("libtorch_python (it comes with torch)")
        if missing:
            raise RuntimeError("fusebox: cannot build fusebox.torch._C; not found: " +
                               "; ".join(missing) + ". CMake output is above; its cache: " +
                               os.path.join(build_dir, "CMakeCache.txt"))

        jobs = self.parallel or os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or 2
        if jobs is True:  # build_ext -j without a number
            jobs = os.cpu_count() or 2
        self._run([cmake, "--build", build_dir, "--target", ext.target, "-j", str(jobs)])

        # plugins/torch/CMakeLists.txt puts the module in <build>/python/fusebox/torch.
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        leaf = ext.name.rsplit(".", 1)[-1]
        built_dir = os.path.join(build_dir, "python", *ext.name.split(".")[:-1])
        built = os.path.join(built_dir, leaf + suffix)
        if not os.path.isfile(built):
            found = glob.glob(os.path.join(built_dir, leaf + "*.so"))
            raise RuntimeError("fusebox: the build made no %s (found: %s); was it built for "
                               "another Python than %s?" % (built, found or "nothing",
                                                            sys.executable))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)
        shutil.copymode(built, dest)

    def _run(self, cmd):
        print("fusebox: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)


class EggInfo(egg_info):
    """egg_info in BUILD_BASE (not next to the package sources)."""

    def finalize_options(self):
        if self.egg_base:
            os.makedirs(self.egg_base, exist_ok=True)  # it must exist
        super().finalize_options()


class BuildPy(build_py):
    """Also writes fusebox/_version.py (the CMake project version)."""

    def run(self):
        super().run()
        path = os.path.join(self.build_lib, "fusebox", "_version.py")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write("# Generated by setup.py from CMakeLists.txt's project() line.\n"
                    "__version__ = %r\n" % VERSION)


setup(
    version=VERSION,
    package_dir={"": PY_SRC},
    packages=["fusebox", "fusebox.torch"],
    ext_modules=[CMakeExtension("fusebox.torch._C", target="fusebox_torch_python")],
    cmdclass={"build_ext": BuildCMake, "build_py": BuildPy, "egg_info": EggInfo},
    options={"build": {"build_base": BUILD_BASE},
             "egg_info": {"egg_base": BUILD_BASE}},
    zip_safe=False,
)
