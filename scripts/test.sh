#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (CTest), then
# the same suite under ASan+UBSan, then the fuzz targets for a short while,
# and prints each runner's summary. Exit status: the first failing stage's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
# OpenMPI refuses to start as root without these; they change nothing else.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
set +e
ctest --test-dir "$BUILD_DIR" -j "${JOBS:-2}" --output-on-failure --timeout 600 2>&1 | tee "$BUILD_DIR/ctest.log"
rc=${PIPESTATUS[0]}
set -e
echo
echo "== CTest summary"
grep -E "tests passed|tests failed|Total Test time" "$BUILD_DIR/ctest.log" || true
# pytest runs inside CTest (Python.*); its own summary line is in CTest's log.
echo "== pytest summary (run by CTest)"
grep -hE "^=*[ ]*[0-9]+ (passed|failed).* in [0-9.]+s" "$BUILD_DIR"/Testing/Temporary/LastTest*.log || echo "pytest: not run (no /usr/bin/python3 with torch and pytest)"
skipped=$(grep -c -- "\*\*\*Skipped" "$BUILD_DIR/ctest.log" || true)
echo "skipped (GPU-only or not applicable here): $skipped"

# The same suite built with AddressSanitizer + UndefinedBehaviorSanitizer
# (LeakSanitizer on; OpenMPI's own never-freed allocations suppressed in
# tests/sanitizers/lsan.supp). The torch plugin is left out: it is loaded by
# an uninstrumented Python. FUSEBOX_SANITIZERS=0 skips this stage. The fault
# injection tests (label "faults": deadlines of a few seconds, three ranks
# under a launcher) run in the main suite only.
asan_rc=0
if [[ "${FUSEBOX_SANITIZERS:-1}" != 0 ]]; then
  ASAN_DIR=${ASAN_BUILD_DIR:-build-asan}
  echo
  echo "== ASan+UBSan build ($ASAN_DIR)"
  cmake -S . -B "$ASAN_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFUSEBOX_SANITIZE=address,undefined -DFUSEBOX_WITH_TORCH=OFF >/dev/null
  cmake --build "$ASAN_DIR" -j "${JOBS:-2}" | tail -n 1
  set +e
  ASAN_OPTIONS=fast_unwind_on_malloc=0 UBSAN_OPTIONS=print_stacktrace=1 \
  LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0" \
    ctest --test-dir "$ASAN_DIR" -j "${JOBS:-2}" --output-on-failure --timeout 600 -LE faults \
    >"$ASAN_DIR/ctest.log" 2>&1
  asan_rc=$?
  set -e
  grep -E "tests passed|tests failed|Total Test time|\*\*\*(Failed|Timeout)" "$ASAN_DIR/ctest.log" || true
  if [[ $asan_rc -ne 0 ]]; then
    echo "== ASan+UBSan failures (sanitizer reports):"
    grep -E "ERROR: (Address|Leak)Sanitizer|runtime error:|SUMMARY:" "$ASAN_DIR/ctest.log" | head -40 || true
  fi
fi

# libFuzzer on every parser of untrusted input (tests/fuzz/README.md): clang
# builds the targets in build-fuzz and each runs FUSEBOX_FUZZ_SECONDS (20)
# on a copy of its seed corpus. FUSEBOX_FUZZ=0 skips this stage.
fuzz_rc=0
echo
if [[ "${FUSEBOX_FUZZ:-1}" == 0 ]]; then
  echo "== libFuzzer: skipped (FUSEBOX_FUZZ=0)"
elif ! command -v clang++ >/dev/null 2>&1; then
  echo "== libFuzzer: skipped (no clang++; scripts/install-deps.sh installs clang and libclang-rt-14-dev)"
else
  echo "== libFuzzer (tests/fuzz, ${FUSEBOX_FUZZ_SECONDS:-20} s per target)"
  set +e
  bash tests/fuzz/run_fuzzers.sh
  fuzz_rc=$?
  set -e
fi

echo
echo "== summary: main suite exit $rc, ASan+UBSan suite exit $asan_rc, fuzzing exit $fuzz_rc"
if [[ $rc -ne 0 ]]; then exit "$rc"; fi
if [[ $asan_rc -ne 0 ]]; then exit "$asan_rc"; fi
exit "$fuzz_rc"
