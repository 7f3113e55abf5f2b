#!/bin/bash
# fusebox blocking allreduce on H emulated hosts at $RATE (default 4gbit); TAG labels the rows.
H=$1; TAG=$2; shift 2
/usr/bin/python3 /work/main/perf/cluster/emucluster.py run --hosts $H --rate ${RATE:-4gbit} --prefix fbx --subnet 98 --grace 2 --port 29681 $ENVS --fusebox_run /tmp/fbb/tools/fusebox-run -- ${BIN:-/tmp/fbb/perf/fusebox-perf} allreduce --backend ucx -n ${N:-300} -w 20 -d float -o sum -z 1 "$@" 2>&1 | grep -E "^\[0\]: +[0-9]+ " | sed "s/^/$TAG /"
