# shellcheck shell=bash
# Shared helpers of the bash end-to-end tests (tests/*/*_e2e.sh,
# tests/install/run_consumer_test.sh). Sourced, never run:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../lib/e2e.sh"
#
# Works under `set -u` and under `set -euo pipefail`; sets no shell option
# itself. Every check fails the script with e2e_fail, which exits 1, so a
# failing check fails the CTest case with a message that names what was
# expected and what was seen. (Like any `exit`, e2e_fail inside `$(...)` or a
# pipeline ends only that subshell: call the checks from the script's own
# shell.) The library owns the EXIT trap: a script that needs more done at
# exit registers it with e2e_at_exit rather than setting its own trap.
#
# State (globals the helpers read and set):
#   E2E_CASE        the case being run; set it before anything can fail.
#                   Failures print "FAIL [$E2E_CASE]: ..." ("FAIL: ..."
#                   when it is empty).
#   E2E_WORK        the work directory, made by e2e_workdir.
#   E2E_SHOW_BYTES  how much of each output file e2e_fail prints: a file up
#                   to 2 x E2E_SHOW_BYTES bytes is printed whole, a longer
#                   one as its first and last E2E_SHOW_BYTES (default 4000).
#   rc              the exit status of the last e2e_capture or e2e_run.
#
# Arguments and set-up:
#   e2e_need_args MIN USAGE ARGS...   fewer than MIN ARGS: prints
#                     "usage: USAGE" to stderr and exits 2.
#   e2e_need_exec PATH [WHAT]         fails unless PATH is an executable file
#                     (a bare name: unless it is a command on PATH): "WHAT
#                     'PATH' is not executable" (WHAT defaults to "program").
#   e2e_workdir PREFIX                makes E2E_WORK, a fresh directory
#                     ${TMPDIR:-/tmp}/PREFIX.XXXXXX, and removes it at exit
#                     (KEEP_TMP=1 keeps it and prints "kept DIR"). Registers
#                     E2E_WORK/stdout and E2E_WORK/stderr with e2e_show_on_fail.
#   e2e_at_exit COMMAND               runs COMMAND (a function or program
#                     name, no arguments) at exit, before E2E_WORK is
#                     removed; the last registered runs first. Its failures
#                     are ignored and do not change the exit status.
#   e2e_unknown_case                  "unknown case 'CASE'" to stderr, exit 2
#                     (for the `*)` branch of a script's case dispatch).
#
# Failing:
#   e2e_fail MESSAGE...               prints "FAIL [CASE]: MESSAGE" and then
#                     every existing file registered with e2e_show_on_fail
#                     (see E2E_SHOW_BYTES) to stderr, and exits 1.
#   e2e_show_on_fail FILE...          registers FILEs for e2e_fail to print.
#
# Running a command under test (stdin is /dev/null; output goes to
# E2E_WORK/stdout and E2E_WORK/stderr, replacing the last command's):
#   e2e_capture COMMAND ARGS...       runs it; its exit status is in $rc.
#                     Returns 0 whatever the status (check it with
#                     e2e_expect_status).
#   e2e_run WANT COMMAND ARGS...      e2e_capture, then fails unless the
#                     status is WANT: "'NAME ARGS' exited RC, expected WANT"
#                     (NAME is COMMAND without its directory).
#   e2e_expect_status WANT [WHAT]     fails unless $rc is WANT:
#                     "WHAT: exit status RC, want WANT".
#
# Output checks (FILE: a path, or a bare name such as "stdout" for
# E2E_WORK/NAME; a FILE that does not exist fails every check; TEXT is a
# fixed string, not a pattern):
#   e2e_expect FILE TEXT              FILE contains TEXT: "no 'TEXT' in FILE".
#   e2e_expect_not FILE TEXT          FILE does not contain TEXT:
#                     "unexpected 'TEXT' in FILE".
#   e2e_expect_line FILE LINE         FILE has LINE as a whole line:
#                     "missing line 'LINE' in FILE".
#   (FILE is named by its base name in the messages.)
#
# Time and processes:
#   e2e_now_ms                        prints the time in milliseconds.
#   e2e_wait_until SECONDS COMMAND ARGS...  runs COMMAND every 0.1 s until it
#                     succeeds (returns 0) or SECONDS (a whole number) have
#                     passed (then returns COMMAND's status at the deadline,
#                     where it is tried once more).
#   e2e_expect_no_procs PATTERN SECONDS WHAT  waits up to SECONDS for no
#                     process whose command line matches the extended regular
#                     expression PATTERN (pgrep -f) to be left, else fails:
#                     "WHAT: <pid and command line of each>".
#   e2e_kill_procs PATTERN            SIGKILLs every process whose command
#                     line matches PATTERN (pgrep -f); for cleanups, so that
#                     PATTERN must be unique to the test's own processes.

E2E_CASE=
E2E_WORK=
E2E_FILE=
E2E_SHOW_BYTES=${E2E_SHOW_BYTES:-4000}
E2E_SHOW_FILES=()
E2E_EXIT_COMMANDS=()
rc=0

e2e_need_args() {
  local min=$1 usage=$2
  shift 2
  if [ "$#" -lt "$min" ]; then
    echo "usage: $usage" >&2
    exit 2
  fi
}

