#!/bin/bash
# Blocking allreduce on 2 local ranks, several builds of fusebox-perf, each
# round running every build once in a rotated order.
# usage: BUILDS="old=path new=path ..." RUN=path/to/fusebox-run ROUNDS=16 bash run.sh > raw.txt
set -u
read -r -a builds <<< "$BUILDS"
nb=${#builds[@]}
for r in $(seq 1 "${ROUNDS:-16}"); do
  for k in $(seq 0 $((nb - 1))); do
    IFS== read -r name b <<< "${builds[$(((k + r) % nb))]}"
    "$RUN" -n 2 -- "$b" allreduce --backend ucx -z 1 -b 8 -e 8K -f 4 -n 2000 -w 200 -d float -o sum 2>&1 |
      awk -v r=$r -v bin=$name '/^\[0\]: +[0-9]+ /{print "round", r, "build", bin, "size", $2, "us", $7}'
  done
done
