#!/usr/bin/env python3
"""How much of the exposed-communication error is the measurement's own scatter.

Reads one or more bench_gap sweeps run with many rounds (-n 21) by a build whose JSON has
exposed_rounds_us (each measured round's exposed communication) and predicted_rounds_exposed_us
(the simulator's under that round's own sizes), and prints, over the held-out runs (every plan
but ddp, which calibrates the overlap, and tuned):

  1. the model's error against the median of all rounds, and against the median of each block of
     7 consecutive rounds (what a 7-round sweep would have measured);
  2. the measurement against itself: each 7-round block's median against the median of the
     other rounds of the same run (a prediction that knew the run's true median exactly would
     still be this far from a 7-round measurement);
  3. per-round pairing: the median of the per-round predictions, and each round's prediction
     against that round's measurement;
  4. how far each run's median moves when its rounds are drawn again with replacement, for 7
     rounds and for all of them (a bootstrap from a fixed seed).

usage: rounds.py DIR[,DIR...]
"""
import glob
import json
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "20261128-out-of-cache"))
from compare import pct  # noqa: E402

BLOCK = 7
DRAWS = 200




def line(name, errs):
    if not errs:
        return "| %s | 0 | - | - | - |" % name
    a = [abs(e) for e in errs]
    under = sum(1 for e in errs if e < 0)
    return "| %s | %d | %.0f%% | %.0f%% | %.0f%% |" % (
        name, len(errs), 100 * statistics.median(a), 100 * pct(a, 0.9), 100.0 * under / len(errs))


def spearman(x, y):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for k, i in enumerate(order):
            r[i] = float(k)
        return r
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den > 0 else 0.0


def main():
    dirs = []
    for a in sys.argv[1:]:
        dirs += a.split(",")
    model_all, model_block, self_block, paired_med, paired_round = [], [], [], [], []
    by_ratio = {}
    rhos = []
    rounds_seen = set()
    boot = {}
    rng = random.Random(1)
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*.json"))):
            cell = os.path.basename(path)[:-5]
            ratio = cell.rsplit("-r", 1)[1]
            for r in json.load(open(path))["results"]:
                if r["plan"] in ("ddp", "tuned"):
                    continue
                ex = r.get("exposed_rounds_us", [])
                pr = r.get("predicted_rounds_exposed_us", [])
                if not ex or r["exposed_us"] <= 0 or r["predicted_us"] <= 0:
                    continue
                rounds_seen.add(len(ex))
                med = statistics.median(ex)
                pred = r["predicted_exposed_us"]
                e = (pred - med) / med
                model_all.append(e)
                by_ratio.setdefault(ratio, []).append(e)
                for b in range(0, len(ex) - BLOCK + 1, BLOCK):
                    block = ex[b:b + BLOCK]
                    rest = ex[:b] + ex[b + BLOCK:]
                    bm = statistics.median(block)
                    if bm <= 0:
                        continue
                    model_block.append((pred - bm) / bm)
                    if rest:
                        self_block.append((statistics.median(rest) - bm) / bm)
                for n in (BLOCK, len(ex)):
                    boot.setdefault(n, []).extend(
                        abs(statistics.median([rng.choice(ex) for _ in range(n)]) - med) / med
                        for _ in range(DRAWS))
                if len(pr) == len(ex):
                    paired_med.append((statistics.median(pr) - med) / med)
                    paired_round += [(p - x) / x for p, x in zip(pr, ex) if x > 0]
                    if len(set(pr)) > 1 and len(set(ex)) > 1:
                        rhos.append(spearman(pr, ex))
    print("rounds per run: %s; held-out runs: %d" % (sorted(rounds_seen), len(model_all)))
    print()
    print("| what is compared | n | median abs error | p90 abs error | under |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(line("model (sizes: median over the rounds) vs the median of all rounds", model_all))
    print(line("model vs the median of each block of %d rounds" % BLOCK, model_block))
    print(line("each block of %d rounds' median vs the median of the run's other rounds" % BLOCK,
               self_block))
    print(line("median of the per-round predictions vs the median of all rounds", paired_med))
    print(line("each round's prediction (its own sizes) vs that round", paired_round))
    print()
    print("model vs the median of all rounds, by t(all)/T_b:")
    print()
    print("| ratio | n | median abs error | p90 abs error | under |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for ratio in sorted(by_ratio, key=float):
        print(line(ratio, by_ratio[ratio]))
    print()
    print("How far a run's median moves when its rounds are drawn again (bootstrap, %d draws "
          "per run, seed 1), over the held-out runs:" % DRAWS)
    print()
    print("| rounds drawn | median move | p90 move |")
    print("| ---: | ---: | ---: |")
    for n, moves in sorted(boot.items()):
        print("| %d | %.0f%% | %.0f%% |" % (n, 100 * statistics.median(moves), 100 * pct(moves, 0.9)))
    if rhos:
        print()
        print("Spearman correlation of each round's prediction with that round's measurement, per "
              "run: median %.2f (quartiles %.2f, %.2f; %d runs)" % (
                  statistics.median(rhos), pct(rhos, 0.25), pct(rhos, 0.75), len(rhos)))


if __name__ == "__main__":
    main()
