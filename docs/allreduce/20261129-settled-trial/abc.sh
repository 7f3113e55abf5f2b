#!/bin/bash
# Three arms on H emulated hosts at $RATE, the order rotating by round: the static table,
# the measured choice with blocks of 32 calls (settled from 16; /tmp/fbperf-32) and with
# blocks of 64 (settled from 32; /tmp/fbperf-64). W=250 warm-up calls for all.
H=$1; R=$2; shift 2
arms=(static m32 m64)
for r in $(seq 0 $((R-1))); do
  for k in 0 1 2; do
    arm=${arms[$(( (r + k) % 3 ))]}
    case $arm in
      static) W=250 BIN=/tmp/fbperf-32 ./fb.sh $H static --ucx_measured_choice 0 "$@" ;;
      m32) W=250 BIN=/tmp/fbperf-32 ./fb.sh $H m32 --ucx_measured_choice 64K "$@" ;;
      m64) W=250 BIN=/tmp/fbperf-64 ./fb.sh $H m64 --ucx_measured_choice 64K "$@" ;;
    esac
  done
done
