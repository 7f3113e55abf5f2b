#!/bin/bash
# The shipped build (d1a07c6): ab.sh's rounds, 10 per configuration, into final/.
cd "$(dirname "$0")/.."
for cfg in "8 4gbit" "8 1gbit" "4 4gbit" "4 1gbit"; do
  set -- $cfg
  RATE=$2 ./ab.sh $1 ${ROUNDS:-10} -b 8K -e 64K -f 2 > final/ab-$1hosts-$2.txt
done
