#!/bin/bash
# Three arms on H emulated hosts at $RATE, the order rotating by round: the static table,
# the measured choice watching the linear round beside every descriptor round (/tmp/fbperf-32),
# and the measured choice that stops watching once no class may run it (/tmp/fbperf-may).
H=$1; R=$2; shift 2
./rotate.sh $H $R 'static|/tmp/fbperf-may||--ucx_measured_choice 0' \
  'watch|/tmp/fbperf-32||--ucx_measured_choice 64K' \
  'may|/tmp/fbperf-may||--ucx_measured_choice 64K' -- "$@"
