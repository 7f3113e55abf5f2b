#!/bin/bash
# usage: overlap_ab.sh rounds "NAME|ENV|FLAGS" ...
# Interleaved rounds of fusebox-perf overlap (ResNet-50, per-tensor and DDP plans, compute
# scale 0.5, 2 local ranks) under each configuration; prints launch-to-start p50/p99 (us,
# worst rank) and iteration (ms) per plan. Logs in $OUT.
#   OUT=dir BUILD=/tmp/fbb bash overlap_ab.sh 4 "old||--ucx_spin_us 50 --ucx_progress_nice 0" "default||"
R=$1; shift; OUT=${OUT:?set OUT to a directory}; mkdir -p $OUT
for r in $(seq 1 $R); do
  for cfg in "$@"; do
    IFS='|' read -r name envs flags <<< "$cfg"
    env X=1 $envs ${BUILD:-build}/tools/fusebox-run -n 2 -- ${BUILD:-build}/perf/fusebox-perf overlap --plans per-tensor,ddp --compute_scale 0.5 -n 6 -w 1 $flags > $OUT/$name-$r.log 2>&1
    pt=$(grep -E "^\[0\]:   per-tensor" $OUT/$name-$r.log | awk '{print $(NF-2), $NF, $4}')
    dd=$(grep -E "^\[0\]:   ddp " $OUT/$name-$r.log | awk '{print $(NF-2), $NF, $4}')
    echo "$r $name per-tensor(p50 p99 iter)=$pt ddp=$dd"
  done
done
