#!/usr/bin/env bash
# The one command for a GPU machine (perf/gpu/README.md), from the repository
# root, with the kit of perf/gpu/kit.sh carried beside the tree:
#
#   bash perf/gpu/run_kit.sh [DIR]       (DIR: the kit, default gpu-kit/)
#
# Stages, each timed, within KIT_BUDGET_S (540 s; one device command may run
# 600):
#   preflight  the kit's files against its MANIFEST.txt; cmake, a C++
#              compiler, ninja (else make), the GPU, CUDA, NCCL, the Python
#              with torch (its version, CUDA, C++ ABI) and pybind11
#   unpack     every .deb of DIR with dpkg -x (or ar + tar) into a prefix
#              under /tmp, never /; .pc and CMake files pointed at it
#   configure  CMake, Ninja, RelWithDebInfo, in build-gpu/: UCX, Abseil,
#              nlohmann-json and GoogleTest from the prefix only (their
#              *_DIR given), CUDA and NCCL from the system, MPI off, the
#              torch plugin against the Python's torch. Should configuring
#              with torch fail, it configures again without it (the GPU tests
#              need no torch): result DEGRADED, which fails the run at the end
#              but lets the later stages run.
#   build      the GPU tests, fusebox-gpu-bench, a UCX test (the kit's
#              libraries at run time) and the Python module fusebox.torch,
#              -j$(nproc), -k 0 (KIT_BUILD_ALL=1: every target)
#   kit-libs   ctest -R '^UcxChannelTest\.': UCX, Abseil and GoogleTest
#              from the kit, loaded on this machine (about 2 s)
#   gpu-tests  ctest -L '^gpu$' (GPU_LABELS): the NCCL
#              communicator, AllReduceAfter's ordering, the engine on NCCL,
#              the CUDA device seam, the GPU benchmark's smoke test
#   py-device  the device tests of tests/python/test_ddp_hook.py: the hook's
#              synchronisations, and models with CUDA parameters refused
#              except on the native path
#   bench      perf/gpu/run.sh build-gpu with ROUNDS=1 RANKS=2 and
#              MODELS=resnet50 unless set (gpt2small adds minutes)
# Each stage after configure runs even when one before it failed; each gets
# at most what is left of KIT_BUDGET_S. Where nvidia-smi lists a GPU, a GPU
# test or fusebox-gpu-bench that reports SKIPPED fails its stage. The exit
# status is non-zero if any stage failed. Logs (and the benchmark's tables) go to $OUT when set
# (the device tool brings $OUT back), else to build-gpu/kit-logs/.
#
# Variables: PYTHON (default /opt/torch/.venv/bin/python, else python3 on
# PATH), KIT_PREFIX (/tmp/fusebox-kit), KIT_BUILD (build-gpu), KIT_BUDGET_S
# (540), KIT_JOBS (nproc), KIT_BUILD_ALL (0), KIT_ONLY (stage names, e.g.
# "gpu-tests bench", to rerun those on a warm machine whose build-gpu/ and
# prefix are still there; default: every stage), NCCL_INCLUDE_DIR /
# NCCL_LIBRARY (where NCCL is not under /usr or the CUDA toolkit), CUDA_HOME,
# ROUNDS, RANKS, MODELS (run.sh's).
set -euo pipefail
cd "$(dirname "$0")/../.."
kit=${1:-gpu-kit}
prefix=${KIT_PREFIX:-/tmp/fusebox-kit}
build=${KIT_BUILD:-build-gpu}
budget=${KIT_BUDGET_S:-540}
logs=${OUT:-$build/kit-logs}
jobs=${KIT_JOBS:-$(nproc)}
t0=$SECONDS
usr=$prefix/usr
libdir=$usr/lib/x86_64-linux-gnu
SUMMARY=()
failed=0

