#!/bin/bash
# Interleaved rounds of fusebox-perf overlap (ResNet-50, per-tensor and DDP plans, compute scale
# 0.5, 2 local ranks), the order alternating by round: OLD=<build dir before> (a collective
# completes before the next queued one starts) and NEW=<build dir after> (completed once the next
# one's header is out). Prints start p50/p99 (us, worst rank) and iteration (ms) per plan; logs
# in $OUT.
R=$1; OUT=${OUT:?set OUT}; mkdir -p $OUT
for r in $(seq 1 $R); do
  if (( r % 2 )); then order="before|$OLD after|$NEW"; else order="after|$NEW before|$OLD"; fi
  for cfg in $order; do
    IFS='|' read -r name b <<< "$cfg"
    $b/tools/fusebox-run -n 2 -- $b/perf/fusebox-perf overlap --plans per-tensor,ddp --compute_scale 0.5 -n 6 -w 1 > $OUT/$name-$r.log 2>&1
    pt=$(grep -E "^\[0\]:   per-tensor" $OUT/$name-$r.log | awk '{print $(NF-2), $NF, $4}')
    dd=$(grep -E "^\[0\]:   ddp " $OUT/$name-$r.log | awk '{print $(NF-2), $NF, $4}')
    echo "$r $name per-tensor(p50 p99 iter)=$pt ddp=$dd"
  done
done
