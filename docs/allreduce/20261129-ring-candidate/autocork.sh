#!/bin/bash
# autocork.sh AC RATE H TOOL SIZES...: fusebox (TOOL=fb) or OpenMPI algorithm K (TOOL=aK) with
# net.ipv4.tcp_autocorking=AC in every host's namespace.
AC=$1; RATE=$2; H=$3; T=$4; shift 4
if [[ $T == fb ]]; then
python3 /work/main/perf/cluster/emucluster.py run --hosts $H --rate $RATE --prefix fbx --subnet 98 --grace 2 --port 29681 --fusebox_run /tmp/fbb/tools/fusebox-run -- /bin/sh -c "sysctl -qw net.ipv4.tcp_autocorking=$AC; exec /tmp/fbb/perf/fusebox-perf allreduce --backend ucx -n ${N:-50} -w ${W:-140} -d float -o sum -z 1 $*" 2>&1 | grep -E "^\[0\]: +[0-9]" | sed "s/^/fb ac=$AC /"
else
python3 /work/main/perf/cluster/emucluster.py mpirun --hosts $H --rate $RATE --prefix fbx --subnet 98 --grace 2 --mpirun mpirun -- --mca mpi_yield_when_idle 1 --oversubscribe --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm ${T#a} /bin/sh -c "sysctl -qw net.ipv4.tcp_autocorking=$AC; exec /tmp/fbb/perf/baselines/fusebox-mpi-allreduce -n ${N:-50} -w ${W:-140} -d float -o sum $*" 2>&1 | grep -E "stdout>: +[0-9]+ " | sed "s/^/mpi-$T ac=$AC /"
fi
