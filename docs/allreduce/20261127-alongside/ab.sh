#!/bin/bash
# Interleaved rounds on H emulated hosts at $RATE: the build before (OLD, its fusebox-perf),
# the build after (NEW), and OpenMPI's linear (a1) and recursive doubling (a3) algorithms.
# Usage: OLD=<fusebox-perf> NEW=<fusebox-perf> RATE=4gbit ./ab.sh HOSTS ROUNDS <fusebox-perf sweep args>
H=$1; R=$2; shift 2
for r in $(seq 1 $R); do
  BIN=$OLD ./fb.sh $H before "$@"
  BIN=$NEW ./fb.sh $H after "$@"
  ./mpi.sh $H 3 "$@"
  ./mpi.sh $H 1 "$@"
done
