#!/bin/bash
# A/B of staging in the input's phase (Note [Staging in the buffer's phase] in
# comm/ucx/shm_allreduce.cc): BEFORE and AFTER are fusebox-perf builds without
# and with it, both with --offset; runs interleaved, 5 repeats.
#   BEFORE=... AFTER=... RUN=build/tools/fusebox-run bash run.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$here/raw"
for rep in 1 2 3 4 5; do
  for v in before after; do
    bin=$BEFORE; [ $v = after ] && bin=$AFTER
    for off in 0 16; do
      "$RUN" -n 2 -- "$bin" allreduce -b 8K -e 64M -f 8 -n 20 -w 5 --offset $off \
        --json "$here/raw/$v-off$off-$rep.json" > "$here/raw/$v-off$off-$rep.txt" 2>&1
    done
  done
done
