for rep in 1 2; do
  for c in 128K 1M 4M; do
    /tmp/fbx/tools/fusebox-run -n 2 -- /tmp/fbx/perf/fusebox-perf overlap --profile resnet50 --compute_scale 0.2169 --plans ddp,mg-wfbp,ddp-cap5mb --explain -n 7 -w 1 --progress 0 --ucx_shm_chunk $c --json /tmp/shm/$c-$rep.json > /tmp/shm/$c-$rep.txt 2>&1
  done
done
echo done
