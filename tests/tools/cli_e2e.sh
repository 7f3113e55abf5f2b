#!/usr/bin/env bash
# The absl-flags tools' command-line conventions, on the real binaries:
# --help lists the tool's own flags with defaults, --version prints fusebox's
# version, usage errors exit 2 and name the flag, and nothing names an
# internal module or "rank -1".
#   cli_e2e.sh TOOL_PATH TOOL_NAME A_FLAG
set -u
tool=$1 name=$2 flag=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$tool" --help 2>&1); rc=$?
[ "$rc" -eq 0 ] || fail "--help exited $rc"
grep -q -- "--$flag" <<<"$out" || fail "--help does not list --$flag:"$'\n'"$out"
grep -q "default:" <<<"$out" || fail "--help shows no defaults"
grep -q "No flags matched" <<<"$out" && fail "--help says 'No flags matched'"
grep -q "$name: $name:" <<<"$out" && fail "--help repeats the program name"

out=$("$tool" --version 2>&1); rc=$?
[ "$rc" -eq 0 ] || fail "--version exited $rc"
grep -qE "^$name [0-9]+\.[0-9]+\.[0-9]+" <<<"$out" || fail "--version printed: $out"
grep -q "NDEBUG" <<<"$out" && fail "--version talks about NDEBUG: $out"

out=$("$tool" --no_such_flag 2>&1); rc=$?
[ "$rc" -eq 2 ] || fail "an unknown flag exited $rc, want 2"
grep -q -- "--no_such_flag" <<<"$out" || fail "the error does not name the flag: $out"

out=$("$tool" "--$flag=not-a-value-of-any-type-%%" 2>&1); rc=$?
[ "$rc" -eq 2 ] || fail "a bad value exited $rc, want 2 ($out)"
grep -q -- "--$flag" <<<"$out" || fail "the error does not name --$flag: $out"
grep -q "rank -1" <<<"$out" && fail "an error names rank -1: $out"
# The same flag spelled with dashes is the same flag (one convention for
# every tool: --cache-dir is --cache_dir).
dashed=${flag//_/-}
out=$("$tool" "--$dashed=not-a-value-of-any-type-%%" 2>&1); rc=$?
[ "$rc" -eq 2 ] || fail "--$dashed with a bad value exited $rc, want 2 ($out)"
grep -q "unknown flag" <<<"$out" && fail "--$dashed is not taken for --$flag: $out"
echo "OK $name"
