#!/bin/bash
# OpenMPI's tuned algorithm A over its tcp btl on H emulated hosts at $RATE, the same
# iterations as fb.sh.
H=$1; A=$2; shift 2
/usr/bin/python3 /work/main/perf/cluster/emucluster.py mpirun --hosts $H --rate ${RATE:-4gbit} --prefix fbx --subnet 98 --grace 2 --mpirun mpirun -- --mca mpi_yield_when_idle 1 --oversubscribe --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm $A /tmp/fbb/perf/baselines/fusebox-mpi-allreduce -n ${N:-200} -w ${W:-120} -d float -o sum "$@" 2>&1 | grep -E "stdout>: +[0-9]+ " | sed "s/^/mpi-a$A /"
