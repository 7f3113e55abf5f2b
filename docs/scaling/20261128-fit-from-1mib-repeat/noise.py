"""The emulated clusters' run-to-run scatter of measured exposed communication:
each (link, hosts, plan) of this report against the same cell of
../20261128-fit-from-1mib (the same command, run earlier on an earlier build).
Exposed = iteration - replayed compute, as the report defines it; scatter =
|a - b| / mean(a, b). Plans that hide nearly everything (under 1 ms in either
run) are also shown apart."""
import glob, json, math, os, statistics

here = os.path.dirname(os.path.abspath(__file__))


def load(folder):
    cells = {}
    for f in glob.glob(os.path.join(folder, "raw", "overlap-*.json")):
        run = os.path.basename(f)[len("overlap-"):-len(".json")]
        for r in json.load(open(f))["results"]:
            cells[(run, r["plan"])] = (r["iteration_us"] - r["compute_us"]) / 1e3
    return cells


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


a = load(os.path.join(here, "..", "20261128-fit-from-1mib"))
b = load(here)
rows = sorted(k for k in a if k in b)
print("| run | plan | exposed ms, first | exposed ms, repeat | scatter |")
print("| --- | --- | ---: | ---: | ---: |")
scatter, big = [], []
for k in rows:
    s = abs(a[k] - b[k]) / ((a[k] + b[k]) / 2) if a[k] + b[k] > 0 else 0.0
    scatter.append(s)
    if min(a[k], b[k]) >= 1:
        big.append(s)
    print("| %s | %s | %.1f | %.1f | %.0f%% |" % (k[0], k[1], a[k], b[k], 100 * s))
print()
print("%d cells: scatter median %.0f%%, p90 %.0f%%; the %d cells exposing >= 1 ms in both: "
      "median %.0f%%, p90 %.0f%%" % (len(scatter), 100 * statistics.median(scatter),
                                     100 * pct(scatter, 0.9), len(big),
                                     100 * statistics.median(big), 100 * pct(big, 0.9)))