say() { printf '[run_kit %4ds] %s\n' $((SECONDS - t0)) "$*"; }
die() { printf '[run_kit %4ds] FATAL: %s\n' $((SECONDS - t0)) "$*" >&2; summary; exit 1; }
left() { echo $((budget - (SECONDS - t0))); }
# Runs a command under what is left of the budget.
bounded() {
  local s
  s=$(left)
  ((s > 10)) || { echo "out of time budget (KIT_BUDGET_S=$budget)" >&2; return 124; }
  timeout -k 10 "$s" "$@"
}
summary() {
  ((${#SUMMARY[@]})) || return 0
  echo
  echo "== run_kit summary (total $((SECONDS - t0)) s; logs in $logs/)"
  printf '  %-10s %-8s %6s  %s\n' stage result secs note
  printf '%s\n' "${SUMMARY[@]}"
}
# stage NAME NOTE FN ARGS...: runs FN in a subshell with errexit, output to the
# terminal and $logs/NAME.log; records its result and time.
stage() {
  local name=$1 note=$2 rc start=$SECONDS result
  shift 2
  if [[ -n ${KIT_ONLY:-} && " $KIT_ONLY " != *" $name "* ]]; then
    SUMMARY+=("$(printf '  %-10s %-8s %6s  %s' "$name" not-run - "$note (not in KIT_ONLY)")")
    return 0
  fi
  echo
  say "== $name: $note"
  set +e
  (set -e; "$@") 2>&1 | tee "$logs/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  case $rc in
    0) result=ok ;;
    77) result=skipped ;;
    78) result=DEGRADED; failed=1 ;;
    124 | 137) result=TIMEOUT; failed=1 ;;
    *) result="FAIL($rc)"; failed=1 ;;
  esac
  say "== $name: $result in $((SECONDS - start)) s"
  SUMMARY+=("$(printf '  %-10s %-8s %6d  %s' "$name" "$result" $((SECONDS - start)) "$note")")
  return 0
}
# Whether the last stage passed (or passed DEGRADED), or was left out by KIT_ONLY.
last_ok() { [[ ${SUMMARY[-1]} =~ \ (ok|not-run|DEGRADED)\  ]]; }
gpu_visible() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
# A stage's way of saying it could not run (result "skipped", not a failure).
skip() { echo "SKIPPED: $*"; exit 77; }

find_tool() {  # PATH first, then beside the Python (a venv's pip cmake/ninja)
  local t d
  t=$(command -v "$1" 2>/dev/null) && { echo "$t"; return 0; }
  [[ -n ${python:-} ]] || return 1
  d=$(dirname "$python")
  [[ -x $d/$1 ]] && { echo "$d/$1"; return 0; }
  return 1
}

# ---------------------------------------------------------------- preflight
mkdir -p "$logs"
python=${PYTHON:-/opt/torch/.venv/bin/python}
[[ -x $python ]] || python=$(command -v python3 || true)
cuda=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}

