#!/usr/bin/env bash
# The absl-flags tools' command-line conventions, on the real binaries:
# --help lists the tool's own flags with defaults, --version prints fusebox's
# version, usage errors exit 2 and name the flag, and nothing names an
# internal module or "rank -1".
# Also the log level: --log_level, else FUSEBOX_LOG_LEVEL, else warning; a bad
# one is a usage error naming which; lines name the tool and, once known, the
# rank.
#   cli_e2e.sh TOOL_PATH TOOL_NAME A_FLAG [FUSEBOX_RUN_PATH]
set -u
# shellcheck source-path=SCRIPTDIR source=../lib/e2e.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/e2e.sh"
e2e_need_args 3 "$0 TOOL_PATH TOOL_NAME A_FLAG [FUSEBOX_RUN_PATH]" "$@"
tool=$1 name=$2 flag=$3 launcher=${4:-}
e2e_need_exec "$tool" "$name"
[ -z "$launcher" ] || e2e_need_exec "$launcher" fusebox-run

out=$("$tool" --help 2>&1); rc=$?
[ "$rc" -eq 0 ] || e2e_fail "--help exited $rc"
grep -q -- "--$flag" <<<"$out" || e2e_fail "--help does not list --$flag:"$'\n'"$out"
grep -q "default:" <<<"$out" || e2e_fail "--help shows no defaults"
grep -q "No flags matched" <<<"$out" && e2e_fail "--help says 'No flags matched'"
grep -q "$name: $name:" <<<"$out" && e2e_fail "--help repeats the program name"
# The flags the tools share (tools/tool_flags.h) are listed too, once.
for shared in log_level progress profile; do
  [ "$(grep -cE -- "^ +--$shared \\(" <<<"$out")" -eq 1 ] || e2e_fail "--help lists --$shared not once:"$'\n'"$out"
done
[ "$(grep -c "^$name: " <<<"$out")" -le 1 ] || e2e_fail "--help prints the usage twice"

out=$("$tool" --version 2>&1); rc=$?
[ "$rc" -eq 0 ] || e2e_fail "--version exited $rc"
grep -qE "^$name [0-9]+\.[0-9]+\.[0-9]+" <<<"$out" || e2e_fail "--version printed: $out"
grep -q "NDEBUG" <<<"$out" && e2e_fail "--version talks about NDEBUG: $out"

out=$("$tool" --no_such_flag 2>&1); rc=$?
[ "$rc" -eq 2 ] || e2e_fail "an unknown flag exited $rc, want 2"
grep -q -- "--no_such_flag" <<<"$out" || e2e_fail "the error does not name the flag: $out"

out=$("$tool" "--$flag=not-a-value-of-any-type-%%" 2>&1); rc=$?
[ "$rc" -eq 2 ] || e2e_fail "a bad value exited $rc, want 2 ($out)"
grep -q -- "--$flag" <<<"$out" || e2e_fail "the error does not name --$flag: $out"
grep -q "rank -1" <<<"$out" && e2e_fail "an error names rank -1: $out"
# The same flag spelled with dashes is the same flag (one convention for
# every tool: --cache-dir is --cache_dir).
dashed=${flag//_/-}
out=$("$tool" "--$dashed=not-a-value-of-any-type-%%" 2>&1); rc=$?
[ "$rc" -eq 2 ] || e2e_fail "--$dashed with a bad value exited $rc, want 2 ($out)"
grep -q "unknown flag" <<<"$out" && e2e_fail "--$dashed is not taken for --$flag: $out"
# Log levels.
case $name in
  fusebox-perf) quick=(allreduce -b 8 -e 8 -n 1 -w 0) ;;
  *) quick=(sweep --profiles resnet50 --presets 25gbe --worlds 8) ;;
