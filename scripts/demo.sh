#!/usr/bin/env bash
# The main job on an embedded default: installs, builds, and runs
#  1. the allreduce comparison on local ranks (fusebox UCX vs OpenMPI vs
#     PyTorch Gloo, float32 sum, 2 and 4 ranks, 8 B .. 64 MB), printing a
#     table and the ratios (extra arguments go to perf/bench_allreduce.py);
#  2. the autotuner on the bundled ResNet-50 profile: offline under the 25 GbE
#     preset at 64 ranks (plan vs DDP/Horovod/HCCL/MG-WFBP and the lower
#     bound), then online on 2 local ranks: the replayed backward, tuned in
#     real iterations, then measured in randomised blocks beside DDP's
#     default, DDP at hand-set caps and Horovod's default, the plan cached in
#     build/demo-cache (a second run on the same workload hits it: 0 tuning
#     iterations) and a Chrome timeline of the tuned plan in
#     build/demo-timeline. The compute scale is fixed (0.5), so that both runs
#     replay the same workload.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
/usr/bin/python3 perf/bench_allreduce.py --build "$BUILD_DIR" --repeats 1 "$@"
echo
echo "== ResNet-50, tuned offline for 64 ranks on 25 GbE (fusebox-tune)"
"$BUILD_DIR/tools/fusebox-tune" --profile resnet50 --preset 25gbe --world 64
echo
echo "== ResNet-50 backward replayed on 2 ranks, tuned online and cached (fusebox-perf overlap)"
for run in first second; do
  echo "-- $run run (cache: $BUILD_DIR/demo-cache)"
  "$BUILD_DIR/tools/fusebox-run" -n 2 --output plain -- "$BUILD_DIR/perf/fusebox-perf" overlap \
    --profile resnet50 --compute_scale 0.5 -n 7 -w 1 \
    --plans ddp,ddp-cap1mb,ddp-cap5mb,ddp-cap100mb,horovod,tuned \
    --cache_dir "$BUILD_DIR/demo-cache" --timeline "$BUILD_DIR/demo-timeline"
done
echo "# timelines (open in Perfetto or chrome://tracing): $BUILD_DIR/demo-timeline/resnet50-tuned-rank*.json"
"$BUILD_DIR/tools/fusebox-cache" --dir "$BUILD_DIR/demo-cache" list
