#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/README.md) with clang in their own
# build directory and runs each for a bounded number of inputs on a copy of
# its seed corpus (the repository's corpus is never written). Prints one line
# per target: executions, corpus growth, crash yes/no. A crashing input is
# kept under $FUZZ_BUILD_DIR/fuzz-run/<target>/ (crash-*, timeout-*, oom-*).
#
# By default the run is seeded: the same seed, seed corpus and binary give
# the same inputs in the same order, so the test command's verdict is the
# same on every machine (a slower one runs a prefix of the same sequence,
# cut by the time limit). A random campaign that fails CI on whichever input
# it happens to reach is a gate that fails at random; campaigns that look
# for new inputs are run by hand with FUSEBOX_FUZZ_SEED=0 (random) and a
# longer FUSEBOX_FUZZ_SECONDS, and what they find becomes a crash_* seed.
#
#   FUSEBOX_FUZZ_SEED      libFuzzer -seed (default 1; 0 = random)
#   FUSEBOX_FUZZ_RUNS      inputs per target (default 200000; 0 = no limit)
#   FUSEBOX_FUZZ_SECONDS   time limit per target (default 45)
#   FUSEBOX_FUZZ_TARGETS   targets to run, space-separated (default: all)
#   FUZZ_BUILD_DIR         build directory (default build-fuzz)
#   JOBS                   build parallelism (default 2)
#
# Exit status: 0 when no target crashed, 1 when one did, 2 when the targets
# could not be built.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_TARGET=${FUSEBOX_FUZZ_SECONDS:-45}
SEED=${FUSEBOX_FUZZ_SEED:-1}
RUNS=${FUSEBOX_FUZZ_RUNS:-200000}
check_count() {  # name value
  if [[ ! "$2" =~ ^[0-9]+$ ]]; then
    echo "run_fuzzers: $1 must be a non-negative integer, got '$2'" >&2
    exit 2
  fi
}
check_count FUSEBOX_FUZZ_SEED "$SEED"
check_count FUSEBOX_FUZZ_RUNS "$RUNS"
check_count FUSEBOX_FUZZ_SECONDS "$SECONDS_PER_TARGET"
seed_label=$SEED
if [[ "$SEED" == 0 ]]; then seed_label=random; fi
runs_flag=()
if [[ "$RUNS" != 0 ]]; then runs_flag=(-runs="$RUNS"); fi
# What else varies between runs of one seed, each found by comparing the
# corpora of two runs: libFuzzer re-reads the corpus directory every second
# (-reload); and the targets' stack and heap addresses, which reach the
# mutations through the pointer comparisons libFuzzer records (and the
# targets through address-seeded hashing), move with address-space
# randomisation and with the size of the environment (PWD alone differs
# between clones). A seeded run therefore runs with -reload=0, without
# randomisation, and in a fixed environment (env -i below). Two runs of a
# seed, in clones at different paths and under different environments, then
# give the same corpus, file for file.
seeded=()
no_aslr=()
if [[ "$SEED" != 0 ]]; then
  seeded=(-reload=0)
  if setarch "$(uname -m)" -R true 2>/dev/null; then
    no_aslr=(setarch "$(uname -m)" -R)
  else
    echo "run_fuzzers: cannot turn address-space randomisation off (setarch -R); the run may vary slightly" >&2
  fi
fi
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
ALL_TARGETS="plan_parser profile_parser policy_cache_parser cost_model_parser perf_json_parser store_wire"
TARGETS=${FUSEBOX_FUZZ_TARGETS:-$ALL_TARGETS}

# Longest input per target: a little above the largest seed, so that time
# goes to inputs of the size that matters rather than to megabytes of JSON.
max_len() {
  case "$1" in
    store_wire) echo 4096 ;;
    *) echo 8192 ;;
  esac
}

fuzzer_runtime=$(clang++ -print-resource-dir 2>/dev/null)/lib/linux/libclang_rt.fuzzer-x86_64.a
if [[ ! -f "$fuzzer_runtime" ]]; then
  echo "run_fuzzers: no libFuzzer runtime ($fuzzer_runtime); install clang and libclang-rt-14-dev" >&2
  exit 2
fi

