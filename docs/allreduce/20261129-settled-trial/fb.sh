#!/bin/bash
# fusebox blocking allreduce on H emulated hosts at $RATE; TAG labels the rows; the rest are
# fusebox-perf arguments. Prints the size rows and the measured choices.
H=$1; TAG=$2; shift 2
/usr/bin/python3 /work/main/perf/cluster/emucluster.py run --hosts $H --rate ${RATE:-4gbit} --prefix fbx --subnet 98 --grace 2 --port 29681 --fusebox_run /tmp/fbb/tools/fusebox-run -- ${BIN:-/tmp/fbb/perf/fusebox-perf} allreduce --backend ucx -n ${N:-200} -w ${W:-120} -d float -o sum -z 1 "$@" 2>&1 | grep -E "^\[0\]: +[0-9]+ |Chosen" | sed "s/^/$TAG /"
