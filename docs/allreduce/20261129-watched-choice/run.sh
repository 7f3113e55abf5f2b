#!/bin/bash
# The four configurations, $ROUNDS rounds each (5 by default), 32-512 KiB, into
# ab-<H>hosts-<RATE>.txt.
cd "$(dirname "$0")"
for cfg in "8 1gbit" "8 4gbit" "4 1gbit" "4 4gbit"; do
  set -- $cfg
  RATE=$2 ./ab.sh $1 ${ROUNDS:-5} -b 32K -e 512K -f 2 > ab-$1hosts-$2.txt
done
