#!/bin/bash
# Buffers off a line over UCX messages: fusebox-perf allreduce on emulated
# hosts (perf/cluster/emucluster.py: one network namespace per host, UCX over
# TCP on a tbf-shaped link), page-aligned buffers against buffers 16 bytes past
# a page (what malloc gives large blocks), runs interleaved.
#   PERF=build/perf/fusebox-perf RUN=build/tools/fusebox-run bash run.sh
# HOSTS, RATE, REPEATS and OUT override the defaults below.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
hosts=${HOSTS:-2 4} rate=${RATE:-4gbit} repeats=${REPEATS:-3} out=${OUT:-$here/raw}
mkdir -p "$out"
for rep in $(seq 1 "$repeats"); do
  for h in $hosts; do
    for off in 0 16; do
      python3 "$root/perf/cluster/emucluster.py" run --fusebox_run "$RUN" --hosts "$h" --ranks_per_host 1 --rate "$rate" -- \
        "$PERF" allreduce -b 64K -e 32M -f 8 -n 20 -w 5 --offset $off \
        --json "$out/h$h-off$off-$rep.json" > "$out/h$h-off$off-$rep.txt" 2>&1
    done
  done
done
