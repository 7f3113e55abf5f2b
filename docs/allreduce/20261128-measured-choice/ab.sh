#!/bin/bash
# Interleaved rounds on H emulated hosts at $RATE: the static table (--ucx_measured_choice 0)
# and the measured choice (default), the order alternating by round.
# Usage: RATE=1gbit ./ab.sh HOSTS ROUNDS <fusebox-perf sweep args>
H=$1; R=$2; shift 2
for r in $(seq 1 $R); do
  if (( r % 2 )); then
    ./fb.sh $H static --ucx_measured_choice 0 "$@"; ./fb.sh $H measured "$@"
  else
    ./fb.sh $H measured "$@"; ./fb.sh $H static --ucx_measured_choice 0 "$@"
  fi
done
