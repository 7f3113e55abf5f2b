#!/bin/bash
# Three arms on H emulated hosts at $RATE, the order rotating by round: the static table, the
# measured choice trying recursive doubling, Rabenseifner, the linear round in that order
# (/tmp/fbperf-warm6, build 3f7c963), and trying the candidate that sends the fewest bytes
# first: Rabenseifner, recursive doubling, the linear round (/tmp/fbperf-order).
H=$1; R=$2; shift 2
arms=(static rd-first fewest-first)
for r in $(seq 0 $((R-1))); do
  for k in 0 1 2; do
    arm=${arms[$(( (r + k) % 3 ))]}
    case $arm in
      static) BIN=/tmp/fbperf-warm6 ./fb.sh $H static --ucx_measured_choice 0 "$@" ;;
      rd-first) BIN=/tmp/fbperf-warm6 ./fb.sh $H rd-first "$@" ;;
      fewest-first) BIN=/tmp/fbperf-order ./fb.sh $H fewest-first "$@" ;;
    esac
  done
done
