#!/usr/bin/env bash
# End-to-end checks of the real fusebox-run binary; registered with CTest.
# Usage: fusebox_run_e2e.sh CASE /path/to/fusebox-run [/path/to/store_probe]
# Each case exits 0 on success and 1 with a message on failure.
set -u
# shellcheck source-path=SCRIPTDIR source=../lib/e2e.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/e2e.sh"
e2e_need_args 2 "$0 CASE /path/to/fusebox-run [/path/to/store_probe]" "$@"

E2E_CASE=$1
launcher=$2
probe=${3:-}
e2e_need_exec "$launcher" fusebox-run

e2e_workdir fusebox-run-e2e
work=$E2E_WORK
# A tag unique to this run: sleeping ranks run "sleep 30.<tag>", so that
# pgrep finds exactly this test's processes even when tests run in parallel.
tag="$$$RANDOM"
sleepers="sleep 30\\.${tag}\$"
# shellcheck disable=SC2317  # called by the EXIT trap
kill_sleepers() { e2e_kill_procs "$sleepers"; }
e2e_at_exit kill_sleepers

# Fails unless no "sleep 30.<tag>" process is left (waits up to 2 s for
# processes the launcher signalled to finish dying).
expect_no_sleepers() { e2e_expect_no_procs "$sleepers" 2 "ranks left behind"; }

# Fails if any pid listed in $work/pid.* is still alive.
expect_pids_gone() {
  local f pid
  for f in "$work"/pid.*; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
      e2e_fail "rank process $pid ($(basename "$f")) is still alive"
    fi
  done
}

run() { e2e_capture "$launcher" "$@"; }  # run ARGS...: runs the launcher, sets $rc

# pid_files N: N files $work/pid.* (called by e2e_wait_until)
# shellcheck disable=SC2317,SC2012
pid_files() { [ "$(ls "$work"/pid.* 2>/dev/null | wc -l)" -eq "$1" ]; }

case "$E2E_CASE" in

rank_environment)
  # (a) every rank's variables, with the "[rank]: " prefix.
  run -n 3 -- sh -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE'
  e2e_expect_status 0
  for r in 0 1 2; do e2e_expect_line "$work/stdout" "[$r]: $r 3 $r 3"; done
  [ "$(wc -l <"$work/stdout")" -eq 3 ] || e2e_fail "want exactly 3 lines of stdout"
  run -n 2 --env GREETING=hi -- sh -c \
    'echo "$FUSEBOX_STORE_ADDR $FUSEBOX_STORE_PORT $FUSEBOX_AGENT_STORE $GREETING $MASTER_ADDR $MASTER_PORT"'
  e2e_expect_status 0
  grep -qE '^\[0\]: 127\.0\.0\.1 [1-9][0-9]* 1 hi 127\.0\.0\.1 [1-9][0-9]*$' "$work/stdout" ||
    e2e_fail "FUSEBOX_STORE_*/FUSEBOX_AGENT_STORE/--env/MASTER_* not as expected"
  port0=$(sed -n 's/^\[0\]: [^ ]* \([0-9]*\) .*/\1/p' "$work/stdout")
  port1=$(sed -n 's/^\[1\]: [^ ]* \([0-9]*\) .*/\1/p' "$work/stdout")
  [ -n "$port0" ] && [ "$port0" = "$port1" ] || e2e_fail "ranks got different ports"
  torch0=$(sed -n 's/^\[0\]: .* \([0-9]*\)$/\1/p' "$work/stdout")
  torch1=$(sed -n 's/^\[1\]: .* \([0-9]*\)$/\1/p' "$work/stdout")
  [ -n "$torch0" ] && [ "$torch0" = "$torch1" ] || e2e_fail "ranks got different MASTER_PORTs"
  # MASTER_PORT is left free for the command (torch's env:// binds it).
  [ "$torch0" != "$port0" ] || e2e_fail "MASTER_PORT is fusebox's store port ($port0)"
  ;;

