#!/bin/bash
# The final comparison: c4add88 (A) against this folder's build (B), interleaved. Binaries in
# $A and $B (default /tmp/ab/fusebox-perf.c4add88 and /tmp/ab/fusebox-perf.final).
set -u
cd "$(dirname "$0")"
A=${A:-/tmp/ab/fusebox-perf.c4add88} B=${B:-/tmp/ab/fusebox-perf.final}
./ab.sh 10 final/np2 "$A" "$B" -b 8 -e 64K -f 2 -n 5000 -w 500
./ab.sh 10 final/np2-8B "$A" "$B" -b 8 -e 8 -n 40000 -w 1000
NP=4 ./ab.sh 6 final/np4 "$A" "$B" -b 8 -e 64K -f 2 -n 2000 -w 200
LOAD=1 ./ab.sh 6 final/np2-loaded-8B "$A" "$B" -b 8 -e 8 -n 5000 -w 500
LOAD=1 ./ab.sh 6 final/np2-loaded-4M "$A" "$B" -b 4M -e 4M -n 40 -w 5
