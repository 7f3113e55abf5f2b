#!/bin/bash
# A/B of staging in the input's phase (Note [Staging in the buffer's phase] in
# comm/ucx/shm_allreduce.cc): BEFORE and AFTER are fusebox-perf builds without
# and with it, both with --offset; runs interleaved.
#   BEFORE=... AFTER=... RUN=build/tools/fusebox-run bash run.sh
# Defaults are this folder's runs (raw/); 4ranks/run.sh sets the others.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ranks=${RANKS:-2} repeats=${REPEATS:-5} out=${OUT:-$here/raw}
read -r -a sweep <<< "${SWEEP:--b 8K -e 64M -f 8 -n 20 -w 5}"
mkdir -p "$out"
for rep in $(seq 1 "$repeats"); do
  for v in before after; do
    bin=$BEFORE; [ $v = after ] && bin=$AFTER
    for off in 0 16; do
      "$RUN" -n "$ranks" -- "$bin" allreduce "${sweep[@]}" --offset $off \
        --json "$out/$v-off$off-$rep.json" > "$out/$v-off$off-$rep.txt" 2>&1
    done
  done
done
