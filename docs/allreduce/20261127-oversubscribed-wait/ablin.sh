#!/bin/bash
H=$1; R=$2; shift 2
for r in $(seq 1 $R); do
  ENVS="" ./run2.sh $H default "$@"
  ENVS="" ./run2.sh $H lin16k "$@" --ucx_linear 16384
  ENVS="" ./run2.sh $H lin64k "$@" --ucx_linear 65536
  ./mpi.sh $H 3 "$@"
  ./mpi.sh $H 1 "$@"
done
