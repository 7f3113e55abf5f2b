#!/bin/bash
# Arms on H emulated hosts at $RATE for R rounds, the order rotating by round (round r starts
# with arm r mod the number of arms). Each arm is TAG|BIN|W|FLAGS: fb.sh's rows labelled TAG,
# fusebox-perf BIN, W warm-up calls (empty: fb.sh's default), and its flags.
# Usage: RATE=4gbit ./rotate.sh HOSTS ROUNDS ARM... -- <fusebox-perf sweep args>
H=$1; R=$2; shift 2
arms=()
while [[ $# -gt 0 && $1 != -- ]]; do arms+=("$1"); shift; done
shift
n=${#arms[@]}
for r in $(seq 0 $((R-1))); do
  for k in $(seq 0 $((n-1))); do
    IFS='|' read -r tag bin w flags <<< "${arms[$(( (r + k) % n ))]}"
    # shellcheck disable=SC2086
    W=${w:-${W:-120}} BIN=$bin ./fb.sh $H $tag $flags "$@"
  done
done
