"""Two readings of this folder's runs (python3 reread.py [FOLDER]):
1. The plan the overlap is calibrated on (DDP's default), predicted in the later rounds of its own
   run: |predicted - measured| / measured exposed communication, median and p90 over the runs.
2. tuned / best measured plan, where "best" is chosen on one half of the rounds and scored on the
   other (odd rounds choose, even rounds score, and the reverse; the two ratios averaged), beside
   the same ratio with the best chosen and scored on all rounds. Medians of per-round iteration times."""
import glob, json, os, statistics as st, sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
runs = sorted(glob.glob(os.path.join(here, "*-k*.json")))
err = []
for f in runs:
    for r in json.load(open(f))["results"]:
        if r["plan"] == "ddp" and r["exposed_us"] > 0:
            err.append(abs(r["predicted_exposed_us"] - r["exposed_us"]) / r["exposed_us"])
err.sort()
print("DDP's default, exposed error in its own run: %d runs, median %.0f%%, p90 %.0f%%" % (
    len(err), 100 * st.median(err), 100 * err[min(len(err) - 1, int(0.9 * len(err)))]))
print("| run | tuned/best, all rounds | tuned/best, chosen and scored on different rounds |")
print("| --- | ---: | ---: |")
within = [0, 0]
for f in runs:
    it = {r["plan"]: r["iterations_us"] for r in json.load(open(f))["results"]}
    n = len(it["tuned"])
    med = lambda p, idx: st.median([it[p][i] for i in idx])
    others = [p for p in it if p != "tuned"]
    naive = med("tuned", range(n)) / min(med(p, range(n)) for p in others)
    halves = []
    for choose, score in ((range(0, n, 2), range(1, n, 2)), (range(1, n, 2), range(0, n, 2))):
        best = min(others, key=lambda p: med(p, choose))
        halves.append(med("tuned", score) / med(best, score))
    cross = st.mean(halves)
    within[0] += naive <= 1.05
    within[1] += cross <= 1.05
    print("| %s | %.3f | %.3f |" % (os.path.basename(f)[:-5], naive, cross))
print("tuned/best <= 1.05: %d of %d (all rounds), %d of %d (chosen and scored apart)" % (
    within[0], len(runs), within[1], len(runs)))
