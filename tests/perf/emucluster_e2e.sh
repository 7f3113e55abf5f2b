#!/usr/bin/env bash
# perf/cluster/emucluster.py end to end (needs root and ip netns; prints
# SKIPPED and exits 77 otherwise). Each case uses its own prefix, subnet and
# port, so cases may run in parallel.
#   allreduce   3 hosts x 1 rank, shaped links: fusebox-perf allreduce over
#               UCX tcp checks every element (#wrong = 0, else non-zero exit)
#   rank_killed kill -9 of one rank: the script exits non-zero within
#               seconds, naming the rank; no namespace or process is left
#   sigterm     2 hosts x 2 ranks: global ranks 0-3 of 4, two per host, each
#               on its host's own address with a tbf-shaped link; SIGTERM to
#               the script mid-run: exit 143, nothing left
#   sigkill     SIGKILL to the script: its launchers and ranks die with it;
#               `cleanup` then removes the namespaces
#   mpirun      `emucluster.py mpirun`, 2 hosts: each rank runs in its own
#               host's namespace with that host's name and address, and
#               MPI_PROGRAM's allreduce across them checks every element
#   opening     4 and 5 hosts x 1 rank: the algorithm table fusebox-perf
#               prints comes from what every rank published at set-up (the
#               hosts share this machine's cores): the linear round opens
#               by default only at 5 ranks and only where they outnumber the
#               cores (where they do not, that check is skipped, said so),
#               never with --ucx_opening rd, always with --ucx_opening
#               linear; Rabenseifner only at 4
# Usage: emucluster_e2e.sh CASE SCRIPT FUSEBOX_RUN FUSEBOX_PERF [MPI_PROGRAM]
set -u
# shellcheck source-path=SCRIPTDIR source=../lib/e2e.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/e2e.sh"
e2e_need_args 4 "$0 CASE SCRIPT FUSEBOX_RUN FUSEBOX_PERF [MPI_PROGRAM]" "$@"
E2E_CASE=$1
script=$2
run_tool=$3
perf_tool=$4
mpi_tool=${5:-}

probe="fbprobe$$"
if [[ $(id -u) -ne 0 ]] || ! command -v tc >/dev/null || ! ip netns add "$probe" 2>/dev/null; then
  echo "SKIPPED: needs root, tc and permission to create network namespaces"
  exit 77
fi
ip netns del "$probe"
case $E2E_CASE in
  allreduce) prefix=fbta subnet=91 port=29661 ;;
  rank_killed) prefix=fbtk subnet=92 port=29662 ;;
  sigterm) prefix=fbtt subnet=93 port=29663 ;;
  sigkill) prefix=fbtx subnet=94 port=29664 ;;
  mpirun) prefix=fbtm subnet=95 port=29665 ;;
  opening) prefix=fbto subnet=96 port=29666 ;;
  *) e2e_unknown_case ;;
esac
[ -f "$script" ] || e2e_fail "no script '$script'"
e2e_need_exec "$run_tool" fusebox-run
e2e_need_exec "$perf_tool" fusebox-perf
marker="fusebox-emucluster-$E2E_CASE-$$"
e2e_workdir fusebox-emucluster
work=$E2E_WORK
e2e_show_on_fail "$work/out"
emu_cleanup() {
  /usr/bin/python3 "$script" cleanup --prefix $prefix >/dev/null 2>&1
  e2e_kill_procs "$marker"
}
e2e_at_exit emu_cleanup

emu() {  # emu ARGS... (in the background; pid in $emu_pid)
  /usr/bin/python3 "$script" run --prefix $prefix --subnet $subnet --port $port \
    --fusebox_run "$run_tool" --grace 2 "$@" >"$work/out" 2>&1 &
  emu_pid=$!
}

nothing_left() {
  local left
  left=$(ip netns list | awk '{print $1}' | grep "^$prefix" || true)
  [ -z "$left" ] || e2e_fail "namespaces left behind: $left"
  # (Links live only in those namespaces.) Give killed processes a moment
  # to be reaped; neither ranks nor launchers may survive.
  e2e_expect_no_procs "$marker|master-port $port" 5 "processes left behind"
}

ranks_reported() {  # ranks_reported N: at least N ranks have reported
  local n
  n=$(grep -c "rank .* of" "$work/out" 2>/dev/null)
  [ "${n:-0}" -ge "$1" ]
}

wait_for_ranks() {  # wait_for_ranks N: until N ranks have reported
  e2e_wait_until 20 ranks_reported "$1" || e2e_fail "ranks did not start"
}