# What the later stages use, found here in this shell (stages run in
# subshells); preflight then reports and checks it.
detect() {
  cmake_bin=$(find_tool cmake || true)
  generator="Unix Makefiles"
  find_tool ninja >/dev/null && generator=Ninja
  # NCCL: the system's (as CMakeLists.txt looks for it), else the Python's
  # nvidia-nccl wheel, else NCCL_INCLUDE_DIR / NCCL_LIBRARY from the caller.
  nccl_inc=${NCCL_INCLUDE_DIR:-} nccl_lib=${NCCL_LIBRARY:-}
  local d site
  if [[ -z $nccl_inc ]]; then
    for d in /usr/include "$cuda/include" /usr/local/include; do
      [[ -f $d/nccl.h ]] && { nccl_inc=$d; break; }
    done
  fi
  if [[ -z $nccl_inc && -x $python ]]; then
    site=$("$python" -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
    if [[ -n $site && -f $site/include/nccl.h ]]; then
      nccl_inc=$site/include
      [[ -n $nccl_lib ]] || nccl_lib=$(compgen -G "$site/lib/libnccl.so*" | head -1 || true)
    fi
  fi
  torch_ok=0 torch_dir='' pybind11_dir=''
  if [[ -x $python ]] && "$python" -c 'import torch' 2>/dev/null; then
    torch_ok=1
    torch_dir=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')/Torch
    # (Debian's torch names a folder it does not ship: CMake then looks on its own.)
    [[ -f $torch_dir/TorchConfig.cmake ]] || torch_dir=''
    pybind11_dir=$("$python" -m pybind11 --cmakedir 2>/dev/null || true)
  fi
}

preflight() {
  [[ -d $kit ]] || { echo "no kit folder '$kit': make it with 'bash perf/gpu/kit.sh' where Debian's archive is reachable, and carry it"; return 1; }
  [[ -f $kit/MANIFEST.txt ]] || { echo "$kit/MANIFEST.txt is missing: remake the kit with perf/gpu/kit.sh"; return 1; }
  local p v b sum f bad=0
  while read -r p v b sum _; do
    f=$(compgen -G "$kit/${p}_*.deb" | head -1 || true)
    if [[ -z $f ]]; then echo "missing from the kit: $p ($v)"; bad=1; continue; fi
    [[ $(sha256sum "$f" | cut -d' ' -f1) == "$sum" ]] || { echo "checksum mismatch: $f"; bad=1; }
    printf '  kit: %-20s %-24s %9s bytes\n' "$p" "$v" "$b"
  done < <(grep -v '^#' "$kit/MANIFEST.txt")
  ((bad == 0)) || { echo "the kit is incomplete or damaged: remake it with perf/gpu/kit.sh"; return 1; }

  [[ -n $cmake_bin ]] || { echo "no cmake (3.22 or newer) on PATH or beside $python"; return 1; }
  local cv
  cv=$("$cmake_bin" --version | head -1 | grep -o '[0-9][0-9.]*' | head -1)
  [[ $(printf '3.22\n%s\n' "$cv" | sort -V | head -1) == 3.22 ]] ||
    { echo "cmake $cv is older than 3.22 (CMakeLists.txt's minimum)"; return 1; }
  echo "  cmake: $cmake_bin ($cv); generator: $generator"
  command -v c++ >/dev/null || { echo "no C++ compiler (c++)"; return 1; }
  echo "  c++: $(c++ --version | head -1)"
  command -v dpkg >/dev/null || { command -v ar >/dev/null && command -v tar >/dev/null; } ||
    { echo "neither dpkg nor ar + tar: cannot unpack .deb files"; return 1; }
  # The kit is built against Debian 12's glibc (2.36).
  local glibc
  glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }' || true)
  # shellcheck disable=SC1091
  echo "  glibc: ${glibc:-unknown} (the kit's libraries need 2.36); $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-}")"
  [[ -z $glibc || $(printf '2.36\n%s\n' "$glibc" | sort -V | head -1) == 2.36 ]] ||
    echo "  WARNING: glibc $glibc is older than Debian 12's 2.36: the kit's libraries may not load"

  if command -v nvidia-smi >/dev/null; then nvidia-smi -L || echo "  WARNING: nvidia-smi failed"
  else echo "  WARNING: no nvidia-smi: without a GPU the GPU tests print SKIPPED"; fi
  [[ -n $nccl_inc ]] || { echo "nccl.h not found (/usr/include, $cuda/include, the Python's nvidia-nccl): set NCCL_INCLUDE_DIR and NCCL_LIBRARY"; return 1; }
  echo "  nccl.h: $nccl_inc${nccl_lib:+; library $nccl_lib}"
  [[ -x $cuda/bin/nvcc ]] || command -v nvcc >/dev/null ||
    echo "  WARNING: no nvcc in $cuda/bin or on PATH: CMake's FindCUDAToolkit may not find CUDA (set CUDA_HOME)"

  if ((torch_ok)); then
    "$python" -c 'import torch
print("  torch %s, CUDA %s, cuda available: %s, C++11 ABI: %s" % (torch.__version__,
      torch.version.cuda, torch.cuda.is_available(), torch._C._GLIBCXX_USE_CXX11_ABI))'
    echo "  python: $python; Torch_DIR ${torch_dir:-not given (CMake looks for TorchConfig.cmake on its own)}"
    echo "  pybind11: ${pybind11_dir:-not importable from $python (CMake looks for it on its own)}"
    "$python" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
      echo "  WARNING: no Python.h for $python: the module fusebox.torch will not build"
    "$python" -c 'import pytest' 2>/dev/null || echo "  WARNING: $python has no pytest: the py-device stage will skip"
    "$python" -c 'import torchvision' 2>/dev/null || echo "  WARNING: $python has no torchvision: the benchmark's resnet50 needs it"
  else
    echo "  WARNING: ${python:-no python} cannot import torch: the torch plugin, the Python tests and the DDP benchmark are left out"
  fi
}

