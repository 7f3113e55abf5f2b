#!/bin/bash
# At --offset 16: fusebox before and after staging in the input's phase, and
# OpenMPI's own MPI_Allreduce (default algorithm selection) through
# fusebox-perf --backend mpi, interleaved, 3 repeats, 2 ranks.
#   BEFORE=... AFTER=... RUN=build/tools/fusebox-run bash run.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$here/raw"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=(allreduce -b 64K -e 32M -f 8 -n 20 -w 5 --offset 16)
for rep in 1 2 3; do
  "$RUN" -n 2 -- "$BEFORE" "${args[@]}" --json "$here/raw/before-$rep.json" > "$here/raw/before-$rep.txt" 2>&1
  "$RUN" -n 2 -- "$AFTER" "${args[@]}" --json "$here/raw/after-$rep.json" > "$here/raw/after-$rep.txt" 2>&1
  mpirun -n 2 --oversubscribe "$AFTER" "${args[@]}" --backend mpi \
    --json "$here/raw/openmpi-$rep.json" > "$here/raw/openmpi-$rep.txt" 2>&1
done
