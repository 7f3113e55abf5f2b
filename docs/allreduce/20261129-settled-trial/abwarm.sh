#!/bin/bash
# Three arms on H emulated hosts at $RATE, the order rotating by round, W=140 warm-up calls:
# the static table, the measured choice after 6 warm-up calls of a class (/tmp/fbperf-warm6)
# and after 32 (/tmp/fbperf-warm32).
H=$1; R=$2; shift 2
./rotate.sh $H $R 'static|/tmp/fbperf-warm6|140|--ucx_measured_choice 0' \
  'warm6|/tmp/fbperf-warm6|140|' 'warm32|/tmp/fbperf-warm32|140|' -- "$@"
