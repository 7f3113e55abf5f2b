#!/usr/bin/env bash
# The LibTorch example (fusebox-train-example) on 2 ranks under fusebox-run:
# every step's evaluation loss and parameter checksum are identical on both
# ranks, the loss goes down, and a second run with the same cache hits it.
# Usage: train_example_e2e.sh CASE /path/to/fusebox-run /path/to/fusebox-train-example
set -u
# shellcheck source-path=SCRIPTDIR source=../lib/e2e.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/e2e.sh"
e2e_need_args 3 "$0 CASE /path/to/fusebox-run /path/to/fusebox-train-example" "$@"
E2E_CASE=$1
run_tool=$2
example=$3
e2e_need_exec "$run_tool" fusebox-run
e2e_need_exec "$example" fusebox-train-example
e2e_workdir fusebox-train-e2e
work=$E2E_WORK

train() {  # train OUTFILE ARGS...
  local out=$1
  shift
  e2e_show_on_fail "$out"
  timeout 240 "$run_tool" -n 2 -- "$example" "$@" >"$out" 2>&1 || e2e_fail "run exited $? ($*)"
}

# Per step: rank 0's and rank 1's "eval_loss X params Y" must be equal.
same_on_both_ranks() {
  local out=$1 steps=$2
  for ((s = 0; s < steps; s++)); do
    a=$(grep -E "^(\[0\]: )?rank 0 step $s " "$out" | sed -E 's/.*(eval_loss [^ ]+ params [0-9a-f]+).*/\1/')
    b=$(grep -E "^(\[1\]: )?rank 1 step $s " "$out" | sed -E 's/.*(eval_loss [^ ]+ params [0-9a-f]+).*/\1/')
    [ -n "$a" ] || e2e_fail "no line for rank 0 step $s"
    [ "$a" = "$b" ] || e2e_fail "step $s differs: rank 0 '$a', rank 1 '$b'"
  done
}

loss_goes_down() {
  local out=$1 last=$2
  first=$(grep -E "^(\[0\]: )?rank 0 step 0 " "$out" | sed -E 's/.*eval_loss ([^ ]+).*/\1/')
  final=$(grep -E "^(\[0\]: )?rank 0 step $last " "$out" | sed -E 's/.*eval_loss ([^ ]+).*/\1/')
  awk -v a="$first" -v b="$final" 'BEGIN { exit !(b < 0.5 * a) }' ||
    e2e_fail "evaluation loss did not halve: $first -> $final"
}

case "$E2E_CASE" in
  tuned_then_cached)
    train "$work/out1" --steps 30 --cache_dir "$work/cache"
    same_on_both_ranks "$work/out1" 30
    loss_goes_down "$work/out1" 29
    grep -Eq "^(\[0\]: )?rank 0 done: tuned plan, [1-9][0-9]* tuning iterations, cache miss" "$work/out1" ||
      e2e_fail "first run did not tune"
    train "$work/out2" --steps 5 --cache_dir "$work/cache"
    same_on_both_ranks "$work/out2" 5
    grep -Eq "^(\[1\]: )?rank 1 done: tuned plan, 0 tuning iterations, cache hit" "$work/out2" ||
      e2e_fail "second run did not hit the cache"
    ;;
  fixed_plans)
    for plan in ddp per-tensor; do
      train "$work/out-$plan" --steps 12 --plan "$plan"
      same_on_both_ranks "$work/out-$plan" 12
    done
    # The plan changes how gradients are fused, not what they sum to: on 2
    # ranks the averages, hence the parameters, are bit for bit the same.
    a=$(grep -E "^(\[0\]: )?rank 0 step 11 " "$work/out-ddp" | sed -E 's/.*params ([0-9a-f]+).*/\1/')
    b=$(grep -E "^(\[0\]: )?rank 0 step 11 " "$work/out-per-tensor" | sed -E 's/.*params ([0-9a-f]+).*/\1/')
    [ "$a" = "$b" ] || e2e_fail "ddp and per-tensor plans trained different parameters ($a vs $b)"
    ;;
  *)
    e2e_unknown_case
    ;;
esac
echo "PASS [$E2E_CASE]"
