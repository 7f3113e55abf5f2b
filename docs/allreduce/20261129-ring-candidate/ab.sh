#!/bin/bash
# Interleaved rounds on H emulated hosts at $RATE: fusebox built at fd7bd35 ("old": the
# measured choice up to 64 KiB, Rabenseifner or recursive doubling up to 512 KiB, the ring
# above) and the build under test ("new": the measured choice up to 512 KiB, the ring a
# candidate from 32 KiB), both with their defaults; OpenMPI's recursive doubling (a3), ring
# (a4), segmented ring (a5) and Rabenseifner (a6) between them. The two fusebox arms swap
# places every round. Every arm warms up 140 calls per size (the new trial takes up to 135).
# Usage: OLD=/tmp/fbb-old/perf/fusebox-perf RATE=1gbit ./ab.sh HOSTS ROUNDS <sweep args>
H=$1; R=$2; shift 2
FB=../20261129-settled-trial
export W=${W:-140} N=${N:-50}
for r in $(seq 1 $R); do
  if (( r % 2 )); then A=old; B=new; else A=new; B=old; fi
  for arm in $A mpi $B; do
    case $arm in
      old) (cd $FB && BIN=${OLD:-/tmp/fbb-old/perf/fusebox-perf} ./fb.sh $H old "$@") ;;
      new) (cd $FB && BIN=/tmp/fbb/perf/fusebox-perf ./fb.sh $H new "$@") ;;
      mpi) for a in 3 4 5 6; do (cd $FB && ./mpi.sh $H $a "$@"); done ;;
    esac
  done
done
