#!/bin/bash
# Three arms on H emulated hosts at $RATE, the order rotating by round, W=140 warm-up calls:
# the static table, the measured choice after 6 warm-up calls of a class (/tmp/fbperf-warm6)
# and after 32 (/tmp/fbperf-warm32).
H=$1; R=$2; shift 2
arms=(static warm6 warm32)
for r in $(seq 0 $((R-1))); do
  for k in 0 1 2; do
    arm=${arms[$(( (r + k) % 3 ))]}
    case $arm in
      static) W=140 BIN=/tmp/fbperf-warm6 ./fb.sh $H static --ucx_measured_choice 0 "$@" ;;
      warm6) W=140 BIN=/tmp/fbperf-warm6 ./fb.sh $H warm6 "$@" ;;
      warm32) W=140 BIN=/tmp/fbperf-warm32 ./fb.sh $H warm32 "$@" ;;
    esac
  done
done
