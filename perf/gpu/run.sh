#!/usr/bin/env bash
# The GPU benchmark, one command (perf/gpu/README.md):
#
#   bash perf/gpu/run.sh [BUILD_DIR] [OUTDIR]
#
# 1. fusebox-gpu-bench: device copies through the device seam against
#    cudaMemcpyAsync, NCCL's one-rank allreduce against a copy, and one
#    engine iteration on the NCCL communicator against the same work by hand.
# 2. Real DDP with ResNet-50 and a GPT-2-small-sized transformer on one GPU
#    shared by 2 and then 4 ranks (gloo): DDP at its default 25 MiB and at
#    hand-set caps of 1, 5 and 100 MiB against DDP + fusebox.torch.register
#    (the native path: fusebox chooses DDP's buckets, tuned from an empty
#    cache), cells interleaved, 3 rounds (perf/bench_ddp_hook.py --device cuda).
# Tables go to stdout and OUTDIR (default build/bench-out/gpu/<timestamp>); each DDP
# run writes its compact summary, result.json, for a results page. Variables:
# PYTHON (the Python with CUDA torch; default /opt/torch/.venv/bin/python,
# else /usr/bin/python3), ROUNDS (3), RANKS ("2 4"), MODELS (resnet50,gpt2small).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
outdir=${2:-build/bench-out/gpu/$(date +%Y%m%d-%H%M%S)}
python=${PYTHON:-/opt/torch/.venv/bin/python}
[[ -x $python ]] || python=/usr/bin/python3
mkdir -p "$outdir"

if [[ ! -x $build/perf/fusebox-gpu-bench ]]; then
  echo "run.sh: $build/perf/fusebox-gpu-bench is missing: build with CUDA and NCCL found" >&2
  exit 1
fi
echo "== device copies, NCCL on one rank, the engine on NCCL"
"$build/perf/fusebox-gpu-bench" | tee "$outdir/device.txt"
if grep -q '^SKIPPED' "$outdir/device.txt"; then
  echo "run.sh: no GPU here; the DDP part needs one too" >&2
  exit 0
fi

for ranks in ${RANKS:-2 4}; do
  echo "== real DDP on one GPU shared by $ranks ranks"
  "$python" perf/bench_ddp_hook.py --device cuda --python "$python" --build "$build" \
    --models "${MODELS:-resnet50,gpt2small}" --links loopback --ranks "$ranks" \
    --rounds "${ROUNDS:-3}" --batch-cnn 32 --image 224 --batch-transformer 8 \
    --outdir "$outdir/ddp-$ranks"
done
echo "== written to $outdir"