prefix_output)
  # stdout and stderr stay apart, lines stay whole, a final line without a
  # newline is still printed, and flags after the command pass through.
  run -n 2 -- sh -c 'printf "out a\nout "; printf "b\n" ; echo "err $RANK" >&2; printf "tail $RANK"' -n 9
  e2e_expect_status 0
  for r in 0 1; do
    e2e_expect_line "$work/stdout" "[$r]: out a"
    e2e_expect_line "$work/stdout" "[$r]: out b"
    e2e_expect_line "$work/stdout" "[$r]: tail $r"
    e2e_expect_line "$work/stderr" "[$r]: err $r"
  done
  grep -q 'err' "$work/stdout" && e2e_fail "stderr leaked into stdout"
  [ "$(wc -l <"$work/stdout")" -eq 6 ] || e2e_fail "want exactly 6 lines of stdout"
  ;;

heavy_output)
  # Lots of output from every rank on both streams: no deadlock, no line
  # lost, none torn or interleaved with another rank's.
  n=100000
  run -n 4 --timeout 12 -- sh -c "seq 1 $n; seq 1 $n >&2"
  e2e_expect_status 0
  for stream in stdout stderr; do
    total=$(wc -l <"$work/$stream")
    [ "$total" -eq $((4 * n)) ] || e2e_fail "$stream has $total lines, want $((4 * n))"
    bad=$(grep -cvE '^\[[0-3]\]: [0-9]+$' "$work/$stream")
    [ "$bad" -eq 0 ] || e2e_fail "$stream has $bad malformed lines"
    for r in 0 1 2 3; do
      got=$(grep -c "^\[$r\]: " "$work/$stream")
      [ "$got" -eq "$n" ] || e2e_fail "rank $r has $got lines on $stream, want $n"
      last=$(grep "^\[$r\]: " "$work/$stream" | tail -n 1)
      [ "$last" = "[$r]: $n" ] || e2e_fail "rank $r's $stream is out of order"
    done
  done
  ;;

separate_output)
  run -n 2 --output separate --output-dir "$work/logs" -- sh -c \
    'echo "out $RANK"; echo "err $RANK" >&2'
  e2e_expect_status 0
  for r in 0 1; do
    [ "$(cat "$work/logs/rank.$r.out")" = "out $r" ] || e2e_fail "rank.$r.out"
    [ "$(cat "$work/logs/rank.$r.err")" = "err $r" ] || e2e_fail "rank.$r.err"
  done
  [ -s "$work/stdout" ] && e2e_fail "separate mode wrote to the launcher's stdout"
  ;;

plain_output)
  run -n 2 --output plain -- sh -c 'echo "plain $RANK"'
  e2e_expect_status 0
  e2e_expect_line "$work/stdout" "plain 0"
  e2e_expect_line "$work/stdout" "plain 1"
  ;;

rank_failure)
  # (b) rank 1 exits 3 while the others sleep: the launcher reports it,
  # stops the rest quickly and exits non-zero.
  start=$(e2e_now_ms)
  run -n 3 --env TAG="$tag" -- sh -c \
    'echo $$ > '"$work"'/pid.$RANK; if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; sleep 30.$TAG'
  elapsed=$(($(e2e_now_ms) - start))
  [ "$rc" -ne 0 ] || e2e_fail "exit status 0 although rank 1 failed"
  [ "$rc" -eq 3 ] || e2e_fail "exit status $rc, want the failing rank's 3"
  [ "$elapsed" -lt 10000 ] || e2e_fail "took ${elapsed} ms, want < 10 s"
  grep -qF "fusebox-run: rank 1 exited with status 3" "$work/stderr" ||
    e2e_fail "the failing rank is not named"
  [ "$(ls "$work"/pid.* | wc -l)" -eq 3 ] || e2e_fail "not every rank started"
  expect_pids_gone
  expect_no_sleepers
  ;;

rank_killed)
  # A rank killed by a signal is reported by signal name; exit 128+9.
  run -n 2 --env TAG="$tag" -- sh -c \
    'if [ "$RANK" = 0 ]; then kill -KILL $$; fi; sleep 30.$TAG'
  e2e_expect_status 137
  grep -qF "fusebox-run: rank 0 killed by signal SIGKILL" "$work/stderr" ||
    e2e_fail "the killed rank is not reported"
  expect_no_sleepers
  ;;

