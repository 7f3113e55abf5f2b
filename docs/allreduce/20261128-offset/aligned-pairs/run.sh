#!/bin/bash
# Aligned buffers (offset 0): before and after staging in the input's phase,
# paired (before then after, same repeat), 8 repeats, 2 and 4 local ranks.
#   BEFORE=... AFTER=... RUN=build/tools/fusebox-run bash run.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$here/raw"
for rep in 1 2 3 4 5 6 7 8; do
  for n in 2 4; do
    for v in before after; do
      bin=$BEFORE; [ $v = after ] && bin=$AFTER
      "$RUN" -n $n -- "$bin" allreduce -b 512K -e 4M -f 8 -n 20 -w 5 \
        --json "$here/raw/$v-n$n-$rep.json" > /dev/null 2>&1
    done
  done
done
