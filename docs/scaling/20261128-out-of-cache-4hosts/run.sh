#!/bin/bash
# ABBA on 4 emulated hosts at 4 Gbit: the build before (OLD) and after (NEW) the out-of-cache timing.
cd "$(dirname "$0")"
i=0
for arm in old new new old; do
  i=$((i+1)); b=$OLD; [[ $arm == new ]] && b=$NEW
  echo "== $i $arm $(date +%T)"
  python3 ../../../perf/cluster/emucluster.py run --hosts 4 --rate 4gbit --prefix fbxab --subnet 96 --grace 2 --port 29691 --fusebox_run $b/tools/fusebox-run -- $b/perf/fusebox-perf overlap --profile resnet50 --compute_scale auto --plans ddp,horovod,mg-wfbp,ddp-cap5mb -n 5 -w 1 --progress 0 --json $PWD/$i-$arm.json > $i-$arm.txt 2>&1
  echo "exit $?"
done
echo "== done $(date +%T)"
