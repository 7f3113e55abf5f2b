#!/bin/bash
# Three arms on H emulated hosts at $RATE, the order rotating by round: the static table,
# the measured choice with blocks of 32 calls (settled from 16; /tmp/fbperf-32) and with
# blocks of 64 (settled from 32; /tmp/fbperf-64). W=250 warm-up calls for all.
H=$1; R=$2; shift 2
./rotate.sh $H $R 'static|/tmp/fbperf-32|250|--ucx_measured_choice 0' \
  'm32|/tmp/fbperf-32|250|--ucx_measured_choice 64K' \
  'm64|/tmp/fbperf-64|250|--ucx_measured_choice 64K' -- "$@"
