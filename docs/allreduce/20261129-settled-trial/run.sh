#!/bin/bash
# The four configurations, 6 rounds each, into ab-<H>hosts-<RATE>.txt.
for cfg in "8 4gbit" "8 1gbit" "4 4gbit" "4 1gbit"; do
  set -- $cfg
  RATE=$2 ./ab.sh $1 ${ROUNDS:-6} -b 8K -e 64K -f 2 > ab-$1hosts-$2.txt
done