esac
out=$("$tool" --log_level=loud "${quick[@]}" 2>&1); rc=$?
[ "$rc" -eq 2 ] || e2e_fail "--log_level=loud exited $rc, want 2 ($out)"
grep -q -- "--log_level: 'loud' is not a log level" <<<"$out" || e2e_fail "the error: $out"
out=$(FUSEBOX_LOG_LEVEL=loud "$tool" "${quick[@]}" 2>&1); rc=$?
[ "$rc" -eq 2 ] || e2e_fail "FUSEBOX_LOG_LEVEL=loud exited $rc, want 2 ($out)"
grep -q -- "FUSEBOX_LOG_LEVEL: 'loud' is not a log level" <<<"$out" || e2e_fail "the error: $out"
# The flag wins over the environment.
out=$(FUSEBOX_LOG_LEVEL=loud "$tool" --log_level=warning "${quick[@]}" 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 0 ] || e2e_fail "--log_level=warning with FUSEBOX_LOG_LEVEL=loud exited $rc ($out)"
case $name in
  fusebox-perf)
    out=$("$tool" --log_level=debug --progress=0 "${quick[@]}" 2>&1 >/dev/null); rc=$?
    [ "$rc" -eq 0 ] || e2e_fail "--log_level=debug exited $rc ($out)"
    grep -q "^fusebox-perf (rank 0): debug: rank 0 of 1 .*backend ucx" <<<"$out" ||
      e2e_fail "no debug line naming rank 0: $out"
    out=$("$tool" --progress=0 "${quick[@]}" 2>&1 >/dev/null)
    grep -q "debug:" <<<"$out" && e2e_fail "debug lines at the default level: $out"
    # --offset: a multiple of 8 below 4096, one tensor per call; buffers off
    # a line reduce exactly on 2 ranks (the check is on by default).
    out=$("$tool" allreduce --offset 3 -b 8 -e 8 2>&1); rc=$?
    [ "$rc" -eq 2 ] || e2e_fail "--offset 3 exited $rc, want 2 ($out)"
    grep -q -- "--offset: 3 is not a multiple of 8" <<<"$out" || e2e_fail "the error: $out"
    out=$("$tool" allreduce --offset 16 --tensors 4 -b 8 -e 8 2>&1); rc=$?
    [ "$rc" -eq 2 ] || e2e_fail "--offset with --tensors exited $rc, want 2 ($out)"
    if [ -n "$launcher" ]; then
      out=$("$launcher" -n 2 --output plain -- "$tool" allreduce --offset 16 -b 8 -e 1M -f 32 \
              -n 2 -w 1 --progress=0 2>&1); rc=$?
      [ "$rc" -eq 0 ] || e2e_fail "2 ranks at --offset 16 exited $rc ($out)"
      grep -q "buffers start 16 bytes past a page boundary" <<<"$out" ||
        e2e_fail "the header does not say where the buffers start: $out"
      grep -q "Out of bounds values : 0 OK" <<<"$out" || e2e_fail "wrong results at --offset 16: $out"
    fi
    if [ -n "$launcher" ]; then
      out=$("$launcher" -n 2 --output plain -- "$tool" --log_level=debug --progress=0 \
              "${quick[@]}" 2>&1 >/dev/null); rc=$?
      [ "$rc" -eq 0 ] || e2e_fail "2 ranks at debug exited $rc ($out)"
      grep -q "fusebox-perf (rank 1): debug: rank 1 of 2" <<<"$out" ||
        e2e_fail "rank 1's debug line does not name rank 1: $out"
    fi
    ;;
  *)
    # Progress: at info, with --progress=1 or FUSEBOX_PROGRESS=1 (fusebox-run
    # on a terminal); not by default off a terminal.
    for how in "env FUSEBOX_LOG_LEVEL=info" "env FUSEBOX_PROGRESS=1" "env --"; do
      extra=(); [ "$how" = "env --" ] && extra=(--progress=1)
      out=$($how "$tool" "${extra[@]}" "${quick[@]}" 2>&1 >/dev/null); rc=$?
      [ "$rc" -eq 0 ] || e2e_fail "$how exited $rc ($out)"
      grep -q "^\[fusebox-tune\] sweep 1/1: resnet50 on 25gbe, worlds 8$" <<<"$out" ||
        e2e_fail "no progress line for the sweep with $how ${extra[*]}: $out"
    done
    out=$(env -u FUSEBOX_PROGRESS "$tool" "${quick[@]}" 2>&1 >/dev/null)
    grep -q "fusebox-tune\]" <<<"$out" && e2e_fail "progress off a terminal by default: $out"
    ;;
esac
echo "OK $name"
