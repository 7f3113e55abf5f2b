#!/usr/bin/env bash
# End-to-end checks of the real fusebox-profile binary; registered with CTest.
# Usage: fusebox_profile_e2e.sh CASE /path/to/fusebox-profile /path/to/source
# Each case exits 0 on success and 1 with a message on failure.
set -u
# shellcheck source-path=SCRIPTDIR source=../lib/e2e.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/e2e.sh"
e2e_need_args 3 "$0 CASE /path/to/fusebox-profile /path/to/source" "$@"

E2E_CASE=$1
tool=$2
src=$3
e2e_need_exec "$tool" fusebox-profile

e2e_workdir fusebox-profile-e2e
work=$E2E_WORK

# run EXPECTED_RC ARGS...: runs the tool, output in $work/stdout and stderr.
run() { e2e_run "$1" "$tool" "${@:2}"; }

case "$E2E_CASE" in
  validate_shipped)
    run 0 validate "$src"/autotune/profiles/*.json
    [ "$(grep -c ': ok (' "$work/stdout")" -eq "$(ls "$src"/autotune/profiles/*.json | wc -l)" ] ||
      e2e_fail "not every shipped profile is ok"
    ;;
  generate_and_show)
    run 0 generate resnet50 -o "$work/r.json"
    run 0 show "$work/r.json"
    e2e_expect stdout "tensors      161"
    e2e_expect stdout "parameters   25,557,032"
    e2e_expect stdout "largest      layer4.2.conv2.weight [512, 512, 3, 3] float, 9.00 MiB"
    e2e_expect stdout "first ready  fc.bias"
    e2e_expect stdout "last ready   conv1.weight"
    ;;
  generate_all)
    run 0 generate all --dir "$work/all"
    for m in $("$tool" models); do
      [ -f "$work/all/$m.json" ] || e2e_fail "generate all did not write $m.json"
    done
    run 0 validate "$work"/all/*.json
    ls "$work/all" | grep -q tmp && e2e_fail "temporary file left behind"
    # One model without -o goes to stdout and equals the file.
    run 0 generate gpt2_small
    cmp -s "$work/stdout" "$work/all/gpt2_small.json" || e2e_fail "stdout differs from the file"
    ;;
  invalid_file)
    printf '{"format": "fusebox-profile", "version": 9}' >"$work/bad.json"
    run 0 generate vit_b16 -o "$work/good.json"
    run 1 validate "$work/good.json" "$work/bad.json"
    e2e_expect stdout "good.json: ok (vit_b16, 152 tensors"
    e2e_expect stdout "$work/bad.json: INVALID: version: 9 is not supported"
    run 1 show "$work/missing.json"
    e2e_expect stderr "missing.json"
    ;;
  usage_errors)
    run 2
    run 2 frobnicate
    e2e_expect stderr "unknown command 'frobnicate'"
    run 2 generate
    run 2 generate all
    e2e_expect stderr "need --dir"
    run 2 generate resnet50 -o
    e2e_expect stderr "-o needs a value"
    run 2 generate resnet50 -o a --dir b
    run 2 validate
    run 2 show a b
    run 1 generate resnet51 -o "$work/x.json"
    e2e_expect stderr "unknown model 'resnet51' (known models: resnet50, bert_large"
    run 0 --help
    e2e_expect stdout "fusebox-profile generate <model>|all"
    FUSEBOX_LOG_LEVEL=loud run 2 models
    e2e_expect stderr "fusebox-profile: FUSEBOX_LOG_LEVEL: "
    FUSEBOX_LOG_LEVEL=error run 0 models
    ;;
  *)
    e2e_unknown_case
    ;;
esac
exit 0
