#!/bin/bash
# Interleaved rounds of fusebox-perf overlap (ResNet-50, per-tensor and DDP plans, compute scale
# 0.5, 2 local ranks): HEAD=<build dir before> (launches on every completion), NEW=<build dir
# after> (launches on completion only where nothing is queued behind), and NEW with launches on
# completion off. Prints start p50/p99 (us, worst rank) and iteration (ms) per plan; logs in $OUT.
R=$1; OUT=${OUT:?set OUT}; mkdir -p $OUT
for r in $(seq 1 $R); do
  for cfg in "before|$HEAD|" "after|$NEW|" "off|$NEW|--engine_launch_on_completion=false"; do
    IFS='|' read -r name b flags <<< "$cfg"
    $b/tools/fusebox-run -n 2 -- $b/perf/fusebox-perf overlap --plans per-tensor,ddp --compute_scale 0.5 -n 6 -w 1 $flags > $OUT/$name-$r.log 2>&1
    pt=$(grep -E "^\[0\]:   per-tensor" $OUT/$name-$r.log | awk '{print $(NF-2), $NF, $4}')
    dd=$(grep -E "^\[0\]:   ddp " $OUT/$name-$r.log | awk '{print $(NF-2), $NF, $4}')
    echo "$r $name per-tensor(p50 p99 iter)=$pt ddp=$dd"
  done
done
