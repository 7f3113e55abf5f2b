#!/bin/bash
# interleaved: rate x hosts x from, 2 rounds; fusebox blocking sweep 8K..64K
out=/tmp/ab_rab; mkdir -p $out
for round in 1 2; do
 for rate in 1gbit 4gbit; do
  for hosts in 4 8; do
   for from in 8K 64K; do
    python3 /work/main/perf/cluster/emucluster.py run --hosts $hosts --rate $rate --prefix fbbab --subnet 96 --grace 2 --port 29681 --fusebox_run /tmp/fbb/tools/fusebox-run -- /tmp/fbb/perf/fusebox-perf allreduce --backend ucx -b 8K -e 64K -f 2 -n 100 -w 10 -d float -o sum -z 1 --ucx_rabenseifner_from $from > $out/r$round-$rate-h$hosts-$from.log 2>&1
   done
  done
 done
done
echo done > $out/DONE
