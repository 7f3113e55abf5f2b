#!/bin/bash
# ABBA: the build before (OLD) and with the out-of-cache timing (NEW), one full bench_gap sweep
# each, in the order old, new, new, old. OLD and NEW are build directories (each with
# tools/fusebox-run and perf/fusebox-perf); OUT, where the sweeps go (default: this folder).
#   OLD=<build before> NEW=/tmp/fbb bash docs/gap/20261128-out-of-cache/run.sh
set -eu
cd "$(dirname "$0")/../../.."
out=${OUT:-docs/gap/20261128-out-of-cache}
mkdir -p "$out"
for arm in old new new old; do
  build=$OLD
  [[ $arm == new ]] && build=$NEW
  echo "== $arm $(date +%T)"
  python3 perf/bench_gap.py --build "$build" -n 7 --models resnet50,vit_b16,gpt2_small --ratios 0.5,1,2 \
    --outdir $out/$arm > $out/$arm-$(date +%H%M%S).txt 2>&1
done
echo "== done $(date +%T)"
