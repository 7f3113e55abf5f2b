#!/usr/bin/env bash
# End-to-end checks of the real fusebox-tune (and, for its cache entry,
# fusebox-cache) binaries; registered with CTest.
# Usage: fusebox_tune_e2e.sh CASE /path/to/fusebox-tune /path/to/fusebox-cache
set -u
# shellcheck source-path=SCRIPTDIR source=../lib/e2e.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/e2e.sh"
e2e_need_args 3 "$0 CASE /path/to/fusebox-tune /path/to/fusebox-cache" "$@"

E2E_CASE=$1
tool=$2
cache_tool=$3
e2e_need_exec "$tool" fusebox-tune
e2e_need_exec "$cache_tool" fusebox-cache

e2e_workdir fusebox-tune-e2e
work=$E2E_WORK

case "$E2E_CASE" in
  offline_plan_and_cache)
    e2e_run 0 "$tool" --profile resnet50 --preset 25gbe --world 64 --describe \
      --out "$work/plan.json" --cache_dir "$work/cache" --backend nccl
    for plan in tuned per-tensor ddp horovod hccl mg-wfbp "lower bound"; do e2e_expect stdout "  $plan"; done
    e2e_expect stdout "# tuned plan:"
    [ -s "$work/plan.json" ] || e2e_fail "no plan file"
    grep -q '"format": "fusebox-plan"' "$work/plan.json" || e2e_fail "plan.json is not a plan file"
    # The entry is listed by fusebox-cache under the preset's network.
    e2e_run 0 "$cache_tool" --dir "$work/cache" list
    e2e_expect stdout "-w64-r1-nccl-25gbe-v1.json"
    e2e_expect stdout "resnet50"
    ;;
  tuned_never_behind_a_baseline)
    # With --model_error 0 the best predicted plan is chosen: in the "vs tuned"
    # column every baseline is at least as slow as tuned.
    e2e_run 0 "$tool" --profile bert_large --preset ib-400g --world 512 --model_error 0
    awk '/^  (per-tensor|ddp|horovod|hccl|mg-wfbp) / { if ($NF + 0 < 1.0) bad = 1 } END { exit bad }' \
      "$work/stdout" || e2e_fail "a baseline is predicted faster than tuned"
    e2e_expect stdout "# chosen: the best predicted plan"
    ;;
  choice_within_model_error)
    # Note [Choosing under the model's error]: at the default error the plan
    # has fewer buckets than the best predicted one, says so, and no
    # baseline is predicted faster by more than the error allows.
    e2e_run 0 "$tool" --profile resnet50 --preset ib-400g --world 64 --model_error 0
    exact=$(awk '$1 == "tuned" { print $(NF-4) }' "$work/stdout")
    e2e_run 0 "$tool" --profile resnet50 --preset ib-400g --world 64
    e2e_expect stdout "# chosen: the fewest buckets"
    e2e_expect stdout "model error 25% of exposed communication"
    robust=$(awk '$1 == "tuned" { print $(NF-4) }' "$work/stdout")
    [ "$robust" -lt "$exact" ] || e2e_fail "the default error chose $robust buckets, the exact optimum has $exact"
    e2e_run 1 "$tool" --profile resnet50 --model_error -0.1
    e2e_expect stderr "--model_error is -0.1"
    ;;
  sweep_small)
    e2e_run 0 "$tool" sweep --profiles resnet50,vit_b16 --presets 25gbe --worlds 8,64
    e2e_expect stdout "# 4 configurations"
    e2e_expect stdout "; beyond it: 0"
    ;;
  scale_csv_json)
    e2e_run 0 "$tool" scale --profiles resnet50,gpt2_small --presets ib-400g,25gbe \
      --scale_worlds 1,8,64 --ranks_per_node 8 --batch_per_rank 32 \
      --csv "$work/s.csv" --json "$work/s.json"
    e2e_expect stdout "# fusebox-tune scale"
    # 2 models x 2 networks x 3 worlds x 6 plans, plus the header.
    [ "$(wc -l <"$work/s.csv")" -eq 73 ] || e2e_fail "s.csv has $(wc -l <"$work/s.csv") lines, expected 73"
    # Every efficiency in (0, 1]; every world-1 row at efficiency 1.
    awk -F, 'NR > 1 { if ($11 <= 0 || $11 > 1.000001) bad = 1; if ($4 == 1 && $11 != 1) bad = 1 }
             END { exit bad }' "$work/s.csv" || e2e_fail "an efficiency outside (0, 1]"
    /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d) == 72, len(d)" \
      "$work/s.json" || e2e_fail "s.json does not hold 72 points"
    e2e_run 2 "$tool" scale --scale_worlds 8,zero
    e2e_expect stderr "--scale_worlds: \"zero\" is not a world size"
    ;;
  fit_from_perf_json)
    cat >"$work/ar.json" <<'J'
{"tool": "fusebox-perf", "collective": "allreduce", "nranks": 4, "results": [
 {"bytes": 4096, "oop": {"time_us": 30.0}, "ip": {"time_us": 31.0}},
 {"bytes": 1048576, "oop": {"time_us": 270.0}, "ip": {"time_us": 280.0}},
 {"bytes": 16777216, "oop": {"time_us": 3870.0}, "ip": {"time_us": 3900.0}}]}
