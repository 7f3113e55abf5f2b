#!/usr/bin/env bash
# End-to-end checks of the real fusebox-tune (and, for its cache entry,
# fusebox-cache) binaries; registered with CTest.
# Usage: fusebox_tune_e2e.sh CASE /path/to/fusebox-tune /path/to/fusebox-cache
set -u

case_name=$1
tool=$2
cache_tool=$3

work=$(mktemp -d "${TMPDIR:-/tmp}/fusebox-tune-e2e.XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL [$case_name]: $*" >&2
  for f in "$work"/stdout "$work"/stderr; do
    [ -f "$f" ] && { echo "--- $(basename "$f"):" >&2; head -c 4000 "$f" >&2; }
  done
  exit 1
}

run() {  # run EXPECTED_RC TOOL ARGS...
  local want=$1
  shift
  "$@" >"$work/stdout" 2>"$work/stderr"
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "'$*' exited $rc, expected $want"
}

expect() {  # expect FILE TEXT
  grep -qF -- "$2" "$work/$1" || fail "no '$2' in $1"
}

case "$case_name" in
  offline_plan_and_cache)
    run 0 "$tool" --profile resnet50 --preset 25gbe --world 64 --describe \
      --out "$work/plan.json" --cache_dir "$work/cache" --backend nccl
    for plan in tuned per-tensor ddp horovod hccl mg-wfbp "lower bound"; do expect stdout "  $plan"; done
    expect stdout "# tuned plan:"
    [ -s "$work/plan.json" ] || fail "no plan file"
    grep -q '"format": "fusebox-plan"' "$work/plan.json" || fail "plan.json is not a plan file"
    # The entry is listed by fusebox-cache under the preset's network.
    run 0 "$cache_tool" --dir "$work/cache" list
    expect stdout "-w64-r1-nccl-25gbe-v1.json"
    expect stdout "resnet50"
    ;;
  tuned_never_behind_a_baseline)
    # The "vs tuned" column: every baseline at least as slow as tuned.
    run 0 "$tool" --profile bert_large --preset ib-400g --world 512
    awk '/^  (per-tensor|ddp|horovod|hccl|mg-wfbp) / { if ($NF + 0 < 1.0) bad = 1 } END { exit bad }' \
      "$work/stdout" || fail "a baseline is predicted faster than tuned"
    ;;
  sweep_small)
    run 0 "$tool" sweep --profiles resnet50,vit_b16 --presets 25gbe --worlds 8,64
    expect stdout "# 4 configurations"
    expect stdout "configurations where a baseline beats tuned: 0"
    ;;
  scale_csv_json)
    run 0 "$tool" scale --profiles resnet50,gpt2_small --presets ib-400g,25gbe \
      --scale_worlds 1,8,64 --ranks_per_node 8 --batch_per_rank 32 \
      --csv "$work/s.csv" --json "$work/s.json"
    expect stdout "# fusebox-tune scale"
    # 2 models x 2 networks x 3 worlds x 6 plans, plus the header.
    [ "$(wc -l <"$work/s.csv")" -eq 73 ] || fail "s.csv has $(wc -l <"$work/s.csv") lines, expected 73"
    # Every efficiency in (0, 1]; every world-1 row at efficiency 1.
    awk -F, 'NR > 1 { if ($11 <= 0 || $11 > 1.000001) bad = 1; if ($4 == 1 && $11 != 1) bad = 1 }
             END { exit bad }' "$work/s.csv" || fail "an efficiency outside (0, 1]"
    /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d) == 72, len(d)" \
      "$work/s.json" || fail "s.json does not hold 72 points"
    run 2 "$tool" scale --scale_worlds 8,zero
    expect stderr "--scale_worlds: \"zero\" is not a world size"
    ;;
  fit_from_perf_json)
    cat >"$work/ar.json" <<'J'
{"tool": "fusebox-perf", "collective": "allreduce", "nranks": 4, "results": [
 {"bytes": 4096, "oop": {"time_us": 30.0}, "ip": {"time_us": 31.0}},
 {"bytes": 1048576, "oop": {"time_us": 270.0}, "ip": {"time_us": 280.0}},
 {"bytes": 16777216, "oop": {"time_us": 3870.0}, "ip": {"time_us": 3900.0}}]}
J
    run 0 "$tool" fit --from "$work/ar.json" --ranks_per_node 4 --out "$work/model.json"
    expect stdout "fitted: 4 ranks/node"
    grep -q '"format": "fusebox-cost-model"' "$work/model.json" || fail "no cost-model file"
    run 0 "$tool" --profile resnet50 --cost_model "$work/model.json" --world 4
    expect stdout "# cost model fitted"
    ;;
  staged_device_gradients)
    # Staging every bucket through host memory at 0.5 GB/s costs time: the
    # tuned plan and the bound are both later than with host gradients,
    # and no plan beats the bound.
    run 0 "$tool" --profile resnet50 --preset 25gbe --world 8
    # Rows: name (may be "tuned (= ddp)"), buckets, iter, exposed, iter/bound, vs tuned.
    host_tuned=$(awk '$1 == "tuned" { print $(NF-3) }' "$work/stdout")
    host_bound=$(awk '$1 == "lower" { print $3 }' "$work/stdout")
    run 0 "$tool" --profile resnet50 --preset 25gbe --world 8 --staging_gbps 0.5
    expect stdout "device gradients staged through host memory at 0.5 GB/s"
    awk -v t="$host_tuned" -v b="$host_bound" '
      $1 == "tuned" { tuned = $(NF-3) } $1 == "lower" { bound = $3 }
      /^  (tuned|per-tensor|ddp|horovod|hccl|mg-wfbp) / { if ($(NF-2) + 0 < 1.0) bad = 1 }
      END { exit !(tuned > t && bound > b && !bad) }' "$work/stdout" ||
      fail "staging did not lengthen the tuned plan ($host_tuned ms) and the bound ($host_bound ms), or a plan beat the bound"
    run 1 "$tool" --profile resnet50 --staging_gbps -1
    expect stderr "--staging_gbps is -1"
    run 2 "$tool" --profile resnet50 --staging_gbps 1 --cache_dir "$work/cache"
    expect stderr "--staging_gbps with --cache or --cache_dir"
    [ ! -e "$work/cache" ] || fail "a staged plan reached the cache"
    ;;
  bad_input)
    run 1 "$tool" --profile resnet50 --preset 5gbe
    expect stderr "unknown cost-model preset \"5gbe\""
    run 1 "$tool" --profile alexnet
    run 1 "$tool" --preset 25gbe --cost_model x.json
    expect stderr "give one of --preset, --cost_model and --fit"
    echo '{"format": "fusebox-cost-model", "version": 1, "name": "x", "ranks_per_node": 1,
           "intra_busbw_gbps": -5, "inter_busbw_gbps": 1, "simple": {}}' >"$work/bad.json"
    run 1 "$tool" --cost_model "$work/bad.json"
    expect stderr "bad.json"
    run 2 "$tool" frobnicate
    expect stderr "unknown command"
    run 1 "$tool" fit --from "$work/missing.json"
    ;;
  *)
    fail "unknown case"
    ;;
esac
exit 0
