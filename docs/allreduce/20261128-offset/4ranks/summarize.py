"""Medians over run.sh's repeats, 4 ranks: busbw per size, before/after, offset 0/16."""
import glob, json, os, statistics

here = os.path.dirname(os.path.abspath(__file__))
d = {}
for f in glob.glob(os.path.join(here, "raw", "*.json")):
    v, off, _ = os.path.basename(f)[:-5].split("-")
    for r in json.load(open(f))["results"]:
        for col in ("ip", "oop"):
            d.setdefault((col, r["bytes"], v, off), []).append(r[col]["busbw"])
for col in ("ip", "oop"):
    print("%s: busbw GB/s, median of 3" % col)
    print("| bytes | before, 0 | before, 16 | after, 0 | after, 16 | after/before at 16 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for b in sorted({k[1] for k in d if k[0] == col}):
        m = {(v, o): statistics.median(d[(col, b, v, o)]) for v in ("before", "after")
             for o in ("off0", "off16")}
        print("| %d | %.2f | %.2f | %.2f | %.2f | %.2fx |" % (
            b, m[("before", "off0")], m[("before", "off16")], m[("after", "off0")],
            m[("after", "off16")], m[("after", "off16")] / m[("before", "off16")]))
    print()