failure_grace)
  # With --failure-grace the others may report the failure themselves: rank 1
  # exits on its own 0.7 s after rank 0 failed (its exit is reported, the
  # status stays the first failure's); rank 2 never exits and is stopped
  # once the grace has passed.
  start=$(e2e_now_ms)
  run -n 3 --failure-grace 1.5 --env TAG="$tag" -- sh -c \
    'case $RANK in 0) exit 3;; 1) sleep 0.7; exit 4;; *) sleep 30.$TAG;; esac'
  elapsed=$(($(e2e_now_ms) - start))
  [ "$rc" -eq 3 ] || e2e_fail "exit status $rc, want the first failure's 3"
  grep -qF "fusebox-run: rank 1 exited with status 4" "$work/stderr" ||
    e2e_fail "rank 1's own exit is not reported"
  grep -qF "(--failure-grace of 1.5s expired)" "$work/stderr" ||
    e2e_fail "rank 2 was not stopped at the end of the grace"
  [ "$elapsed" -ge 1400 ] || e2e_fail "stopped after ${elapsed} ms, before --failure-grace"
  [ "$elapsed" -lt 5000 ] || e2e_fail "took ${elapsed} ms, want about 1.5 s"
  expect_no_sleepers
  ;;

sigterm_forwarding)
  # (c) SIGTERM to the launcher terminates every rank; the launcher fails.
  "$launcher" -n 3 --env TAG="$tag" -- sh -c \
    'echo $$ > '"$work"'/pid.$RANK; sleep 30.$TAG' \
    >"$work/stdout" 2>"$work/stderr" </dev/null &
  launcher_pid=$!
  e2e_wait_until 5 pid_files 3 || e2e_fail "ranks did not start"
  sleep 0.2  # let the shells start their sleeps
  start=$(e2e_now_ms)
  kill -TERM "$launcher_pid"
  wait "$launcher_pid"
  rc=$?
  elapsed=$(($(e2e_now_ms) - start))
  [ "$rc" -ne 0 ] || e2e_fail "exit status 0 after SIGTERM"
  [ "$rc" -eq 143 ] || e2e_fail "exit status $rc, want 128+SIGTERM = 143"
  [ "$elapsed" -lt 4000 ] || e2e_fail "took ${elapsed} ms to stop, want < 4 s"
  grep -qF "got SIGTERM" "$work/stderr" || e2e_fail "no report of the signal"
  expect_pids_gone
  expect_no_sleepers
  ;;

grace_kill)
  # Ranks that ignore SIGTERM are killed once --grace has passed.
  start=$(e2e_now_ms)
  run -n 2 --grace 1 --env TAG="$tag" -- sh -c \
    'trap "" TERM; if [ "$RANK" = 1 ]; then sleep 0.5; exit 5; fi; sleep 30.$TAG'
  elapsed=$(($(e2e_now_ms) - start))
  e2e_expect_status 5
  [ "$elapsed" -ge 900 ] || e2e_fail "SIGKILL came after ${elapsed} ms, before --grace"
  [ "$elapsed" -lt 6000 ] || e2e_fail "took ${elapsed} ms, want about 1 s"
  grep -qF "sending SIGKILL" "$work/stderr" || e2e_fail "no report of SIGKILL"
  expect_no_sleepers
  ;;

timeout)
  start=$(e2e_now_ms)
  run -n 2 --timeout 1 --grace 2 --env TAG="$tag" -- sh -c 'sleep 30.$TAG'
  elapsed=$(($(e2e_now_ms) - start))
  e2e_expect_status 124
  [ "$elapsed" -lt 5000 ] || e2e_fail "took ${elapsed} ms, want about 1 s"
  grep -qF "timeout of 1s expired" "$work/stderr" || e2e_fail "no timeout report"
  expect_no_sleepers
  ;;

exec_failure)
  run -n 2 -- "$work/no-such-program" arg
  e2e_expect_status 127
  grep -qF "cannot execute '$work/no-such-program'" "$work/stderr" ||
    e2e_fail "no clear message for a missing program"
  ;;