# ------------------------------------------------------------------- unpack
unpack() {
  case $prefix in /tmp/?*) ;; *) echo "KIT_PREFIX must lie under /tmp, not '$prefix'"; return 1 ;; esac
  rm -rf "$prefix"
  mkdir -p "$prefix"
  local f n=0 data abs
  for f in "$kit"/*.deb; do
    if command -v dpkg >/dev/null && [[ ${KIT_NO_DPKG:-0} != 1 ]]; then
      dpkg -x "$f" "$prefix"
    else  # no dpkg: a .deb is an ar archive holding data.tar.{xz,zst,gz}
      abs=$(realpath "$f")
      data=$(ar t "$abs" | grep '^data\.tar')
      (cd "$prefix" && ar x "$abs" "$data" && tar -xf "$data" && rm -f "$data")
    fi
    n=$((n + 1))
  done
  echo "unpacked $n packages into $prefix ($(du -sh "$prefix" | cut -f1))"
  # pkg-config files: prefix=, libdir=, includedir= and -I/-L flags name /usr.
  local pc
  while IFS= read -r -d '' pc; do
    sed -i -E "s#^([A-Za-z_]+[[:space:]]*=[[:space:]]*)/usr(/|\$)#\1$usr\2#; s#(-[IL])/usr/#\1$usr/#g" "$pc"
  done < <(find "$usr" -name '*.pc' -print0)
  local stale
  stale=$(grep -rlE '(=[[:space:]]*|-I|-L)/usr(/|$)' --include='*.pc' "$usr" || true)
  [[ -z $stale ]] || { echo "WARNING: .pc files still naming /usr:"; echo "$stale"; }
  # CMake configs: Abseil's, GoogleTest's and nlohmann-json's compute their
  # prefix from where they lie; UCX's says set(prefix "/usr").
  local cf
  while IFS= read -r -d '' cf; do
    sed -i "s#set(prefix \"/usr\")#set(prefix \"$usr\")#" "$cf"
  done < <(find "$usr" -path '*/cmake/*' -name '*.cmake' -print0)
  grep -q "set(prefix \"$usr\")" "$libdir/cmake/ucx/ucx-targets.cmake" ||
    { echo "ucx-targets.cmake was not pointed at $usr"; return 1; }
  for f in "$libdir/libucp.so" "$libdir/libabsl_strings.so" "$libdir/libgtest.a" \
           "$libdir/cmake/absl/abslConfig.cmake" "$libdir/cmake/GTest/GTestConfig.cmake" \
           "$usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" "$usr/include/nlohmann/json.hpp"; do
    [[ -e $f ]] || { echo "missing after unpacking: $f"; return 1; }
  done
}

# ---------------------------------------------------------------- configure
configure() {
  local with_torch=$1 args
  args=(-S . -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=RelWithDebInfo
        "-DCMAKE_PREFIX_PATH=$usr${torch_dir:+;$(dirname "$torch_dir")}"
        "-Dabsl_DIR=$libdir/cmake/absl" "-Ducx_DIR=$libdir/cmake/ucx"
        "-DGTest_DIR=$libdir/cmake/GTest" "-Dnlohmann_json_DIR=$usr/share/cmake/nlohmann_json"
        -DFUSEBOX_WITH_MPI=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON
        "-DNCCL_INCLUDE_DIR=$nccl_inc")
  [[ -z $nccl_lib ]] || args+=("-DNCCL_LIBRARY=$nccl_lib")
  [[ ! -d $cuda ]] || args+=("-DCUDAToolkit_ROOT=$cuda")
  [[ $generator != Ninja ]] || args+=("-DCMAKE_MAKE_PROGRAM=$(find_tool ninja)")
  if [[ -x $python ]]; then
    args+=("-DFUSEBOX_SYSTEM_PYTHON=$python" "-DPYTHON_EXECUTABLE=$python"
           "-DPython_EXECUTABLE=$python" "-DPython3_EXECUTABLE=$python")
  fi
  if [[ $with_torch == 1 ]]; then
    args+=(-DFUSEBOX_WITH_TORCH=ON)
    [[ -z $torch_dir ]] || args+=("-DTorch_DIR=$torch_dir")
    [[ -z $pybind11_dir ]] || args+=("-Dpybind11_DIR=$pybind11_dir")
  else
    args+=(-DFUSEBOX_WITH_TORCH=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON)
  fi
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  # (Explicit returns: configure_stage calls this where errexit does not act.)
  bounded "$cmake_bin" "${args[@]}" || return
  local cache=$build/CMakeCache.txt
  grep -q '^FUSEBOX_WITH_NCCL:BOOL=ON' "$cache" ||
    { echo "CMake did not find CUDA and NCCL (FUSEBOX_WITH_NCCL is OFF): set CUDA_HOME, NCCL_INCLUDE_DIR, NCCL_LIBRARY"; return 1; }
  grep -q '^FUSEBOX_WITH_UCX:BOOL=ON' "$cache" || { echo "UCX from the kit was not found"; return 1; }
  echo "found:"
  grep -E '^(absl|ucx|GTest|nlohmann_json|Torch|pybind11)_DIR:|^NCCL_(INCLUDE_DIR|LIBRARY):|^CUDA_cudart_LIBRARY:|^FUSEBOX_WITH_' "$cache" | sed 's/^/  /'
  # Nothing of the kit's four may come from the system.
  if grep -E '^(absl|ucx|GTest|nlohmann_json)_DIR:' "$cache" | grep -v "=$prefix/" | grep -q .; then
    echo "a kit package was found outside $prefix"; return 1
  fi
}
configure_stage() {
  if ((torch_ok)); then
    configure 1 && return 0
    echo
    echo "CONFIGURING WITH TORCH FAILED (see above); configuring again without the torch plugin:"
    echo "the GPU tests still run, the Python device tests and the DDP benchmark cannot"
    torch_ok=0
    configure 0 || return
    return 78  # DEGRADED: configured, without the plugin that torch here should allow
  fi
  configure 0
}

# -------------------------------------------------------------------- build
build_stage() {
  local targets=()
  if [[ ${KIT_BUILD_ALL:-0} == 1 ]]; then
    targets=(all)
  else
    targets=(nccl_communicator_test cuda_device_test bucketing_engine_nccl_test
             fusebox-gpu-bench ucx_channel_test)
    ((torch_ok)) && grep -q '^FUSEBOX_WITH_TORCH:BOOL=ON' "$build/CMakeCache.txt" &&
      targets+=(fusebox_torch_python)
  fi
  local keep_going=(-k 0)
  [[ $generator == Ninja ]] || keep_going=(-k)
  echo "targets: ${targets[*]} (-j$jobs)"
  bounded "$cmake_bin" --build "$build" -j "$jobs" --target "${targets[@]}" -- "${keep_going[@]}"
}

kit_libs_stage() {
  [[ -x $build/tests/comm/ucx_channel_test ]] || { echo "ucx_channel_test was not built"; return 1; }
  echo "libraries the test loads:"
  ldd "$build/tests/comm/ucx_channel_test" | grep -E 'libuc|libabsl_(strings|status)\.|libnuma' | sed 's/^/  /' ||
    { echo "ldd shows no UCX or Abseil library in ucx_channel_test"; return 1; }
  if ldd "$build/tests/comm/ucx_channel_test" | grep -E 'libuc[pst]|libabsl' | grep -v "$prefix/" | grep -q .; then
    echo "some of UCX or Abseil did not come from $prefix"; return 1
  fi
  cd "$build" && bounded ctest -R '^UcxChannelTest\.' --output-on-failure
}

# Every GPU test carries the label gpu alone: gtest_discover_tests flattens a
# list of labels ("nccl;gpu" became "LABELS nccl gpu", which set only nccl),
# so the CMake files give one label.
GPU_LABELS='^gpu$'
gpu_tests_stage() {
  cd "$build"
  local n
  n=$(ctest -N -L "$GPU_LABELS" | awk '/^Total Tests:/ { print $3 }')
  [[ ${n:-0} -gt 0 ]] || { echo "no test has the label gpu: were the GPU tests built? (see build.log)"; return 1; }
  echo "$n tests labelled gpu"
  # One GPU: the tests run one at a time.
  local rc=0 skipped
  bounded ctest -L "$GPU_LABELS" --output-on-failure >"$logs/gpu-tests.ctest" 2>&1 || rc=$?
  cat "$logs/gpu-tests.ctest"
  ((rc == 0)) || return "$rc"
  # A test skips when it finds no usable GPU: where nvidia-smi sees one, that is a failure.
  skipped=$(grep -c '(Skipped)$' "$logs/gpu-tests.ctest" || true)
  if ((skipped > 0)) && gpu_visible; then
    echo "$skipped GPU tests SKIPPED although nvidia-smi lists a GPU: CUDA or NCCL is not usable here"
    return 1
  fi
}

py_device_stage() {
  ((torch_ok)) || skip "no torch plugin (no torch, or configuring with it failed)"
  if ! compgen -G "$build/python/fusebox/torch/_C*.so" >/dev/null; then
    echo "the module fusebox.torch was not built (see build.log)"; return 1
  fi
  "$python" -c 'import pytest' 2>/dev/null || skip "$python has no pytest"
  # From the build folder, as ctest runs the Python tests (pytest's plugins
  # may write there).
  local tests=$PWD/tests/python/test_ddp_hook.py
  cd "$build"
  FUSEBOX_PYTHON_DIR=$PWD/python OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 \
    bounded "$python" -m pytest -v -p no:cacheprovider "$tests" -k 'device or off_the_cpu'
}

bench_stage() {
  ((torch_ok)) || skip "no torch plugin: run.sh's DDP part needs fusebox.torch"
  [[ -x $build/perf/fusebox-gpu-bench ]] || { echo "fusebox-gpu-bench was not built"; return 1; }
  echo "ROUNDS=${ROUNDS:-1} RANKS=${RANKS:-2} MODELS=${MODELS:-resnet50}; $(left) s of the budget left"
  ROUNDS=${ROUNDS:-1} RANKS=${RANKS:-2} MODELS=${MODELS:-resnet50} PYTHON=$python \
    bounded bash perf/gpu/run.sh "$build" "$logs/bench"
  if grep -q '^SKIPPED' "$logs/bench/device.txt" && gpu_visible; then
    echo "fusebox-gpu-bench SKIPPED although nvidia-smi lists a GPU"
    return 1
  fi
}

say "fusebox GPU kit run: kit $kit, prefix $prefix, build $build, $jobs cores, budget ${budget} s"
detect
stage preflight "tools, kit, GPU, CUDA, NCCL, torch" preflight
last_ok || die "preflight failed: see $logs/preflight.log"
stage unpack "dpkg -x the kit into $prefix" unpack
last_ok || die "unpacking failed: see $logs/unpack.log"
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$libdir/pkgconfig:$usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export CMAKE_PREFIX_PATH=$usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
stage configure "CMake, kit prefix + system CUDA/NCCL/torch" configure_stage
last_ok || die "configuring failed: see $logs/configure.log"
# Whether torch made it into the build (configure_stage ran in a subshell).
grep -qs '^FUSEBOX_WITH_TORCH:BOOL=ON' "$build/CMakeCache.txt" || torch_ok=0
stage build "cmake --build -j$jobs" build_stage
stage kit-libs "UcxChannelTest: the kit's libraries load here" kit_libs_stage
stage gpu-tests "ctest -L '$GPU_LABELS'" gpu_tests_stage
stage py-device "test_ddp_hook.py's device tests" py_device_stage
stage bench "perf/gpu/run.sh, ROUNDS=1 RANKS=2" bench_stage
summary
if ((failed)); then echo "run_kit: some stages failed (logs in $logs/)"; exit 1; fi
echo "run_kit: all stages passed or skipped"
