#!/bin/bash
# Communication-bound cells (t(all) = 2 T_b; many 1-5 MiB buckets queue), the same three
# configurations as ab3.sh interleaved: iteration (ms) per plan, and the gap report's launch->start
# term. Usage: HEAD=<dir> NEW=<dir> OUT=<dir> ./commbound.sh ROUNDS
R=$1; OUT=${OUT:?set OUT}; mkdir -p $OUT
for r in $(seq 1 $R); do
  for cell in "vit_b16 0.44" "gpt2_small 0.58"; do
    set -- $cell
    for cfg in "before|$HEAD|" "after|$NEW|" "off|$NEW|--engine_launch_on_completion=false"; do
      IFS='|' read -r name b flags <<< "$cfg"
      log=$OUT/$1-$name-$r.log
      $b/tools/fusebox-run -n 2 -- $b/perf/fusebox-perf overlap --profile $1 --compute_scale $2 \
        --plans ddp,ddp-cap1mb,ddp-cap5mb,horovod --explain -n 4 -w 1 --overlap_slowdown 1 $flags > $log 2>&1
      echo "$r $1 $name $(grep -E '^\[0\]:   (ddp|ddp-cap1mb|ddp-cap5mb|horovod) ' $log | awk '{printf "%s=%s ", $2, $4}')"
    done
  done
done
