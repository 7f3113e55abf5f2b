#!/usr/bin/env bash
# The 4 Gbit overlap runs again, predicted under one bandwidth fitted across
# the host counts (fusebox-tune fit without --shared_machine) from the same
# allreduce runs as ../raw/cost-model-4gbit.json. Run from the repository
# root as root: BUILD=/tmp/fbb bash docs/scaling/20261128-shared-machine/one-bandwidth/run.sh
set -eu
BUILD=${BUILD:-/tmp/fbb}
D=docs/scaling/20261128-shared-machine/one-bandwidth
for h in 2 4 8; do
  /usr/bin/python3 perf/cluster/emucluster.py run --fusebox_run "$BUILD/tools/fusebox-run" \
    --timeout 900 --hosts "$h" --rate 4gbit -- "$BUILD/perf/fusebox-perf" overlap \
    --profile resnet50 --compute_scale auto --plans ddp,horovod,mg-wfbp,tuned \
    --tune_candidates 2 --tune_blocks 2 --tune_pairs 5 -n 5 -w 1 \
    --predict_with "$D/cost-model-4gbit.json" --json "$D/overlap-4gbit-${h}hosts.json" \
    > "$D/overlap-4gbit-${h}hosts.txt" 2>&1
done
