#!/bin/bash
# A scheduler trace of one overlap replay on 2 local ranks (ResNet-50, t(all) = T_b, DDP's
# default plan and 1 MiB buckets), then how long the progress threads waited for a CPU while
# runnable and who ran meanwhile (delays.py). Needs perf and root.
#   BUILD=/tmp/fbb OUT=docs/gap/20261129-stalls bash docs/gap/20261129-stalls/run.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-build}
out=${OUT:-$here}
data=$(mktemp -d)/perf.data
perf sched record -k CLOCK_MONOTONIC -o "$data" -- \
  "$build/tools/fusebox-run" -n 2 -- "$build/perf/fusebox-perf" overlap --profile resnet50 \
  --compute_scale auto --comm_ratio 1 --plans ddp,ddp-cap1mb -n 7 -w 1 --explain \
  --json "$out/overlap.json" > "$out/overlap.txt" 2>&1
perf script -i "$data" -F comm,pid,cpu,time,event,trace > "$out/sched.txt" 2>/dev/null
for t in fb-progress fb-engine fusebox-perf; do
  echo "== $t"
  python3 "$here/delays.py" --thread "$t" < "$out/sched.txt"
  echo
done > "$out/delays.txt"
gzip -f "$out/sched.txt"
cat "$out/delays.txt"
