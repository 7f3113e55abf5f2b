#!/usr/bin/env bash
# The soak's checks bite: fault injection must fail the run with a message
# that names the fault. Registered with CTest (tests/soak/CMakeLists.txt).
# Usage: soak_e2e.sh CASE /path/to/fusebox-run /path/to/fusebox_soak
# Each case exits 0 on success and 1 with a message on failure.
set -u

case_name=$1
launcher=$2
soak=$3

work=$(mktemp -d "${TMPDIR:-/tmp}/fusebox-soak-e2e.XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL [$case_name]: $*" >&2
  echo "--- output:" >&2
  tail -c 6000 "$work/out" >&2
  exit 1
}

run() {  # run COMMAND...: output in $work/out, status in $rc
  "$@" >"$work/out" 2>&1 </dev/null
  rc=$?
}

expect_failure_with() {  # expect_failure_with FIXED-STRING...
  [ "$rc" -ne 0 ] || fail "exited 0, want a failure"
  local s
  for s in "$@"; do
    grep -qF -- "$s" "$work/out" || fail "no '$s' in the output"
  done
}

# A short soak with the cache and plan swaps early, so the faults land in a
# run that has exercised everything once.
short=(--plan_every 3 --cache_every 7 --rebuild_every 11 --sample_every 2 --direct 2
       --max_tensor_kib 256 --cache_dir "$work/cache")

case "$case_name" in
  detects_corruption)
    run "$launcher" -n 3 --timeout 100 -- "$soak" "${short[@]}" --iterations 30 --corrupt_at 12
    expect_failure_with "[2]: fusebox_soak rank 2: FAILED: 1 wrong result(s) on rank 2/3: iteration 12," \
                        "1 of " "elements differ, first at [0]" \
                        "rank(s) 2 found wrong results (see their messages); stopping"
    ;;
  detects_memory_growth)
    run "$launcher" -n 3 --timeout 100 -- "$soak" "${short[@]}" --iterations 40 --leak_kib 1024
    expect_failure_with "fusebox_soak FAILED rank 0/3: 40 iterations" "RSS grew by" \
                        "more than the bound 8.0MiB; samples: baseline 10:"
    ;;
  usage_errors)
    run "$soak" --iterations 0
    [ "$rc" -eq 2 ] || fail "--iterations 0 without --seconds: exit $rc, want 2"
    grep -qF "one of them > 0" "$work/out" || fail "no message for --iterations 0"
    run "$soak" --threads 0
    [ "$rc" -eq 2 ] || fail "--threads 0: exit $rc, want 2"
    run "$soak" extra
    [ "$rc" -eq 2 ] || fail "a positional argument: exit $rc, want 2"
    grep -qF "unexpected argument 'extra'" "$work/out" || fail "no message for 'extra'"
    ;;
  *)
    echo "unknown case $case_name" >&2
    exit 2
    ;;
esac
echo "PASS [$case_name]"
