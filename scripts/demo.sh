#!/usr/bin/env bash
# The main job on an embedded default: installs, builds, and runs the
# allreduce comparison on local ranks (fusebox UCX vs OpenMPI vs PyTorch Gloo,
# float32 sum, 2 and 4 ranks, 8 B .. 64 MB), printing a table and the ratios.
# Extra arguments go to perf/bench_allreduce.py (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec /usr/bin/python3 perf/bench_allreduce.py --build "${BUILD_DIR:-build}" --repeats 1 "$@"
