#!/bin/bash
OUT=${OUT:-.}; BUILD=${BUILD:?a build directory with perf/fusebox-perf and tools/fusebox-run}
for rep in 1 2 3 4 5 6; do
  for mode in auto cached streamed; do
    timeout 120 $BUILD/tools/fusebox-run -n 2 -- $BUILD/perf/fusebox-perf allreduce -b 16M -e 96M -f 6 -n 10 -w 3 --launch 0 --ucx_shm_stores $mode --json $OUT/$mode-$rep.json > $OUT/$mode-$rep.log 2>&1
  done
done
echo done > $OUT/DONE
