#!/usr/bin/env bash
# End-to-end checks of the real fusebox-run binary; registered with CTest.
# Usage: fusebox_run_e2e.sh CASE /path/to/fusebox-run [/path/to/store_probe]
# Each case exits 0 on success and 1 with a message on failure.
set -u

case_name=$1
launcher=$2
probe=${3:-}

work=$(mktemp -d "${TMPDIR:-/tmp}/fusebox-run-e2e.XXXXXX")
# A tag unique to this run: sleeping ranks run "sleep 30.<tag>", so that
# pgrep finds exactly this test's processes even when tests run in parallel.
tag="$$$RANDOM"
cleanup() {
  local pid
  for pid in $(pgrep -f "sleep 30\\.${tag}\$"); do kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL [$case_name]: $*" >&2
  for f in "$work"/stdout "$work"/stderr; do
    [ -f "$f" ] && { echo "--- $(basename "$f"):" >&2; head -c 4000 "$f" >&2; }
  done
  exit 1
}

expect_line() {  # expect_line FILE LINE: FILE has LINE as a whole line
  grep -qxF -- "$2" "$1" || fail "missing line '$2' in $(basename "$1")"
}

now_ms() { date +%s%3N; }

# Fails unless no "sleep 30.<tag>" process is left (waits up to 2 s for
# processes the launcher signalled to finish dying).
expect_no_sleepers() {
  for _ in $(seq 20); do
    pgrep -f "sleep 30\\.${tag}\$" >/dev/null || return 0
    sleep 0.1
  done
  fail "ranks left behind: $(pgrep -af "sleep 30\\.${tag}\$" | tr '\n' ';')"
}

# Fails if any pid listed in $work/pid.* is still alive.
expect_pids_gone() {
  local f pid
  for f in "$work"/pid.*; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
      fail "rank process $pid ($(basename "$f")) is still alive"
    fi
  done
}

run() {  # run ARGS...: runs the launcher, sets $rc
  "$launcher" "$@" >"$work/stdout" 2>"$work/stderr" </dev/null
  rc=$?
}

case "$case_name" in

rank_environment)
  # (a) every rank's variables, with the "[rank]: " prefix.
  run -n 3 -- sh -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE'
  [ "$rc" -eq 0 ] || fail "exit status $rc, want 0"
  for r in 0 1 2; do expect_line "$work/stdout" "[$r]: $r 3 $r 3"; done
  [ "$(wc -l <"$work/stdout")" -eq 3 ] || fail "want exactly 3 lines of stdout"
  run -n 2 --env GREETING=hi -- sh -c \
    'echo "$FUSEBOX_STORE_ADDR $FUSEBOX_STORE_PORT $FUSEBOX_AGENT_STORE $GREETING $MASTER_ADDR $MASTER_PORT"'
  [ "$rc" -eq 0 ] || fail "exit status $rc, want 0"
  grep -qE '^\[0\]: 127\.0\.0\.1 [1-9][0-9]* 1 hi 127\.0\.0\.1 [1-9][0-9]*$' "$work/stdout" ||
    fail "FUSEBOX_STORE_*/FUSEBOX_AGENT_STORE/--env/MASTER_* not as expected"
  port0=$(sed -n 's/^\[0\]: [^ ]* \([0-9]*\) .*/\1/p' "$work/stdout")
  port1=$(sed -n 's/^\[1\]: [^ ]* \([0-9]*\) .*/\1/p' "$work/stdout")
  [ -n "$port0" ] && [ "$port0" = "$port1" ] || fail "ranks got different ports"
  torch0=$(sed -n 's/^\[0\]: .* \([0-9]*\)$/\1/p' "$work/stdout")
  torch1=$(sed -n 's/^\[1\]: .* \([0-9]*\)$/\1/p' "$work/stdout")
  [ -n "$torch0" ] && [ "$torch0" = "$torch1" ] || fail "ranks got different MASTER_PORTs"
  # MASTER_PORT is left free for the command (torch's env:// binds it).
  [ "$torch0" != "$port0" ] || fail "MASTER_PORT is fusebox's store port ($port0)"
  ;;

prefix_output)
  # stdout and stderr stay apart, lines stay whole, a final line without a
  # newline is still printed, and flags after the command pass through.
  run -n 2 -- sh -c 'printf "out a\nout "; printf "b\n" ; echo "err $RANK" >&2; printf "tail $RANK"' -n 9
  [ "$rc" -eq 0 ] || fail "exit status $rc, want 0"
  for r in 0 1; do
    expect_line "$work/stdout" "[$r]: out a"
    expect_line "$work/stdout" "[$r]: out b"
    expect_line "$work/stdout" "[$r]: tail $r"
    expect_line "$work/stderr" "[$r]: err $r"
  done
  grep -q 'err' "$work/stdout" && fail "stderr leaked into stdout"
  [ "$(wc -l <"$work/stdout")" -eq 6 ] || fail "want exactly 6 lines of stdout"
  ;;

