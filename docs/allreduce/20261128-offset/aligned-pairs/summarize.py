"""Paired after/before busbw ratios of run.sh, per ranks, column and size."""
import glob, json, os, statistics

here = os.path.dirname(os.path.abspath(__file__))
d = {}
for f in glob.glob(os.path.join(here, "raw", "*.json")):
    v, n, rep = os.path.basename(f)[:-5].split("-")
    for r in json.load(open(f))["results"]:
        for col in ("ip", "oop"):
            d.setdefault((n, col, r["bytes"], v), {})[int(rep)] = r[col]["busbw"]
print("| ranks | column | bytes | before (median GB/s) | after | after/before, paired: median "
      "[min, max] | after faster |")
print("| --- | --- | ---: | ---: | ---: | --- | --- |")
for k in sorted({k[:3] for k in d}):
    b, a = d[k + ("before",)], d[k + ("after",)]
    ratios = sorted(a[i] / b[i] for i in b if i in a)
    print("| %s | %s | %d | %.2f | %.2f | %.2f [%.2f, %.2f] | %d of %d |" % (
        k[0][1:], k[1], k[2], statistics.median(b.values()), statistics.median(a.values()),
        statistics.median(ratios), ratios[0], ratios[-1], sum(r > 1 for r in ratios),
        len(ratios)))
