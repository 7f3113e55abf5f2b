#!/usr/bin/env bash
# The overlap runs again, predicted under the model fitted with the same
# term to every size of the same allreduce runs (64 KiB-16 MiB, no
# --min_bytes), for comparison with ../raw (fitted from 1 MiB up). Run from
# the repository root as root:
#   BUILD=/tmp/fbb bash docs/scaling/20261128-fit-from-1mib/full-range/run.sh
set -eu
BUILD=${BUILD:-/tmp/fbb}
D=docs/scaling/20261128-fit-from-1mib/full-range
for rate in 1gbit 4gbit; do
  for h in 2 4 8; do
    /usr/bin/python3 perf/cluster/emucluster.py run --fusebox_run "$BUILD/tools/fusebox-run" \
      --timeout 900 --hosts "$h" --rate "$rate" -- "$BUILD/perf/fusebox-perf" overlap \
      --profile resnet50 --compute_scale auto --plans ddp,horovod,mg-wfbp,tuned \
      --tune_candidates 2 --tune_blocks 2 --tune_pairs 5 -n 5 -w 1 \
      --predict_with "$D/cost-model-$rate.json" --json "$D/overlap-$rate-${h}hosts.json" \
      > "$D/overlap-$rate-${h}hosts.txt" 2>&1
  done
done
