#!/bin/bash
# As ab.sh, the build after first in each round (to see whether order within a round biases).
H=$1; R=$2; shift 2
for r in $(seq 1 $R); do
  BIN=$NEW ./fb.sh $H after "$@"
  BIN=$OLD ./fb.sh $H before "$@"
done
