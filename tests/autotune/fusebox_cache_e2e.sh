#!/usr/bin/env bash
# End-to-end checks of the real fusebox-cache binary; registered with CTest.
# Usage: fusebox_cache_e2e.sh CASE /path/to/fusebox-cache
# Each case exits 0 on success and 1 with a message on failure.
set -u
# shellcheck source-path=SCRIPTDIR source=../lib/e2e.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/e2e.sh"
e2e_need_args 2 "$0 CASE /path/to/fusebox-cache" "$@"

E2E_CASE=$1
tool=$2
e2e_need_exec "$tool" fusebox-cache

e2e_workdir fusebox-cache-e2e
work=$E2E_WORK
cache="$work/cache"

# run EXPECTED_RC ARGS...: runs the tool, output in $work/stdout and stderr.
run() { e2e_run "$1" "$tool" "${@:2}"; }

entry_name=0123456789abcdef-w8-r4-ucx-ib-400g_rail-v1.json

# A valid entry, written by hand in the documented format
# (autotune/POLICY_CACHE.md), and a corrupt file next to it.
make_cache() {
  mkdir -p "$cache"
  cat >"$cache/$entry_name" <<'EOF'
{
  "format": "fusebox-policy",
  "version": 1,
  "key": {"model_signature": "0123456789abcdef", "world_size": 8, "ranks_per_node": 4, "backend": "ucx", "network": "ib-400g:rail"},
  "model": "tiny",
  "layout_hash": "00000000deadbeef",
  "measured_iteration_us": 12501,
  "ddp_iteration_us": 15000,
  "predicted_iteration_us": 12000,
  "tuning_iterations": 40,
  "cost_model": "preset ib-400g",
  "fusebox_version": "0.1.0",
  "created_unix_s": 1700000000,
  "future_field": {"ignored": true},
  "plan": {"format": "fusebox-plan", "version": 1,
   "name": "tuned",
   "buckets": [
    {"dtype": "float", "slices": [[0, 0, 1000], [1, 0, 10]]},
    {"dtype": "half", "slices": [[2, 0, 4096]]}
   ]}
}
EOF
  printf '{"format": "fusebox-policy", "version": 1, "key": ' >"$cache/ffffffffffffffff-w2-r1-mpi-local-v1.json"
}