e2e_need_exec() {
  local path=$1 what=${2:-program}
  case $path in
    */*) [ -f "$path" ] && [ -x "$path" ] && return 0 ;;
    ?*) command -v "$path" >/dev/null 2>&1 && return 0 ;;
  esac
  e2e_fail "$what '$path' is not executable"
}

e2e_workdir() {
  E2E_WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX") || {
    echo "FAIL${E2E_CASE:+ [$E2E_CASE]}: cannot make a temporary directory" >&2
    exit 1
  }
  e2e_show_on_fail "$E2E_WORK/stdout" "$E2E_WORK/stderr"
  trap e2e_exit_trap EXIT
}

e2e_at_exit() {
  E2E_EXIT_COMMANDS+=("$1")
  trap e2e_exit_trap EXIT
}

# The EXIT trap: the registered commands, last first, then the work directory.
# The script's exit status is kept.
e2e_exit_trap() {
  local status=$? i
  set +e
  for ((i = ${#E2E_EXIT_COMMANDS[@]} - 1; i >= 0; i--)); do
    "${E2E_EXIT_COMMANDS[i]}"
  done
  if [ -n "$E2E_WORK" ] && [ -d "$E2E_WORK" ]; then
    if [ "${KEEP_TMP:-0}" = 1 ]; then
      echo "kept $E2E_WORK"
    else
      rm -rf "$E2E_WORK"
    fi
  fi
  return "$status"
}

e2e_unknown_case() {
  echo "unknown case '$E2E_CASE'" >&2
  exit 2
}

e2e_show_on_fail() {
  E2E_SHOW_FILES+=("$@")
}

# Prints FILE to stderr under a "--- NAME:" header, cut in the middle when it
# is longer than 2 x E2E_SHOW_BYTES.
e2e_show_file() {
  local f=$1 n=$E2E_SHOW_BYTES size
  size=$(wc -c <"$f")
  if [ "$size" -eq 0 ]; then
    echo "--- $(basename "$f"): (empty)" >&2
  elif [ "$size" -le $((2 * n)) ]; then
    echo "--- $(basename "$f"):" >&2
    cat "$f" >&2
  else
    echo "--- $(basename "$f") ($size bytes; the first and last $n):" >&2
    head -c "$n" "$f" >&2
    printf '\n[... %d bytes left out ...]\n' $((size - 2 * n)) >&2
    tail -c "$n" "$f" >&2
  fi
  # End on a new line so that the next header starts on its own.
  [ "$size" -eq 0 ] || [ -z "$(tail -c 1 "$f")" ] || echo >&2
}

e2e_fail() {
  echo "FAIL${E2E_CASE:+ [$E2E_CASE]}: $*" >&2
  local f
  for f in ${E2E_SHOW_FILES[@]+"${E2E_SHOW_FILES[@]}"}; do
    if [ -f "$f" ]; then e2e_show_file "$f"; fi
  done
  exit 1
}

e2e_capture() {
  if "$@" >"$E2E_WORK/stdout" 2>"$E2E_WORK/stderr" </dev/null; then
    rc=0
  else
    rc=$?
  fi
  return 0
}

e2e_run() {
  local want=$1
  shift
  e2e_capture "$@"
  if [ "$rc" -ne "$want" ]; then
    local shown=("${1##*/}" "${@:2}")
    e2e_fail "'${shown[*]}' exited $rc, expected $want"
  fi
}

e2e_expect_status() {
  if [ "$rc" -ne "$1" ]; then
    e2e_fail "${2:+$2: }exit status $rc, want $1"
  fi
}

# Sets E2E_FILE to the path of an output file (a bare name is E2E_WORK's);
# fails if there is no such file.
e2e_output_file() {
  case $1 in
    */*) E2E_FILE=$1 ;;
    *) E2E_FILE=$E2E_WORK/$1 ;;
  esac
  [ -f "$E2E_FILE" ] || e2e_fail "no output file $(basename "$E2E_FILE")"
}

e2e_expect() {
  e2e_output_file "$1"
  grep -qF -- "$2" "$E2E_FILE" || e2e_fail "no '$2' in $(basename "$E2E_FILE")"
}

e2e_expect_not() {
  e2e_output_file "$1"
  if grep -qF -- "$2" "$E2E_FILE"; then
    e2e_fail "unexpected '$2' in $(basename "$E2E_FILE")"
  fi
}

e2e_expect_line() {
  e2e_output_file "$1"
  grep -qxF -- "$2" "$E2E_FILE" || e2e_fail "missing line '$2' in $(basename "$E2E_FILE")"
}

e2e_now_ms() { date +%s%3N; }

e2e_wait_until() {
  local until=$(($(e2e_now_ms) + $1 * 1000))
  shift
  while [ "$(e2e_now_ms)" -lt "$until" ]; do
    "$@" && return 0
    sleep 0.1
  done
  "$@"
}

e2e_no_procs() { ! pgrep -f -- "$1" >/dev/null; }

e2e_expect_no_procs() {
  e2e_wait_until "$2" e2e_no_procs "$1" ||
    e2e_fail "$3: $(pgrep -af -- "$1" | tr '\n' ';')"
}

e2e_kill_procs() {
  local pid
  for pid in $(pgrep -f -- "$1"); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  return 0
}
