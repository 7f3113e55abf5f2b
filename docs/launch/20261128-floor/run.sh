#!/bin/bash
# The floor under a sleeping progress thread's launch-to-start, beside
# fusebox's own, interleaved. fusebox-wake-latency (perf/baselines/wake_latency.cc)
# wakes a thread blocked on a condition variable on the same CPU (--through
# cv), or fusebox's AsyncCore's progress thread over an executor that does
# nothing (--through core), at nice -10 as the UCX progress thread runs, the
# issuer yielding until the woken thread has run (as fusebox-perf's launch
# loop does), after 100 us or 1 ms idle; cv also at nice 0 and with an issuer
# that blocks. Then fusebox-perf's launch-to-start of non-blocking calls issued
# to a 2-rank communicator idle for 1 ms (8 B and 64 KiB, 200 samples a size).
#   BUILD=build bash run.sh      (REPEATS, OUT override)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repeats=${REPEATS:-5} out=${OUT:-$here/raw}
wake=$BUILD/perf/baselines/fusebox-wake-latency
mkdir -p "$out"
for rep in $(seq 1 "$repeats"); do
  "$wake" --samples 2000 --nice 0 --issuer blocks > "$out/cv-nice0-blocks-idle100-$rep.txt" 2>&1
  "$wake" --samples 2000 --nice -10 --issuer blocks > "$out/cv-nice-10-blocks-idle100-$rep.txt" 2>&1
  for idle in 100 1000; do
    for t in cv core; do
      "$wake" --samples 2000 --nice -10 --issuer yields --through $t --idle_us $idle \
        > "$out/$t-nice-10-yields-idle$idle-$rep.txt" 2>&1
    done
  done
  "$BUILD/tools/fusebox-run" -n 2 -- "$BUILD/perf/fusebox-perf" allreduce -b 8 -e 64K -f 8192 \
    -n 20 -w 5 --launch 200 --json "$out/fusebox-$rep.json" > "$out/fusebox-$rep.txt" 2>&1
done