usage_errors)
  run -n 2 --bogus -- true
  e2e_expect_status 2 "unknown option"
  grep -qF "unknown option '--bogus'" "$work/stderr" || e2e_fail "unclear message"
  run -- true
  e2e_expect_status 2 "missing -n"
  run --help
  e2e_expect_status 0 "--help"
  grep -qF "Usage: fusebox-run" "$work/stdout" || e2e_fail "--help prints no usage"
  ;;

log_level)
  # Errors always show; --log-level info adds each rank's start and exit;
  # error hides the warnings; a bad level is a usage error naming its source.
  run -n 2 --log-level info -- sh -c 'exit 0'
  e2e_expect_status 0 "info"
  for r in 0 1; do
    grep -qE "^fusebox-run: info: rank $r started: pid [0-9]+" "$work/stderr" ||
      e2e_fail "no start of rank $r at info"
    grep -qF "fusebox-run: info: rank $r exited with status 0" "$work/stderr" ||
      e2e_fail "no exit of rank $r at info"
  done
  e2e_capture env -u FUSEBOX_LOG_LEVEL "$launcher" -n 2 -- sh -c 'exit 0'
  e2e_expect_status 0 "default level"
  [ ! -s "$work/stderr" ] || e2e_fail "the default level printed: $(cat "$work/stderr")"
  FUSEBOX_LOG_LEVEL=error run -n 2 --env TAG="$tag" -- \
    sh -c 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 30.$TAG'
  e2e_expect_status 3 "FUSEBOX_LOG_LEVEL=error"
  grep -qF "fusebox-run: rank 1 exited with status 3" "$work/stderr" || e2e_fail "error hidden"
  grep -qF "warning:" "$work/stderr" && e2e_fail "a warning shown at level error"
  expect_no_sleepers
  FUSEBOX_LOG_LEVEL=loud run -n 1 -- true
  e2e_expect_status 2 "bad FUSEBOX_LOG_LEVEL"
  grep -qF "FUSEBOX_LOG_LEVEL" "$work/stderr" || e2e_fail "the bad variable is not named"
  run -n 1 --log-level=loud -- true
  e2e_expect_status 2 "bad --log-level"
  grep -qF -- "--log-level: " "$work/stderr" || e2e_fail "the bad flag is not named"
  # The flag wins over the variable.
  FUSEBOX_LOG_LEVEL=loud run -n 1 --log-level info -- true
  e2e_expect_status 0 "--log-level over a bad FUSEBOX_LOG_LEVEL"
  grep -qF "fusebox-run: info: rank 0 started" "$work/stderr" || e2e_fail "the flag did not win"
  ;;

all_succeed)
  run -n 4 -- sh -c 'exit 0'
  e2e_expect_status 0
  run -n 1 -- false
  e2e_expect_status 1
  ;;

store_allgather)
  # (d) the ranks reach the store the launcher hosts.
  e2e_need_exec "$probe" "store probe"
  run -n 4 --timeout 12 -- "$probe"
  e2e_expect_status 0
  for r in 0 1 2 3; do
    e2e_expect_line "$work/stdout" "[$r]: store_probe: rank $r gathered 4 ranks"
  done
  run -n 2 --master-port 0 --master-addr localhost --timeout 12 -- "$probe"
  e2e_expect_status 0 "with --master-addr localhost"
  ;;

job_token)
  # The launcher's store takes FUSEBOX_JOB_TOKEN from its environment; ranks
  # inherit it and get in; a rank whose token differs is refused, by name.
  e2e_need_exec "$probe" "store probe"
  FUSEBOX_JOB_TOKEN=t0ken run -n 3 --timeout 12 -- "$probe"
  e2e_expect_status 0 "with the job's token"
  e2e_expect_line "$work/stdout" "[2]: store_probe: rank 2 gathered 3 ranks"
  FUSEBOX_JOB_TOKEN=t0ken run -n 2 --timeout 12 -- env FUSEBOX_JOB_TOKEN=other "$probe"
  [ "$rc" -ne 0 ] || e2e_fail "a rank with another token got in"
  grep -q "wrong job token" "$work/stdout" "$work/stderr" || e2e_fail "the refusal is not reported"
  ;;

*)
  e2e_unknown_case
  ;;
esac
exit 0
