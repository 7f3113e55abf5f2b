#!/bin/bash
# Interleaved rounds on local ranks (2 unless NP says): two fusebox builds (blocking calls, -z 1) and OpenMPI's
# default, recursive doubling (3) and basic linear (1) algorithms, over one size sweep.
# Usage: ab.sh ROUNDS OUTDIR BIN_A BIN_B [sweep flags]; raw output in OUTDIR/<round>-<arm>.txt.
# Env: NP (ranks, default 2); LOAD=1 runs one busy-looping process per CPU beside every run.
set -u
rounds=$1 out=$2 a=$3 b=$4; shift 4
sweep=${*:--b 8 -e 64K -f 2 -n 5000 -w 500}
build=${BUILD:-/tmp/fbb}
np=${NP:-2}
# Ranks that outnumber the CPUs are bound round-robin, both tools alike (as bench_allreduce.py).
fbind=() mbind=()
if (( np > $(nproc) )); then fbind=(--bind core) mbind=(--bind-to core:overload-allowed); fi
mkdir -p "$out"
loops=()
if [[ ${LOAD:-0} == 1 ]]; then
  for _ in $(seq 1 "$(nproc)"); do python3 -c 'while True: pass' & loops+=($!); done
  trap 'kill "${loops[@]}" 2>/dev/null' EXIT
fi
for r in $(seq 1 "$rounds"); do
  # The fusebox arms swap places every round.
  if (( r % 2 )); then arms="A B mpi0 mpi3 mpi1"; else arms="B A mpi1 mpi3 mpi0"; fi
  for arm in $arms; do
    case $arm in
      A) "$build/tools/fusebox-run" -n "$np" "${fbind[@]}" -- "$a" allreduce --backend ucx -z 1 $sweep ;;
      B) "$build/tools/fusebox-run" -n "$np" "${fbind[@]}" -- "$b" allreduce --backend ucx -z 1 $sweep ;;
      mpi0) mpirun --allow-run-as-root --oversubscribe -np "$np" "${mbind[@]}" "$build/perf/baselines/fusebox-mpi-allreduce" $sweep ;;
      mpi*) mpirun --allow-run-as-root --oversubscribe -np "$np" "${mbind[@]}" --mca coll_tuned_use_dynamic_rules 1 \
              --mca coll_tuned_allreduce_algorithm "${arm#mpi}" \
              "$build/perf/baselines/fusebox-mpi-allreduce" $sweep ;;
    esac > "$out/$r-$arm.txt" 2>&1
  done
done
