#!/usr/bin/env bash
# End-to-end checks of the real fusebox-profile binary; registered with CTest.
# Usage: fusebox_profile_e2e.sh CASE /path/to/fusebox-profile /path/to/source
# Each case exits 0 on success and 1 with a message on failure.
set -u

case_name=$1
tool=$2
src=$3

work=$(mktemp -d "${TMPDIR:-/tmp}/fusebox-profile-e2e.XXXXXX")
trap 'rm -rf "$work"' EXIT

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
  [ "$rc" -eq "$want" ] || fail "'fusebox-profile $*' exited $rc, expected $want"
}

expect() {  # expect FILE TEXT: FILE contains TEXT
  grep -qF -- "$2" "$work/$1" || fail "no '$2' in $1"
}

case "$case_name" in
  validate_shipped)
    run 0 validate "$src"/autotune/profiles/*.json
    [ "$(grep -c ': ok (' "$work/stdout")" -eq "$(ls "$src"/autotune/profiles/*.json | wc -l)" ] ||
      fail "not every shipped profile is ok"
    ;;
  generate_and_show)
    run 0 generate resnet50 -o "$work/r.json"
    run 0 show "$work/r.json"
    expect stdout "tensors      161"
    expect stdout "parameters   25,557,032"
    expect stdout "largest      layer4.2.conv2.weight [512, 512, 3, 3] float, 9.00 MiB"
    expect stdout "first ready  fc.bias"
    expect stdout "last ready   conv1.weight"
    ;;
  generate_all)
    run 0 generate all --dir "$work/all"
    for m in $("$tool" models); do
      [ -f "$work/all/$m.json" ] || fail "generate all did not write $m.json"
    done
    run 0 validate "$work"/all/*.json
    ls "$work/all" | grep -q tmp && fail "temporary file left behind"
    # One model without -o goes to stdout and equals the file.
    run 0 generate gpt2_small
    cmp -s "$work/stdout" "$work/all/gpt2_small.json" || fail "stdout differs from the file"
    ;;
  invalid_file)
    printf '{"format": "fusebox-profile", "version": 9}' >"$work/bad.json"
    run 0 generate vit_b16 -o "$work/good.json"
    run 1 validate "$work/good.json" "$work/bad.json"
    expect stdout "good.json: ok (vit_b16, 152 tensors"
    expect stdout "$work/bad.json: INVALID: version: 9 is not supported"
    run 1 show "$work/missing.json"
    expect stderr "missing.json"
    ;;
  usage_errors)
    run 2
    run 2 frobnicate
    expect stderr "unknown command 'frobnicate'"
    run 2 generate
    run 2 generate all
    expect stderr "need --dir"
    run 2 generate resnet50 -o
    expect stderr "-o needs a value"
    run 2 generate resnet50 -o a --dir b
    run 2 validate
    run 2 show a b
    run 1 generate resnet51 -o "$work/x.json"
    expect stderr "unknown model 'resnet51' (known models: resnet50, bert_large"
    run 0 --help
    expect stdout "fusebox-profile generate <model>|all"
    ;;
  *)
    fail "unknown case"
    ;;
esac
exit 0
