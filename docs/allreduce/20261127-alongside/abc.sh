#!/bin/bash
# Three builds interleaved, order rotating each round: OLD (before), NEW (after), ALT (after, rank 0 asks after 1 s).
H=$1; R=$2; shift 2
for r in $(seq 1 $R); do
  case $((r % 3)) in
    0) order="before after alt";;
    1) order="after alt before";;
    2) order="alt before after";;
  esac
  for t in $order; do
    case $t in before) b=$OLD;; after) b=$NEW;; alt) b=$ALT;; esac
    BIN=$b ./fb.sh $H $t "$@"
  done
done