heavy_output)
  # Lots of output from every rank on both streams: no deadlock, no line
  # lost, none torn or interleaved with another rank's.
  n=100000
  run -n 4 --timeout 12 -- sh -c "seq 1 $n; seq 1 $n >&2"
  [ "$rc" -eq 0 ] || fail "exit status $rc, want 0"
  for stream in stdout stderr; do
    total=$(wc -l <"$work/$stream")
    [ "$total" -eq $((4 * n)) ] || fail "$stream has $total lines, want $((4 * n))"
    bad=$(grep -cvE '^\[[0-3]\]: [0-9]+$' "$work/$stream")
    [ "$bad" -eq 0 ] || fail "$stream has $bad malformed lines"
    for r in 0 1 2 3; do
      got=$(grep -c "^\[$r\]: " "$work/$stream")
      [ "$got" -eq "$n" ] || fail "rank $r has $got lines on $stream, want $n"
      last=$(grep "^\[$r\]: " "$work/$stream" | tail -n 1)
      [ "$last" = "[$r]: $n" ] || fail "rank $r's $stream is out of order"
    done
  done
  ;;

separate_output)
  run -n 2 --output separate --output-dir "$work/logs" -- sh -c \
    'echo "out $RANK"; echo "err $RANK" >&2'
  [ "$rc" -eq 0 ] || fail "exit status $rc, want 0"
  for r in 0 1; do
    [ "$(cat "$work/logs/rank.$r.out")" = "out $r" ] || fail "rank.$r.out"
    [ "$(cat "$work/logs/rank.$r.err")" = "err $r" ] || fail "rank.$r.err"
  done
  [ -s "$work/stdout" ] && fail "separate mode wrote to the launcher's stdout"
  ;;

plain_output)
  run -n 2 --output plain -- sh -c 'echo "plain $RANK"'
  [ "$rc" -eq 0 ] || fail "exit status $rc, want 0"
  expect_line "$work/stdout" "plain 0"
  expect_line "$work/stdout" "plain 1"
  ;;

rank_failure)
  # (b) rank 1 exits 3 while the others sleep: the launcher reports it,
  # stops the rest quickly and exits non-zero.
  start=$(now_ms)
  run -n 3 --env TAG="$tag" -- sh -c \
    'echo $$ > '"$work"'/pid.$RANK; if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; sleep 30.$TAG'
  elapsed=$(($(now_ms) - start))
  [ "$rc" -ne 0 ] || fail "exit status 0 although rank 1 failed"
  [ "$rc" -eq 3 ] || fail "exit status $rc, want the failing rank's 3"
  [ "$elapsed" -lt 10000 ] || fail "took ${elapsed} ms, want < 10 s"
  grep -qF "fusebox-run: rank 1 exited with status 3" "$work/stderr" ||
    fail "the failing rank is not named"
  [ "$(ls "$work"/pid.* | wc -l)" -eq 3 ] || fail "not every rank started"
  expect_pids_gone
  expect_no_sleepers
  ;;

rank_killed)
  # A rank killed by a signal is reported by signal name; exit 128+9.
  run -n 2 --env TAG="$tag" -- sh -c \
    'if [ "$RANK" = 0 ]; then kill -KILL $$; fi; sleep 30.$TAG'
  [ "$rc" -eq 137 ] || fail "exit status $rc, want 137"
  grep -qF "fusebox-run: rank 0 killed by signal SIGKILL" "$work/stderr" ||
    fail "the killed rank is not reported"
  expect_no_sleepers
  ;;

failure_grace)
  # With --failure-grace the others may report the failure themselves: rank 1
  # exits on its own 0.7 s after rank 0 failed (its exit is reported, the
  # status stays the first failure's); rank 2 never exits and is stopped
  # once the grace has passed.
  start=$(now_ms)
  run -n 3 --failure-grace 1.5 --env TAG="$tag" -- sh -c \
    'case $RANK in 0) exit 3;; 1) sleep 0.7; exit 4;; *) sleep 30.$TAG;; esac'
  elapsed=$(($(now_ms) - start))
  [ "$rc" -eq 3 ] || fail "exit status $rc, want the first failure's 3"
  grep -qF "fusebox-run: rank 1 exited with status 4" "$work/stderr" ||
    fail "rank 1's own exit is not reported"
  grep -qF "(--failure-grace of 1.5s expired)" "$work/stderr" ||
    fail "rank 2 was not stopped at the end of the grace"
  [ "$elapsed" -ge 1400 ] || fail "stopped after ${elapsed} ms, before --failure-grace"
  [ "$elapsed" -lt 5000 ] || fail "took ${elapsed} ms, want about 1.5 s"
  expect_no_sleepers
  ;;

