#!/bin/bash
# First calls against steady state, two builds of fusebox-perf interleaved.
# usage: OLD=path NEW=path RUN=path/to/fusebox-run ROUNDS=5 bash run.sh > raw.txt
set -u
for r in $(seq 1 "${ROUNDS:-5}"); do
  for bin in old new; do
    b=$OLD; [ $bin = new ] && b=$NEW
    for size in 32K 256K 2M; do
      for phase in first4:4:0 steady:50:10; do
        IFS=: read -r name n w <<< "$phase"
        t=$("$RUN" -n 2 -- "$b" allreduce --backend ucx -b $size -e $size -n $n -w $w -d float -o sum 2>&1 |
            awk '/^\[0\]: +[0-9]+ /{print $7; exit}')
        echo "round $r build $bin size $size $name us $t"
      done
    done
  done
done
