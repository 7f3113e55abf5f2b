#!/usr/bin/env bash
# The soak's checks bite: fault injection must fail the run with a message
# that names the fault. Registered with CTest (tests/soak/CMakeLists.txt).
# Usage: soak_e2e.sh CASE /path/to/fusebox-run /path/to/fusebox_soak
# Each case exits 0 on success and 1 with a message on failure.
set -u
# shellcheck source-path=SCRIPTDIR source=../lib/e2e.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/e2e.sh"
e2e_need_args 3 "$0 CASE /path/to/fusebox-run /path/to/fusebox_soak" "$@"

E2E_CASE=$1
launcher=$2
soak=$3
e2e_need_exec "$launcher" fusebox-run
e2e_need_exec "$soak" fusebox_soak

e2e_workdir fusebox-soak-e2e
work=$E2E_WORK
E2E_SHOW_BYTES=6000

expect_failure_with() {  # expect_failure_with FIXED-STRING...: in stdout or stderr
  [ "$rc" -ne 0 ] || e2e_fail "exited 0, want a failure"
  local s
  for s in "$@"; do
    grep -qF -- "$s" "$work/stdout" "$work/stderr" || e2e_fail "no '$s' in the output"
  done
}

# A short soak with the cache and plan swaps early, so the faults land in a
# run that has exercised everything once.
short=(--plan_every 3 --cache_every 7 --rebuild_every 11 --sample_every 2 --direct 2
       --max_tensor_kib 256 --cache_dir "$work/cache")

case "$E2E_CASE" in
  detects_corruption)
    e2e_capture "$launcher" -n 3 --timeout 100 -- "$soak" "${short[@]}" --iterations 30 --corrupt_at 12
    expect_failure_with "[2]: fusebox_soak rank 2: FAILED: 1 wrong result(s) on rank 2/3: iteration 12," \
                        "1 of " "elements differ, first at [0]" \
                        "rank(s) 2 found wrong results (see their messages); stopping"
    ;;
  detects_memory_growth)
    e2e_capture "$launcher" -n 3 --timeout 100 -- "$soak" "${short[@]}" --iterations 40 --leak_kib 1024
    expect_failure_with "fusebox_soak FAILED rank 0/3: 40 iterations" "RSS grew by" \
                        "more than the bound 8.0MiB; samples: baseline 10:"
    ;;
  usage_errors)
    e2e_capture "$soak" --iterations 0
    e2e_expect_status 2 "--iterations 0 without --seconds"
    grep -qF "one of them > 0" "$work/stdout" "$work/stderr" || e2e_fail "no message for --iterations 0"
    e2e_capture "$soak" --threads 0
    e2e_expect_status 2 "--threads 0"
    e2e_capture "$soak" extra
    e2e_expect_status 2 "a positional argument"
    grep -qF "unexpected argument 'extra'" "$work/stdout" "$work/stderr" ||
      e2e_fail "no message for 'extra'"
    ;;
  *)
    e2e_unknown_case
    ;;
esac
echo "PASS [$E2E_CASE]"
