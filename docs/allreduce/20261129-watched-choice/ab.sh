#!/bin/bash
# Interleaved rounds on H emulated hosts at $RATE: fusebox built at a300594 ("old": the
# measured choice decides once per class) and the build under test ("new": the choice is
# watched and switched where it becomes dear), both with their defaults; OpenMPI's recursive
# doubling (a3), ring (a4), segmented ring (a5) and Rabenseifner (a6) between them. The two
# fusebox arms swap places every round. Every arm warms up $W calls per size (300 by
# default: a trial of up to 135 calls, then settling and up to three windows of the watch).
# Usage: OLD=/tmp/fbb-prev/perf/fusebox-perf RATE=1gbit ./ab.sh HOSTS ROUNDS <sweep args>
H=$1; R=$2; shift 2
FB=../20261129-settled-trial
export W=${W:-300} N=${N:-100}
for r in $(seq 1 $R); do
  if (( r % 2 )); then A=old; B=new; else A=new; B=old; fi
  for arm in $A mpi $B; do
    case $arm in
      old) (cd $FB && BIN=${OLD:-/tmp/fbb-prev/perf/fusebox-perf} ./fb.sh $H old "$@") ;;
      new) (cd $FB && BIN=/tmp/fbb/perf/fusebox-perf ./fb.sh $H new "$@") ;;
      mpi) for a in 3 4 5 6; do (cd $FB && ./mpi.sh $H $a "$@"); done ;;
    esac
  done
done
