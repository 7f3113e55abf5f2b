#!/bin/bash
# Interleaved rounds: fusebox before (OLD) and after (NEW) the change, OpenMPI's
# recursive doubling (a3) and linear (a1); blocking allreduce, 4 Gbit links.
# usage: OLD=bin NEW=bin ab.sh hosts rounds fusebox-perf-size-args...
H=$1; R=$2; shift 2
for r in $(seq 1 $R); do
  BIN=$OLD ENVS="" ./run2.sh $H before "$@"
  BIN=$NEW ENVS="" ./run2.sh $H after "$@"
  ./mpi.sh $H 3 "$@"
  ./mpi.sh $H 1 "$@"
done