sigterm_forwarding)
  # (c) SIGTERM to the launcher terminates every rank; the launcher fails.
  "$launcher" -n 3 --env TAG="$tag" -- sh -c \
    'echo $$ > '"$work"'/pid.$RANK; sleep 30.$TAG' \
    >"$work/stdout" 2>"$work/stderr" </dev/null &
  launcher_pid=$!
  for _ in $(seq 100); do
    [ "$(ls "$work"/pid.* 2>/dev/null | wc -l)" -eq 3 ] && break
    sleep 0.05
  done
  [ "$(ls "$work"/pid.* 2>/dev/null | wc -l)" -eq 3 ] || fail "ranks did not start"
  sleep 0.2  # let the shells start their sleeps
  start=$(now_ms)
  kill -TERM "$launcher_pid"
  wait "$launcher_pid"
  rc=$?
  elapsed=$(($(now_ms) - start))
  [ "$rc" -ne 0 ] || fail "exit status 0 after SIGTERM"
  [ "$rc" -eq 143 ] || fail "exit status $rc, want 128+SIGTERM = 143"
  [ "$elapsed" -lt 4000 ] || fail "took ${elapsed} ms to stop, want < 4 s"
  grep -qF "got SIGTERM" "$work/stderr" || fail "no report of the signal"
  expect_pids_gone
  expect_no_sleepers
  ;;

grace_kill)
  # Ranks that ignore SIGTERM are killed once --grace has passed.
  start=$(now_ms)
  run -n 2 --grace 1 --env TAG="$tag" -- sh -c \
    'trap "" TERM; if [ "$RANK" = 1 ]; then sleep 0.5; exit 5; fi; sleep 30.$TAG'
  elapsed=$(($(now_ms) - start))
  [ "$rc" -eq 5 ] || fail "exit status $rc, want 5"
  [ "$elapsed" -ge 900 ] || fail "SIGKILL came after ${elapsed} ms, before --grace"
  [ "$elapsed" -lt 6000 ] || fail "took ${elapsed} ms, want about 1 s"
  grep -qF "sending SIGKILL" "$work/stderr" || fail "no report of SIGKILL"
  expect_no_sleepers
  ;;

timeout)
  start=$(now_ms)
  run -n 2 --timeout 1 --grace 2 --env TAG="$tag" -- sh -c 'sleep 30.$TAG'
  elapsed=$(($(now_ms) - start))
  [ "$rc" -eq 124 ] || fail "exit status $rc, want 124"
  [ "$elapsed" -lt 5000 ] || fail "took ${elapsed} ms, want about 1 s"
  grep -qF "timeout of 1s expired" "$work/stderr" || fail "no timeout report"
  expect_no_sleepers
  ;;

exec_failure)
  run -n 2 -- "$work/no-such-program" arg
  [ "$rc" -eq 127 ] || fail "exit status $rc, want 127"
  grep -qF "cannot execute '$work/no-such-program'" "$work/stderr" ||
    fail "no clear message for a missing program"
  ;;

usage_errors)
  run -n 2 --bogus -- true
  [ "$rc" -eq 2 ] || fail "unknown option: exit status $rc, want 2"
  grep -qF "unknown option '--bogus'" "$work/stderr" || fail "unclear message"
  run -- true
  [ "$rc" -eq 2 ] || fail "missing -n: exit status $rc, want 2"
  run --help
  [ "$rc" -eq 0 ] || fail "--help: exit status $rc, want 0"
  grep -qF "Usage: fusebox-run" "$work/stdout" || fail "--help prints no usage"
  ;;

all_succeed)
  run -n 4 -- sh -c 'exit 0'
  [ "$rc" -eq 0 ] || fail "exit status $rc, want 0"
  run -n 1 -- false
  [ "$rc" -eq 1 ] || fail "exit status $rc, want 1"
  ;;

store_allgather)
  # (d) the ranks reach the store the launcher hosts.
  [ -x "$probe" ] || fail "store probe '$probe' is not executable"
  run -n 4 --timeout 12 -- "$probe"
  [ "$rc" -eq 0 ] || fail "exit status $rc, want 0"
  for r in 0 1 2 3; do
    expect_line "$work/stdout" "[$r]: store_probe: rank $r gathered 4 ranks"
  done
  run -n 2 --master-port 0 --master-addr localhost --timeout 12 -- "$probe"
  [ "$rc" -eq 0 ] || fail "with --master-addr localhost: exit status $rc"
  ;;

job_token)
  # The launcher's store takes FUSEBOX_JOB_TOKEN from its environment; ranks
  # inherit it and get in; a rank whose token differs is refused, by name.
  [ -x "$probe" ] || fail "store probe '$probe' is not executable"
  FUSEBOX_JOB_TOKEN=t0ken run -n 3 --timeout 12 -- "$probe"
  [ "$rc" -eq 0 ] || fail "with the job's token: exit status $rc"
  expect_line "$work/stdout" "[2]: store_probe: rank 2 gathered 3 ranks"
  FUSEBOX_JOB_TOKEN=t0ken run -n 2 --timeout 12 -- env FUSEBOX_JOB_TOKEN=other "$probe"
  [ "$rc" -ne 0 ] || fail "a rank with another token got in"
  grep -q "wrong job token" "$work/stdout" "$work/stderr" || fail "the refusal is not reported"
  ;;

*)
  echo "unknown case '$case_name'" >&2
  exit 2
  ;;
esac
exit 0