J
    e2e_run 0 "$tool" fit --from "$work/ar.json" --ranks_per_node 4 --out "$work/model.json"
    e2e_expect stdout "fitted: 4 ranks/node"
    grep -q '"format": "fusebox-cost-model"' "$work/model.json" || e2e_fail "no cost-model file"
    e2e_run 0 "$tool" --profile resnet50 --cost_model "$work/model.json" --world 4
    e2e_expect stdout "# cost model fitted"
    # Ranks sharing one machine (autotune/README.md): times made by links at
    # 0.5 GB/s, a machine at 2.5 GB/s for all ranks and 20 us per ring step,
    # at 2 and 4 ranks; the fit recovers the machine and predicts 8 ranks,
    # held out, exactly.
    for w in 2 4 8; do
      case $w in
        2) rows='65536 223.501 1048576 2976.013 16777216 47016.205' ;;
        4) rows='65536 473.894 1048576 5782.31 16777216 90716.966' ;;
        8) rows='1048576 9822.042' ;;
      esac
      # shellcheck disable=SC2086  # word splitting of rows is meant
      printf '{"tool": "fusebox-perf", "collective": "allreduce", "nranks": %d, "results": [%s]}\n' \
        "$w" "$(printf '{"bytes": %s, "oop": {"time_us": %s}},' $rows | sed 's/,$//')" \
        >"$work/w$w.json"
    done
    e2e_run 0 "$tool" fit --from "$work/w2.json,$work/w4.json" --shared_machine \
      --validate "$work/w8.json" --out "$work/shared.json"
    e2e_expect stdout "busbw 0.5 GB/s intra"
    e2e_expect stdout "ranks share one machine at 2.5 GB/s in all"
    e2e_expect stdout "# error, held out: 1 sizes, |error| median 0.0%, max 0.0%"
    grep -Eq '"shared_gbps": 2\.(5|49999)' "$work/shared.json" ||
      e2e_fail "no shared_gbps of 2.5 in the file"
    e2e_run 0 "$tool" --profile resnet50 --cost_model "$work/shared.json" --world 8
    e2e_expect stdout "share one machine at 2.5 GB/s"
    # A size below --min_bytes (here absurdly slow) is printed, not fitted.
    sed 's/"results": \[/"results": [{"bytes": 4096, "oop": {"time_us": 1000}}, /' \
      "$work/w2.json" >"$work/w2small.json"
    e2e_run 0 "$tool" fit --from "$work/w2small.json,$work/w4.json" --shared_machine \
      --min_bytes 65536 --validate "$work/w8.json"
    e2e_expect stdout "ranks share one machine at 2.5 GB/s in all"
    e2e_expect stdout "(below --min_bytes: not fitted)"
    e2e_expect stdout "# error, held out: 1 sizes, |error| median 0.0%, max 0.0%"
    e2e_run 0 "$tool" fit --from "$work/w2small.json,$work/w4.json" --shared_machine
    e2e_expect_not stdout "ranks share one machine at 2.5 GB/s in all"
    e2e_run 2 "$tool" --profile resnet50 --preset 25gbe --min_bytes 1
    e2e_expect stderr "are for \`fusebox-tune fit\`"
    e2e_run 2 "$tool" sweep --worlds 8 --validate "$work/w8.json"
    e2e_expect stderr "are for \`fusebox-tune fit\`"
    e2e_run 2 "$tool" scale --presets 25gbe --shared_machine
    e2e_expect stderr "--shared_machine applies to a fit"
    e2e_run 1 "$tool" fit --from "$work/w2.json,$work/w4.json" --min_bytes 16777216
    e2e_expect stderr "(2 of 6 measurements are of at least --min_bytes 16777216)"
    e2e_run 1 "$tool" fit --from "$work/w2.json,$work/w4.json" --min_bytes 2000000 \
      --validate "$work/w8.json"
    e2e_expect stderr "--validate: no timed allreduce of at least --min_bytes (2000000)"
    # Without the option: one bandwidth, which misses the held-out 8 ranks.
    e2e_run 0 "$tool" fit --from "$work/w2.json,$work/w4.json" --validate "$work/w8.json"
    e2e_expect_not stdout "share one machine"
    e2e_expect_not stdout "# error, held out: 1 sizes, |error| median 0.0%"
    e2e_run 1 "$tool" fit --from "$work/w4.json" --shared_machine
    e2e_expect stderr "needs measurements at two or more"
    ;;
  staged_device_gradients)
    # Staging every bucket through host memory at 0.5 GB/s costs time: the
    # tuned plan and the bound are both later than with host gradients,
    # and no plan beats the bound.
    e2e_run 0 "$tool" --profile resnet50 --preset 25gbe --world 8
    # Rows: name (may be "tuned (= ddp)"), buckets, iter, exposed, iter/bound, vs tuned.
    host_tuned=$(awk '$1 == "tuned" { print $(NF-3) }' "$work/stdout")
    host_bound=$(awk '$1 == "lower" { print $3 }' "$work/stdout")
    e2e_run 0 "$tool" --profile resnet50 --preset 25gbe --world 8 --staging_gbps 0.5
    e2e_expect stdout "device gradients staged through host memory at 0.5 GB/s"
    awk -v t="$host_tuned" -v b="$host_bound" '
      $1 == "tuned" { tuned = $(NF-3) } $1 == "lower" { bound = $3 }
      /^  (tuned|per-tensor|ddp|horovod|hccl|mg-wfbp) / { if ($(NF-2) + 0 < 1.0) bad = 1 }
      END { exit !(tuned > t && bound > b && !bad) }' "$work/stdout" ||
      e2e_fail "staging did not lengthen the tuned plan ($host_tuned ms) and the bound ($host_bound ms), or a plan beat the bound"
    e2e_run 1 "$tool" --profile resnet50 --staging_gbps -1
    e2e_expect stderr "--staging_gbps is -1"
    e2e_run 2 "$tool" --profile resnet50 --staging_gbps 1 --cache_dir "$work/cache"
    e2e_expect stderr "--staging_gbps with --cache or --cache_dir"
    [ ! -e "$work/cache" ] || e2e_fail "a staged plan reached the cache"
    ;;
  bad_input)
    e2e_run 1 "$tool" --profile resnet50 --preset 5gbe
    e2e_expect stderr "unknown cost-model preset \"5gbe\""
    e2e_run 1 "$tool" --profile alexnet
    e2e_run 1 "$tool" --preset 25gbe --cost_model x.json
    e2e_expect stderr "give one of --preset, --cost_model and --fit"
    echo '{"format": "fusebox-cost-model", "version": 1, "name": "x", "ranks_per_node": 1,
           "intra_busbw_gbps": -5, "inter_busbw_gbps": 1, "simple": {}}' >"$work/bad.json"
    e2e_run 1 "$tool" --cost_model "$work/bad.json"
    e2e_expect stderr "bad.json"
    e2e_run 2 "$tool" frobnicate
    e2e_expect stderr "unknown command"
    e2e_run 1 "$tool" fit --from "$work/missing.json"
    ;;
  *)
    e2e_unknown_case
    ;;
esac
exit 0
