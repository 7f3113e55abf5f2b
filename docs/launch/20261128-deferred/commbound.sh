#!/bin/bash
# Communication-bound cells (t(all) = 2 T_b; many 1-5 MiB buckets queue), OLD and NEW builds
# interleaved (the order alternating by round): iteration (ms) per plan and the gap report's
# launch->start term. Usage: OLD=<dir> NEW=<dir> OUT=<dir> [FLAGS=<more flags>]
# [CELLS='model:compute_scale ...'] ./commbound.sh ROUNDS
R=$1; OUT=${OUT:?set OUT}; mkdir -p $OUT
for r in $(seq 1 $R); do
  for cell in ${CELLS:-vit_b16:0.44 gpt2_small:0.58}; do
    set -- ${cell/:/ }
    if (( r % 2 )); then order="before|$OLD after|$NEW"; else order="after|$NEW before|$OLD"; fi
    for cfg in $order; do
      IFS='|' read -r name b <<< "$cfg"
      log=$OUT/$1-$name-$r.log
      $b/tools/fusebox-run -n 2 -- $b/perf/fusebox-perf overlap --profile $1 --compute_scale $2 \
        --plans ddp,ddp-cap1mb,ddp-cap5mb,horovod --explain -n 4 -w 1 --overlap_slowdown 1 $FLAGS > $log 2>&1
      echo "$r $1 $name $(grep -E '^\[0\]:   (ddp|ddp-cap1mb|ddp-cap5mb|horovod) ' $log | awk '{printf "%s=%s ", $2, $4}')"
    done
  done
done
