#!/bin/bash
# 4 local ranks (oversubscribed on 2 cores): fusebox before and after staging
# in the input's phase, at --offset 0 and 16, interleaved, 3 repeats.
#   BEFORE=... AFTER=... RUN=build/tools/fusebox-run bash run.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$here/raw"
for rep in 1 2 3; do
  for v in before after; do
    bin=$BEFORE; [ $v = after ] && bin=$AFTER
    for off in 0 16; do
      "$RUN" -n 4 -- "$bin" allreduce -b 64K -e 32M -f 8 -n 10 -w 3 --offset $off \
        --json "$here/raw/$v-off$off-$rep.json" > "$here/raw/$v-off$off-$rep.txt" 2>&1
    done
  done
done
