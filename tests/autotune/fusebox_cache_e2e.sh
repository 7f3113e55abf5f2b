#!/usr/bin/env bash
# End-to-end checks of the real fusebox-cache binary; registered with CTest.
# Usage: fusebox_cache_e2e.sh CASE /path/to/fusebox-cache
# Each case exits 0 on success and 1 with a message on failure.
set -u

case_name=$1
tool=$2

work=$(mktemp -d "${TMPDIR:-/tmp}/fusebox-cache-e2e.XXXXXX")
trap 'rm -rf "$work"' EXIT
cache="$work/cache"

fail() {
  echo "FAIL [$case_name]: $*" >&2
  for f in "$work"/stdout "$work"/stderr; do
    [ -f "$f" ] && { echo "--- $(basename "$f"):" >&2; head -c 4000 "$f" >&2; }
  done
  exit 1
}

# run EXPECTED_RC ARGS...: runs the tool, output in $work/stdout and stderr.
run() {
  local want=$1
  shift
  "$tool" "$@" >"$work/stdout" 2>"$work/stderr"
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "'fusebox-cache $*' exited $rc, expected $want"
}

expect() {  # expect FILE TEXT: FILE contains TEXT
  grep -qF -- "$2" "$work/$1" || fail "no '$2' in $1"
}

expect_not() {  # expect_not FILE TEXT: FILE does not contain TEXT
  grep -qF -- "$2" "$work/$1" && fail "unexpected '$2' in $1"
  return 0
}

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

