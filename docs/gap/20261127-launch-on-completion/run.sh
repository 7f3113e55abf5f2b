#!/bin/bash
# Interleaved A/B at fixed compute scales: engine launch on completion on/off.
OUT=${OUT:-/tmp/loc_ab2}; B=${BUILD:-/tmp/fbb}; mkdir -p $OUT
for r in 1 2 3 4 5 6 7 8; do
 for cell in "vit_b16 0.44 r2" "vit_b16 0.98 r1" "gpt2_small 0.58 r2" "gpt2_small 1.21 r1" "resnet50 0.33 r2" "resnet50 0.72 r1"; do
  set -- $cell
  for cfg in on off; do
    f=true; [ $cfg = off ] && f=false
    $B/tools/fusebox-run -n 2 -- $B/perf/fusebox-perf overlap --profile $1 --compute_scale $2 \
      --plans ddp,ddp-cap1mb,ddp-cap5mb,horovod --explain -n 4 -w 1 --overlap_slowdown 1 \
      --engine_launch_on_completion=$f --json $OUT/$1-$3-$cfg-$r.json > $OUT/$1-$3-$cfg-$r.log 2>&1
  done
 done
done
echo done > $OUT/DONE
