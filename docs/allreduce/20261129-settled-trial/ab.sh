#!/bin/bash
# Interleaved rounds on H emulated hosts at $RATE: fusebox with the static table
# (--ucx_measured_choice 0), fusebox with the measured choice (--ucx_measured_choice 64K), and
# OpenMPI's linear (a1), recursive-doubling (a3), ring (a4) and Rabenseifner (a6) algorithms;
# the order of the two fusebox arms alternates by round, OpenMPI's runs between them.
# Usage: RATE=1gbit ./ab.sh HOSTS ROUNDS <sweep args, e.g. -b 8K -e 64K -f 2>
H=$1; R=$2; shift 2
for r in $(seq 1 $R); do
  if (( r % 2 )); then A=static; B=measured; else A=measured; B=static; fi
  for arm in $A mpi $B; do
    case $arm in
      static) ./fb.sh $H static --ucx_measured_choice 0 "$@" ;;
      measured) ./fb.sh $H measured --ucx_measured_choice 64K "$@" ;;
      mpi) for a in 1 3 4 6; do ./mpi.sh $H $a "$@"; done ;;
    esac
  done
done
