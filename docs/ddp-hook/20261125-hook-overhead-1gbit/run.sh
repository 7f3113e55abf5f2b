#!/bin/bash
# Runs ab_hook_1gbit.py over 2 network namespaces joined by a veth pair shaped to 1 Gbit with
# tbf on both ends (the setup of perf/bench_ddp_hook.py, reused from it). Needs root.
#   ./run.sh BUILD BLOCKS RUNS OUTDIR     e.g. ./run.sh /work/main/build 44 3 raw
set -euo pipefail
build=$(realpath "$1"); blocks=$2; runs=$3; out=$4
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
mkdir -p "$out"
py() { /usr/bin/python3 -c "import sys; sys.path.insert(0, '$repo/perf'); import bench_ddp_hook as b; $1"; }
py "b.teardown(); b.setup('1gbit')"
trap 'py "b.teardown()"' EXIT
for run in $(seq 1 "$runs"); do
  pids=()
  for rank in 0 1; do
    ns=$(py "print(b.NS[$rank])"); dev=$(py "print(b.DEV[$rank])"); addr0=$(py "print(b.ADDR[0])")
    ip netns exec "$ns" env RANK=$rank WORLD_SIZE=2 MASTER_ADDR="$addr0" MASTER_PORT=$((29811 + run)) \
      LOCAL_WORLD_SIZE=1 LOCAL_RANK=0 GLOO_SOCKET_IFNAME="$dev" OMP_NUM_THREADS=1 AB_SEED=$run \
      PYTHONPATH="$build/python" /usr/bin/python3 "$here/ab_hook_1gbit.py" "$blocks" \
      > "$out/run$run-rank$rank.txt" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  grep -v '^raw ' "$out/run$run-rank0.txt" | grep -E "seed|median"
done