case "$case_name" in
  empty_dir)
    run 0 --dir "$cache" list
    expect stdout "no entries in $cache"
    # Listing is read-only: a cache that does not exist yet is empty, and is not created.
    [ ! -e "$cache" ] || fail "list created the directory"
    [ ! -s "$work/stderr" ] || fail "a warning for a directory that does not exist yet"
    mkdir -p "$cache"
    run 0 --dir "$cache" list
    expect stdout "no entries in $cache"
    [ -z "$(ls -A "$cache")" ] || fail "list wrote into an empty cache"
    ;;
  list_and_show)
    make_cache
    run 0 --dir "$cache" list
    [ "$(wc -l <"$work/stdout")" -eq 3 ] || fail "expected a header and two lines"
    grep -E "^$entry_name +tiny +8 +4 +ucx +ib-400g:rail +2 +12\.501 +15\.000 +40$" \
      "$work/stdout" >/dev/null || fail "the valid entry's line is wrong"
    grep -E "^ffffffffffffffff-w2-r1-mpi-local-v1.json +UNUSABLE: malformed JSON" \
      "$work/stdout" >/dev/null || fail "the corrupt file is not marked UNUSABLE"
    run 0 --dir "$cache" show "$entry_name"
    expect stdout "model            tiny"
    expect stdout "world size       8"
    expect stdout "network          ib-400g:rail"
    expect stdout "layout hash      00000000deadbeef"
    expect stdout "plan             tuned: 2 buckets, 3 slices"
    expect stdout "measured         12.501 ms per iteration"
    expect stdout "(plan is 1.20x)"
    expect stdout "created          2023-11-14 22:13:20 UTC"
    grep -E "^ +0 float +1010 +4040 +2 +0 +1$" "$work/stdout" >/dev/null || fail "bucket 0 line"
    grep -E "^ +1 half +4096 +8192 +1 +2 +2$" "$work/stdout" >/dev/null || fail "bucket 1 line"
    # By path too.
    run 0 show "$cache/$entry_name"
    expect stdout "plan             tuned: 2 buckets"
    run 1 --dir "$cache" show ffffffffffffffff-w2-r1-mpi-local-v1.json
    expect stderr "UNUSABLE: malformed JSON"
    run 1 --dir "$cache" show missing.json
    expect stderr "missing.json: no such entry"
    ;;
  remove)
    make_cache
    run 0 --dir "$cache" rm "$entry_name"
    [ -e "$cache/$entry_name" ] && fail "rm left the file"
    run 0 --dir "$cache" list
    expect_not stdout "$entry_name"
    run 1 --dir "$cache" rm "$entry_name"
    expect stderr "no such entry"
    run 1 --dir "$cache" rm ../outside.json
    expect stderr "not an entry file name"
    ;;
  export_import)
    make_cache
    run 0 --dir "$cache" export "$work/bundle.json"
    expect stdout "exported 1 entries to $work/bundle.json"
    run 0 --dir "$work/other" import "$work/bundle.json"
    expect stdout "imported 1 entries"
    [ -f "$work/other/$entry_name" ] || fail "import did not write $entry_name"
    run 0 --dir "$work/other" list
    expect stdout "$entry_name"
    expect_not stdout "UNUSABLE"
    # Exporting the imported directory gives the same bundle.
    run 0 --dir "$work/other" export "$work/bundle2.json"
    cmp -s "$work/bundle.json" "$work/bundle2.json" || fail "export of the import differs"
    ls -A "$work/other" "$work" | grep -q '\.tmp\.' && fail "temporary file left behind"
    # A bundle with a broken entry: the valid one is imported, the other reported.
    sed 's/"world_size": 8/"world_size": 0/' "$work/bundle.json" >"$work/bad_entry.json"
    run 0 --dir "$work/third" import "$work/bad_entry.json"
    expect stdout "imported 0 entries"
    expect stderr "entries[0]: key.world_size: 0 is outside"
    printf 'not json' >"$work/garbage.json"
    run 1 --dir "$work/third" import "$work/garbage.json"
    expect stderr "garbage.json: malformed JSON"
    run 1 --dir "$work/third" import "$work/missing.json"
    ;;
  default_dir)
    make_cache
    FUSEBOX_CACHE_DIR="$cache" run 0 list
    expect stdout "$entry_name"
    mkdir -p "$work/xdg/fusebox"
    cp "$cache/$entry_name" "$work/xdg/fusebox/"
    FUSEBOX_CACHE_DIR= XDG_CACHE_HOME="$work/xdg" run 0 list
    expect stdout "$entry_name"
    expect_not stdout "ffffffffffffffff"
    FUSEBOX_CACHE_DIR= XDG_CACHE_HOME= HOME="$work/home" run 0 list
    expect stdout "no entries in $work/home/.cache/fusebox"
    # --dir wins over the environment.
    FUSEBOX_CACHE_DIR="$cache" run 0 --dir "$work/xdg/fusebox" list
    expect_not stdout "ffffffffffffffff"
    ;;
  disabled_dir)
    printf 'x' >"$work/file"
    run 0 --dir "$work/file/cache" list
    expect stderr "warning: policy cache disabled: cannot read directory $work/file/cache: Not a directory"
    run 0 --dir "$work/file" list
    expect stderr "warning: policy cache disabled: $work/file exists and is not a directory"
    # Warnings are shown unless errors only are asked for.
    FUSEBOX_LOG_LEVEL=error run 0 --dir "$work/file" list
    [ ! -s "$work/stderr" ] || fail "FUSEBOX_LOG_LEVEL=error still shows: $(cat "$work/stderr")"
    FUSEBOX_LOG_LEVEL=loud run 2 --dir "$work/file" list
    expect stderr "FUSEBOX_LOG_LEVEL: 'loud' is not a log level"
    run 1 --dir "$work/file/cache" import "$work/none.json"
    expect stderr "is disabled"
    ;;
  usage_errors)
    run 2
    expect stderr "which command?"
    run 2 --dir "$cache" frobnicate
    expect stderr "unknown command 'frobnicate'"
    run 2 --dir "$cache" list extra
    run 2 --dir "$cache" show
    run 2 --dir "$cache" show a b
    run 2 --dir "$cache" rm
    run 2 --dir "$cache" export
    run 2 --dir "$cache" import a b
    run 2 --dir
    expect stderr "--dir needs a value"
    run 2 --frob list
    expect stderr "unknown option --frob"
    run 0 --help
    expect stdout "usage: fusebox-cache [--dir DIR] COMMAND"
    expect stdout "FUSEBOX_CACHE_DIR"
    ;;
  *)
    fail "unknown case"
    ;;
esac
exit 0