start=$(date +%s)
mkdir -p "$BUILD"
log="$BUILD/fuzz-build.log"
# Debug: assertions stay on (no NDEBUG); tests/fuzz/CMakeLists.txt sets -O1.
# The checkout's path is kept out of the binaries (debug info, __FILE__,
# UBSan's file names, ASan's per-global module names), so that they are the
# same wherever the repository was cloned: a path of another length moves
# every address after it, and addresses reach libFuzzer's mutations through
# the pointer comparisons it records. ASan's instrumentation of globals goes
# with it (-asan-globals=0: the parsers keep what they read on the heap, and the
# ASan+UBSan stage of the test command, which replays every corpus, keeps
# it). Five of the six binaries are then byte-identical between clones at
# different paths; store_wire still differs in a lambda's name in UBSan's
# type tables (clang 14 does not map it), and its corpus matched anyway.
prefix_map="-ffile-prefix-map=$PWD/= -fsanitize-undefined-strip-path-components=-2 -mllvm -asan-globals=0"
if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_CXX_FLAGS="$prefix_map" -DCMAKE_C_FLAGS="$prefix_map" \
      -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DFUSEBOX_FUZZ=ON \
      -DBUILD_TESTING=OFF -DFUSEBOX_WITH_TORCH=OFF -DFUSEBOX_WITH_UCX=OFF \
      -DFUSEBOX_WITH_MPI=OFF -DFUSEBOX_WITH_NCCL=OFF >"$log" 2>&1 ||
   ! cmake --build "$BUILD" -j "${JOBS:-2}" --target fuzz_targets >>"$log" 2>&1; then
  echo "run_fuzzers: building the fuzz targets failed ($log):" >&2
  tail -n 30 "$log" >&2
  exit 2
fi
echo "fuzz targets built in $(($(date +%s) - start)) s ($BUILD)"
runs_label=$RUNS
if [[ "$RUNS" == 0 ]]; then runs_label=unbounded; fi
echo "fuzz settings: seed $seed_label, $runs_label inputs per target, at most $SECONDS_PER_TARGET s each"

# Stack traces in a crash report need llvm-symbolizer; the fixed PATH below
# may not reach it (Debian's unversioned link comes with the llvm package,
# the binary itself lives in /usr/lib/llvm-N/bin).
symbolizer=$(command -v llvm-symbolizer || ls /usr/lib/llvm-*/bin/llvm-symbolizer 2>/dev/null | tail -n 1 || true)

crashed=0
for t in $TARGETS; do
  run="$BUILD/fuzz-run/$t"
  rm -rf "$run"
  mkdir -p "$run/corpus"
  cp tests/fuzz/corpus/"$t"/* "$run/corpus/"
  seeds=$(find "$run/corpus" -type f | wc -l)
  t0=$(date +%s)
  set +e
  env -i PATH=/usr/bin:/bin ASAN_SYMBOLIZER_PATH="$symbolizer" ASAN_OPTIONS=detect_leaks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "${no_aslr[@]}" "$BUILD/tests/fuzz/fuzz_$t" "$run/corpus" -seed="$SEED" "${runs_flag[@]}" "${seeded[@]}" \
    -max_total_time="$SECONDS_PER_TARGET" \
    -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$run/" >"$run/fuzz.log" 2>&1
  status=$?
  set -e
  took=$(($(date +%s) - t0))
  execs=$(grep -oE "stat::number_of_executed_units: [0-9]+" "$run/fuzz.log" | tail -n 1 | grep -oE "[0-9]+$" || true)
  corpus=$(find "$run/corpus" -type f | wc -l)
  if [[ $status -eq 0 ]]; then
    echo "fuzz $t: ${execs:-?} executions (seed $seed_label) in $took s, corpus $seeds -> $corpus inputs, crash: no"
  else
    crashed=1
    artifact=$(find "$run" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | head -n 1)
    echo "fuzz $t: ${execs:-?} executions (seed $seed_label), crash: YES (exit $status; input ${artifact:-not saved}; log $run/fuzz.log)"
    grep -E "fuzz invariant failed|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|what\(\)" \
      "$run/fuzz.log" | head -n 5 | sed 's/^/    /'
  fi
done
exit "$crashed"
