#!/usr/bin/env bash
# The main job on an embedded default: installs, builds, and runs
#  1. the allreduce comparison on local ranks (fusebox UCX vs OpenMPI vs
#     PyTorch Gloo, float32 sum, 2 and 4 ranks, 8 B .. 64 MB), printing a
#     table and the ratios (extra arguments go to perf/bench_allreduce.py);
#  2. the bundled ResNet-50 profile replayed on 2 ranks through the bucketing
#     engine with the per-tensor, DDP, Horovod and HCCL plans.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
/usr/bin/python3 perf/bench_allreduce.py --build "$BUILD_DIR" --repeats 1 "$@"
echo
echo "== ResNet-50 backward replayed on 2 ranks (fusebox-perf overlap)"
"$BUILD_DIR/tools/fusebox-run" -n 2 --output plain -- "$BUILD_DIR/perf/fusebox-perf" overlap \
  --profile resnet50 --compute_scale auto -n 10 -w 2
