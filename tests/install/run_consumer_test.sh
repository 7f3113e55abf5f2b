#!/usr/bin/env bash
# InstallTest.ExternalConsumer: fusebox as an installed package.
#
#   run_consumer_test.sh BUILD_DIR SOURCE_DIR [BACKEND]
#
# 1. installs the (already built) fusebox build tree BUILD_DIR into a fresh
#    temporary prefix (cmake --install BUILD_DIR --prefix TMP);
# 2. checks what was installed: the package files, the headers under
#    include/fusebox/, and that the exported targets carry no warning or
#    optimisation flags;
# 3. configures and builds the external project tests/install/consumer with
#    find_package(fusebox CONFIG) against that prefix only
#    (-DCMAKE_PREFIX_PATH=TMP);
# 4. runs it on 2 ranks under the installed TMP/bin/fusebox-run: one
#    AllReduce of known values per rank over BACKEND (default ucx), checked
#    exactly; every rank must print OK;
# 5. if pkg-config is installed, builds the same program from fusebox.pc
#    alone and runs it the same way.
#
# Environment: CMAKE (default: cmake on PATH), CMAKE_GENERATOR (default:
# Ninja when ninja is on PATH), FUSEBOX_CXX_COMPILER (the compiler fusebox
# was built with; default: CMake's choice), FUSEBOX_SANITIZE (fusebox's
# sanitizers, when the build has them: the consumer is then compiled with
# them too, as a user of a sanitizer build would; ThreadSanitizer reports
# false races when fusebox's inline code runs uninstrumented in the
# consumer), KEEP_TMP=1 keeps the temporary directory (as in every script
# that uses tests/lib/e2e.sh). Exit status 0 on success.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../lib/e2e.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/e2e.sh"
e2e_need_args 2 "$0 BUILD_DIR SOURCE_DIR [BACKEND]" "$@"

build_dir=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
backend=${3:-ucx}
cmake_bin=${CMAKE:-cmake}
e2e_need_exec "$cmake_bin" cmake

e2e_workdir fusebox-install-test
tmp=$E2E_WORK
prefix=$tmp/prefix

echo "== install $build_dir -> $prefix"
"$cmake_bin" --install "$build_dir" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; e2e_fail "cmake --install failed"; }

echo "== check the installed tree"
config=$(find "$prefix" -path '*/cmake/fusebox/fusebox-config.cmake' | head -n 1)
[[ -n "$config" ]] || e2e_fail "no lib/cmake/fusebox/fusebox-config.cmake under $prefix"
cmakedir=$(dirname "$config")
for f in fusebox-config-version.cmake fusebox-targets.cmake; do
  [[ -f "$cmakedir/$f" ]] || e2e_fail "no $f in $cmakedir"
done
pc=$(find "$prefix" -path '*/pkgconfig/fusebox.pc' | head -n 1)
[[ -n "$pc" ]] || e2e_fail "no lib/pkgconfig/fusebox.pc under $prefix"
for h in fusebox/config.h fusebox/comm/communicator.h fusebox/comm/backends.h \
         fusebox/comm/types.h fusebox/bucketing/engine.h fusebox/autotune/tuner.h; do
  [[ -f "$prefix/include/$h" ]] || e2e_fail "no include/$h"
done
[[ -x "$prefix/bin/fusebox-run" ]] || e2e_fail "no bin/fusebox-run"
# Nothing fusebox builds itself with may reach a consumer: warnings and
# optimisation levels are fusebox's own business (the build type decides).
if grep -rnE -- '-W(all|extra|error|no-)|(^|[ ;"])-O([0-3sgz]|fast)?([ ;"]|$)' \
     "$cmakedir" "$pc"; then
  e2e_fail "warning or optimisation flags in the installed package files (above)"
fi
# The exported targets must not point into the source or build tree.
if grep -rnF -e "$source_dir" -e "$build_dir" "$cmakedir" "$pc"; then
  e2e_fail "the installed package files refer to the source or build tree (above)"
fi

generator=()
if [[ -n "${CMAKE_GENERATOR:-}" ]]; then
  generator=(-G "$CMAKE_GENERATOR")
elif command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi
compiler=()
if [[ -n "${FUSEBOX_CXX_COMPILER:-}" ]]; then
  compiler=(-DCMAKE_CXX_COMPILER="$FUSEBOX_CXX_COMPILER")
fi
sanitize_flags=""
if [[ -n "${FUSEBOX_SANITIZE:-}" ]]; then
  sanitize_flags="-fsanitize=$FUSEBOX_SANITIZE -fno-omit-frame-pointer"
fi

echo "== configure and build tests/install/consumer against $prefix"
consumer_build=$tmp/consumer-build
# Only the temporary prefix: no package registry, no build tree.
if ! "$cmake_bin" -S "$source_dir/tests/install/consumer" -B "$consumer_build" \
     "${generator[@]}" "${compiler[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
     -DCMAKE_CXX_FLAGS="$sanitize_flags" \
     -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
     -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF >"$tmp/configure.log" 2>&1; then
  cat "$tmp/configure.log" >&2
  e2e_fail "configuring the consumer failed"
fi
found_dir=$(sed -n 's/^fusebox_DIR:PATH=//p' "$consumer_build/CMakeCache.txt")
[[ "$found_dir" == "$prefix"/* ]] || e2e_fail "find_package(fusebox) found '$found_dir', not $prefix"
echo "found fusebox in $found_dir"
if ! "$cmake_bin" --build "$consumer_build" -j 2 >"$tmp/build.log" 2>&1; then
  cat "$tmp/build.log" >&2
  e2e_fail "building the consumer failed"
fi

# run_on_two_ranks PROGRAM: under the installed launcher; each rank must
# print "OK rank R/2".
run_on_two_ranks() {
  local out=$tmp/run.out rc=0
  "$prefix/bin/fusebox-run" -n 2 --timeout 120 -- "$1" "$backend" >"$out" 2>&1 || rc=$?
  cat "$out"
  [[ $rc -eq 0 ]] || e2e_fail "$1 on 2 ranks exited $rc"
  for r in 0 1; do
    grep -q "OK rank $r/2" "$out" || e2e_fail "rank $r did not print OK"
  done
}

echo "== run the consumer on 2 ranks (fusebox-run from $prefix/bin, backend $backend)"
run_on_two_ranks "$consumer_build/fusebox_consumer"

if command -v pkg-config >/dev/null 2>&1; then
  echo "== build the consumer from fusebox.pc (pkg-config --static)"
  export PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  pkg-config --print-errors --exists fusebox || e2e_fail "pkg-config cannot read $pc"
  cflags=$(pkg-config --cflags fusebox)
  libs=$(pkg-config --static --libs fusebox)
  echo "cflags: $cflags"
  echo "libs: $libs"
  cxx=${FUSEBOX_CXX_COMPILER:-c++}
  # shellcheck disable=SC2086  # word splitting of the flags is intended
  if ! "$cxx" -std=c++17 -O1 $sanitize_flags -o "$tmp/fusebox_consumer_pc" \
       "$source_dir/tests/install/consumer/main.cc" $cflags $libs >"$tmp/pc-build.log" 2>&1; then
    cat "$tmp/pc-build.log" >&2
    e2e_fail "building the consumer from fusebox.pc failed"
  fi
  run_on_two_ranks "$tmp/fusebox_consumer_pc"
else
  echo "== pkg-config not installed: fusebox.pc not exercised"
fi

echo "InstallTest.ExternalConsumer: PASSED"