case "$E2E_CASE" in
  empty_dir)
    run 0 --dir "$cache" list
    e2e_expect stdout "no entries in $cache"
    # Listing is read-only: a cache that does not exist yet is empty, and is not created.
    [ ! -e "$cache" ] || e2e_fail "list created the directory"
    [ ! -s "$work/stderr" ] || e2e_fail "a warning for a directory that does not exist yet"
    mkdir -p "$cache"
    run 0 --dir "$cache" list
    e2e_expect stdout "no entries in $cache"
    [ -z "$(ls -A "$cache")" ] || e2e_fail "list wrote into an empty cache"
    ;;
  list_and_show)
    make_cache
    run 0 --dir "$cache" list
    [ "$(wc -l <"$work/stdout")" -eq 3 ] || e2e_fail "expected a header and two lines"
    grep -E "^$entry_name +tiny +8 +4 +ucx +ib-400g:rail +2 +12\.501 +15\.000 +40$" \
      "$work/stdout" >/dev/null || e2e_fail "the valid entry's line is wrong"
    grep -E "^ffffffffffffffff-w2-r1-mpi-local-v1.json +UNUSABLE: malformed JSON" \
      "$work/stdout" >/dev/null || e2e_fail "the corrupt file is not marked UNUSABLE"
    run 0 --dir "$cache" show "$entry_name"
    e2e_expect stdout "model            tiny"
    e2e_expect stdout "world size       8"
    e2e_expect stdout "network          ib-400g:rail"
    e2e_expect stdout "layout hash      00000000deadbeef"
    e2e_expect stdout "plan             tuned: 2 buckets, 3 slices"
    e2e_expect stdout "measured         12.501 ms per iteration"
    e2e_expect stdout "(plan is 1.20x)"
    e2e_expect stdout "created          2023-11-14 22:13:20 UTC"
    grep -E "^ +0 float +1010 +4040 +2 +0 +1$" "$work/stdout" >/dev/null || e2e_fail "bucket 0 line"
    grep -E "^ +1 half +4096 +8192 +1 +2 +2$" "$work/stdout" >/dev/null || e2e_fail "bucket 1 line"
    # By path too.
    run 0 show "$cache/$entry_name"
    e2e_expect stdout "plan             tuned: 2 buckets"
    run 1 --dir "$cache" show ffffffffffffffff-w2-r1-mpi-local-v1.json
    e2e_expect stderr "UNUSABLE: malformed JSON"
    run 1 --dir "$cache" show missing.json
    e2e_expect stderr "missing.json: no such entry"
    ;;
  remove)
    make_cache
    run 0 --dir "$cache" rm "$entry_name"
    [ -e "$cache/$entry_name" ] && e2e_fail "rm left the file"
    run 0 --dir "$cache" list
    e2e_expect_not stdout "$entry_name"
    run 1 --dir "$cache" rm "$entry_name"
    e2e_expect stderr "no such entry"
    run 1 --dir "$cache" rm ../outside.json
    e2e_expect stderr "not an entry file name"
    ;;
  export_import)
    make_cache
    run 0 --dir "$cache" export "$work/bundle.json"
    e2e_expect stdout "exported 1 entries to $work/bundle.json"
    run 0 --dir "$work/other" import "$work/bundle.json"
    e2e_expect stdout "imported 1 entries"
    [ -f "$work/other/$entry_name" ] || e2e_fail "import did not write $entry_name"
    run 0 --dir "$work/other" list
    e2e_expect stdout "$entry_name"
    e2e_expect_not stdout "UNUSABLE"
    # Exporting the imported directory gives the same bundle.
    run 0 --dir "$work/other" export "$work/bundle2.json"
    cmp -s "$work/bundle.json" "$work/bundle2.json" || e2e_fail "export of the import differs"
    ls -A "$work/other" "$work" | grep -q '\.tmp\.' && e2e_fail "temporary file left behind"
    # A bundle with a broken entry: the valid one is imported, the other reported.
    sed 's/"world_size": 8/"world_size": 0/' "$work/bundle.json" >"$work/bad_entry.json"
    run 0 --dir "$work/third" import "$work/bad_entry.json"
    e2e_expect stdout "imported 0 entries"
    e2e_expect stderr "entries[0]: key.world_size: 0 is outside"
    printf 'not json' >"$work/garbage.json"
    run 1 --dir "$work/third" import "$work/garbage.json"
    e2e_expect stderr "garbage.json: malformed JSON"
    run 1 --dir "$work/third" import "$work/missing.json"
    ;;
  default_dir)
    make_cache
    FUSEBOX_CACHE_DIR="$cache" run 0 list
    e2e_expect stdout "$entry_name"
    mkdir -p "$work/xdg/fusebox"
    cp "$cache/$entry_name" "$work/xdg/fusebox/"
    FUSEBOX_CACHE_DIR= XDG_CACHE_HOME="$work/xdg" run 0 list
    e2e_expect stdout "$entry_name"
    e2e_expect_not stdout "ffffffffffffffff"
    FUSEBOX_CACHE_DIR= XDG_CACHE_HOME= HOME="$work/home" run 0 list
    e2e_expect stdout "no entries in $work/home/.cache/fusebox"
    # --dir wins over the environment.
    FUSEBOX_CACHE_DIR="$cache" run 0 --dir "$work/xdg/fusebox" list
    e2e_expect_not stdout "ffffffffffffffff"
    ;;
  disabled_dir)
    printf 'x' >"$work/file"
    run 0 --dir "$work/file/cache" list
    e2e_expect stderr "warning: policy cache disabled: cannot read directory $work/file/cache: Not a directory"
    run 0 --dir "$work/file" list
    e2e_expect stderr "warning: policy cache disabled: $work/file exists and is not a directory"
    # Warnings are shown unless errors only are asked for.
    FUSEBOX_LOG_LEVEL=error run 0 --dir "$work/file" list
    [ ! -s "$work/stderr" ] || e2e_fail "FUSEBOX_LOG_LEVEL=error still shows: $(cat "$work/stderr")"
    FUSEBOX_LOG_LEVEL=loud run 2 --dir "$work/file" list
    e2e_expect stderr "FUSEBOX_LOG_LEVEL: 'loud' is not a log level"
    run 1 --dir "$work/file/cache" import "$work/none.json"
    e2e_expect stderr "is disabled"
    ;;
  usage_errors)
    run 2
    e2e_expect stderr "which command?"
    run 2 --dir "$cache" frobnicate
    e2e_expect stderr "unknown command 'frobnicate'"
    run 2 --dir "$cache" list extra
    run 2 --dir "$cache" show
    run 2 --dir "$cache" show a b
    run 2 --dir "$cache" rm
    run 2 --dir "$cache" export
    run 2 --dir "$cache" import a b
    run 2 --dir
    e2e_expect stderr "--dir needs a value"
    run 2 --frob list
    e2e_expect stderr "unknown option --frob"
    run 0 --help
    e2e_expect stdout "usage: fusebox-cache [--dir DIR] COMMAND"
    e2e_expect stdout "FUSEBOX_CACHE_DIR"
    ;;
  *)
    e2e_unknown_case
    ;;
esac
exit 0
