#!/bin/bash
# Three arms on H emulated hosts at $RATE, the order rotating by round: the static table, the
# measured choice trying recursive doubling, Rabenseifner, the linear round in that order
# (/tmp/fbperf-warm6, build 3f7c963), and trying the candidate that sends the fewest bytes
# first: Rabenseifner, recursive doubling, the linear round (/tmp/fbperf-order).
H=$1; R=$2; shift 2
./rotate.sh $H $R 'static|/tmp/fbperf-warm6||--ucx_measured_choice 0' \
  'rd-first|/tmp/fbperf-warm6||' 'fewest-first|/tmp/fbperf-order||' -- "$@"