case $E2E_CASE in
  allreduce)
    emu --hosts 3 --rate 2gbit --timeout 120 -- "$perf_tool" allreduce -b 4K -e 4M -f 32 -n 3 -w 1 \
      --progress 0
    wait $emu_pid || e2e_fail "run exited $?"
    grep -q "backend ucx, 3 ranks" "$work/out" || e2e_fail "no 3-rank UCX run"
    grep -q "# Out of bounds values : 0 OK" "$work/out" || e2e_fail "results not checked OK"
    nothing_left
    ;;
  opening)
    cores=$(getconf _NPROCESSORS_ONLN)  # what the ranks count (hardware_concurrency)
    linear="# algorithms: Opening: linear round"
    (( 5 > cores )) || echo "note: 5 ranks do not outnumber $cores cores: the default's linear round is not checked"
    for run in 4 5 5rd 4linear; do
      hosts=${run%%[a-z]*}
      flags=()
      [ "$run" = 5rd ] && flags=(--ucx_opening rd)
      [ "$run" = 4linear ] && flags=(--ucx_opening linear)
      emu --hosts "$hosts" --rate 2gbit --timeout 40 -- "$perf_tool" allreduce -b 8 -e 512K -f 8 \
        -n 3 -w 1 --progress 0 ${flags[@]+"${flags[@]}"}
      wait $emu_pid || e2e_fail "$run: run exited $?"
      grep -q "backend ucx, $hosts ranks" "$work/out" || e2e_fail "$run: no $hosts-rank UCX run"
      grep -q "# Out of bounds values : 0 OK" "$work/out" || e2e_fail "$run: results not checked OK"
      if [ "$run" = 4linear ] || { [ "$run" = 5 ] && (( hosts > cores )); }; then
        grep -qF "$linear" "$work/out" || e2e_fail "$run: $hosts ranks on $cores cores, no linear round"
      elif grep -qF "$linear" "$work/out"; then
        e2e_fail "$run: the linear round opens ($hosts ranks, $cores cores)"
      fi
      if [ "$hosts" = 4 ]; then
        grep -q "# algorithms: AllReduce: .* rabenseifner" "$work/out" ||
          e2e_fail "$run: no Rabenseifner in the table"
      else
        ! grep -q "rabenseifner" "$work/out" || e2e_fail "$run: Rabenseifner at $hosts ranks"
      fi
    done
    nothing_left
    ;;
  rank_killed)
    emu --hosts 3 --rate 1gbit -- bash -c "if [ \$RANK = 1 ]; then sleep 1; kill -9 \$\$; fi; exec -a $marker sleep 60"
    start=$(date +%s)
    wait $emu_pid
    rc=$?
    [ $rc -ne 0 ] || e2e_fail "exit status 0 after a rank was killed"
    (( $(date +%s) - start < 20 )) || e2e_fail "took $(( $(date +%s) - start )) s to notice"
    grep -q "rank 1 killed by signal SIGKILL" "$work/out" || e2e_fail "the dead rank is not named"
    nothing_left
    ;;
  sigterm)
    emu --hosts 2 --ranks_per_host 2 --rate 1gbit -- bash -c "echo rank \$RANK of \$WORLD_SIZE local \$LOCAL_RANK of \$LOCAL_WORLD_SIZE host \$FUSEBOX_EMULATED_HOST addr \$(ip -o -4 addr show fbeth | awk '{print \$4}'); exec -a $marker sleep 60"
    wait_for_ranks 4
    for r in 0 1 2 3; do
      h=$((r / 2))
      grep -q "^\[$r\]: rank $r of 4 local $((r % 2)) of 2 host $h addr 10.231.$subnet.$((h + 1))/24$" "$work/out" ||
        e2e_fail "rank $r: wrong numbering, host or address"
    done
    ip netns exec ${prefix}h1 tc qdisc show dev fbeth | grep -q "tbf.*rate 1Gbit" || e2e_fail "host 1's link is not shaped"
    ip netns exec ${prefix}sw tc qdisc show dev ${prefix}p0 | grep -q "tbf.*rate 1Gbit" || e2e_fail "the switch side is not shaped"
    kill -TERM $emu_pid
    wait $emu_pid
    rc=$?
    [ $rc -eq $((128 + 15)) ] || e2e_fail "exit status $rc, expected 143"
    nothing_left
    ;;
  sigkill)
    emu --hosts 2 --rate 1gbit -- bash -c "echo rank \$RANK of \$WORLD_SIZE; exec -a $marker sleep 60"
    wait_for_ranks 2
    kill -KILL $emu_pid
    wait $emu_pid 2>/dev/null
    e2e_expect_no_procs "$marker" 5 "ranks survived the script's SIGKILL"
    /usr/bin/python3 "$script" cleanup --prefix $prefix || e2e_fail "cleanup failed"
    nothing_left
    ;;
  mpirun)
    if [[ -z $mpi_tool ]] || ! command -v mpirun >/dev/null; then
      echo "SKIPPED: needs OpenMPI's mpirun and an MPI program"
      exit 77
    fi
    e2e_need_exec "$mpi_tool" "MPI program"
    mpi() {  # mpi ARGS...: emucluster.py mpirun on 2 hosts, output in $work/out
      /usr/bin/python3 "$script" mpirun --prefix $prefix --subnet $subnet --hosts 2 --rate 1gbit \
        --timeout 60 --grace 2 -- "$@" >"$work/out" 2>&1
    }
    mpi_left() {  # no orted or MPI program of this case survives
      e2e_expect_no_procs "orted.*10\\.231\\.$subnet\\.|$(basename "$mpi_tool").*-e 1M -f 32" 5 \
        "MPI processes left behind"
    }
    mpi bash -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname) addr $(ip -o -4 addr show fbeth | awk "{print \$4}")"' ||
      e2e_fail "mpirun exited $?"
    for r in 0 1; do
      grep -q "rank $r on ${prefix}h$r addr 10.231.$subnet.$((r + 1))/24$" "$work/out" ||
        e2e_fail "rank $r: not on host $r (its name and address)"
    done
    nothing_left
    mpi "$mpi_tool" -b 8 -e 1M -f 32 -n 3 -w 1 || e2e_fail "the MPI allreduce exited $?"
    grep -q "# Out of bounds values : 0 OK" "$work/out" || e2e_fail "results not checked OK"
    nothing_left
    mpi_left
    ;;
esac
echo "PASS [$E2E_CASE]"
