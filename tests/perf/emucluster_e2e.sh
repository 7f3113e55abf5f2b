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
# Usage: emucluster_e2e.sh CASE SCRIPT FUSEBOX_RUN FUSEBOX_PERF
set -u
case_name=$1
script=$2
run_tool=$3
perf_tool=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/fusebox-emucluster.XXXXXX")

probe="fbprobe$$"
if [[ $(id -u) -ne 0 ]] || ! command -v tc >/dev/null || ! ip netns add "$probe" 2>/dev/null; then
  echo "SKIPPED: needs root, tc and permission to create network namespaces"
  exit 77
fi
ip netns del "$probe"
case $case_name in
  allreduce) prefix=fbta subnet=91 port=29661 ;;
  rank_killed) prefix=fbtk subnet=92 port=29662 ;;
  sigterm) prefix=fbtt subnet=93 port=29663 ;;
  sigkill) prefix=fbtx subnet=94 port=29664 ;;
  *) echo "unknown case $case_name" >&2; exit 2 ;;
esac
marker="fusebox-emucluster-$case_name-$$"
trap '/usr/bin/python3 "$script" cleanup --prefix $prefix >/dev/null 2>&1; pkill -9 -f "$marker" 2>/dev/null; rm -rf "$work"' EXIT

fail() {
  echo "FAIL [$case_name]: $*" >&2
  [ -f "$work/out" ] && { echo "--- output:" >&2; tail -c 4000 "$work/out" >&2; }
  exit 1
}

emu() {  # emu ARGS... (in the background; pid in $emu_pid)
  /usr/bin/python3 "$script" run --prefix $prefix --subnet $subnet --port $port \
    --fusebox_run "$run_tool" --grace 2 "$@" >"$work/out" 2>&1 &
  emu_pid=$!
}

nothing_left() {
  local left
  left=$(ip netns list | awk '{print $1}' | grep "^$prefix" || true)
  [ -z "$left" ] || fail "namespaces left behind: $left"
  # (Links live only in those namespaces.) Give killed processes a moment
  # to be reaped; neither ranks nor launchers may survive.
  for _ in $(seq 50); do
    pgrep -f "$marker" >/dev/null || pgrep -f "master-port $port" >/dev/null || return 0
    sleep 0.1
  done
  fail "processes left behind: $(pgrep -af "$marker"; pgrep -af "master-port $port")"
}

wait_for_ranks() {  # wait_for_ranks N: until N ranks have reported
  for _ in $(seq 200); do
    [ "$(grep -c "rank .* of" "$work/out" 2>/dev/null)" -ge "$1" ] && return 0
    sleep 0.1
  done
  fail "ranks did not start"
}

case $case_name in
  allreduce)
    emu --hosts 3 --rate 2gbit --timeout 120 -- "$perf_tool" allreduce -b 4K -e 4M -f 32 -n 3 -w 1 \
      --progress 0
    wait $emu_pid || fail "run exited $?"
    grep -q "backend ucx, 3 ranks" "$work/out" || fail "no 3-rank UCX run"
    grep -q "# Out of bounds values : 0 OK" "$work/out" || fail "results not checked OK"
    nothing_left
    ;;
  rank_killed)
    emu --hosts 3 --rate 1gbit -- bash -c "if [ \$RANK = 1 ]; then sleep 1; kill -9 \$\$; fi; exec -a $marker sleep 60"
    start=$(date +%s)
    wait $emu_pid
    rc=$?
    [ $rc -ne 0 ] || fail "exit status 0 after a rank was killed"
    (( $(date +%s) - start < 20 )) || fail "took $(( $(date +%s) - start )) s to notice"
    grep -q "rank 1 killed by signal SIGKILL" "$work/out" || fail "the dead rank is not named"
    nothing_left
    ;;
  sigterm)
    emu --hosts 2 --ranks_per_host 2 --rate 1gbit -- bash -c "echo rank \$RANK of \$WORLD_SIZE local \$LOCAL_RANK of \$LOCAL_WORLD_SIZE host \$FUSEBOX_EMULATED_HOST addr \$(ip -o -4 addr show fbeth | awk '{print \$4}'); exec -a $marker sleep 60"
    wait_for_ranks 4
    for r in 0 1 2 3; do
      h=$((r / 2))
      grep -q "^\[$r\]: rank $r of 4 local $((r % 2)) of 2 host $h addr 10.231.$subnet.$((h + 1))/24$" "$work/out" ||
        fail "rank $r: wrong numbering, host or address"
    done
    ip netns exec ${prefix}h1 tc qdisc show dev fbeth | grep -q "tbf.*rate 1Gbit" || fail "host 1's link is not shaped"
    ip netns exec ${prefix}sw tc qdisc show dev ${prefix}p0 | grep -q "tbf.*rate 1Gbit" || fail "the switch side is not shaped"
    kill -TERM $emu_pid
    wait $emu_pid
    rc=$?
    [ $rc -eq $((128 + 15)) ] || fail "exit status $rc, expected 143"
    nothing_left
    ;;
  sigkill)
    emu --hosts 2 --rate 1gbit -- bash -c "echo rank \$RANK of \$WORLD_SIZE; exec -a $marker sleep 60"
    wait_for_ranks 2
    kill -KILL $emu_pid
    wait $emu_pid 2>/dev/null
    for _ in $(seq 50); do pgrep -f "$marker" >/dev/null || break; sleep 0.1; done
    pgrep -f "$marker" >/dev/null && fail "ranks survived the script's SIGKILL: $(pgrep -af "$marker")"
    /usr/bin/python3 "$script" cleanup --prefix $prefix || fail "cleanup failed"
    nothing_left
    ;;
esac
echo "PASS [$case_name]"
