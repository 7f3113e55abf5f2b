#!/bin/bash
# Three arms on H emulated hosts at $RATE, the order rotating by round: the static table,
# the measured choice watching the linear round beside every descriptor round (/tmp/fbperf-32),
# and the measured choice that stops watching once no class may run it (/tmp/fbperf-may).
H=$1; R=$2; shift 2
arms=(static watch may)
for r in $(seq 0 $((R-1))); do
  for k in 0 1 2; do
    arm=${arms[$(( (r + k) % 3 ))]}
    case $arm in
      static) BIN=/tmp/fbperf-may ./fb.sh $H static --ucx_measured_choice 0 "$@" ;;
      watch) BIN=/tmp/fbperf-32 ./fb.sh $H watch --ucx_measured_choice 64K "$@" ;;
      may) BIN=/tmp/fbperf-may ./fb.sh $H may --ucx_measured_choice 64K "$@" ;;
    esac
  done
done
