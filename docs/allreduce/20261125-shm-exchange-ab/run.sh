#!/usr/bin/env bash
# A/B of the shared-memory exchange change, 2 local ranks, interleaved:
# fusebox-perf built before (69124d8: flag in the control block, 'read' flag)
# and after (flag in the mailbox line, no 'read' flag), with OpenMPI's default
# MPI_Allreduce in the same rounds. Usage: run.sh BEFORE_BIN AFTER_BIN BUILD OUTDIR [ROUNDS]
set -euo pipefail
before=$1 after=$2 build=$3 out=$4 rounds=${5:-10}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for tool in before after mpi; do
    case $tool in
      before|after)
        bin=${!tool}
        "$build/tools/fusebox-run" -n 2 -- "$bin" allreduce --backend ucx -b 8 -e 8 -n 20000 -w 1000 \
          -d float -o sum -z 1 >"$out/$tool-lat-r$r.txt" 2>&1
        "$build/tools/fusebox-run" -n 2 -- "$bin" allreduce --backend ucx -b 8 -e 8192 -f 4 -n 2000 \
          -w 200 -d float -o sum -z 1 >"$out/$tool-sweep-r$r.txt" 2>&1 ;;
      mpi)
        mpirun -n 2 --oversubscribe --allow-run-as-root "$build/perf/baselines/fusebox-mpi-allreduce" \
          -b 8 -e 8 -n 20000 -w 1000 -d float -o sum >"$out/mpi-lat-r$r.txt" 2>&1
        mpirun -n 2 --oversubscribe --allow-run-as-root "$build/perf/baselines/fusebox-mpi-allreduce" \
          -b 8 -e 8192 -f 4 -n 2000 -w 200 -d float -o sum >"$out/mpi-sweep-r$r.txt" 2>&1 ;;
    esac
  done
done
