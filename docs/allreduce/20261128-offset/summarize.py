"""Medians over the repeats of run.sh: in-place and out-of-place busbw per size.
    python3 summarize.py [FOLDER]   (default: this folder; FOLDER/raw holds the runs)"""
import glob, json, os, statistics, sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
d = {}
for f in glob.glob(os.path.join(here, "raw", "*.json")):
    v, off, _ = os.path.basename(f)[:-5].split("-")
    for r in json.load(open(f))["results"]:
        for col in ("ip", "oop"):
            d.setdefault((col, r["bytes"], v, off), []).append(r[col]["busbw"])
for col, name in (("ip", "in place"), ("oop", "out of place")):
    print("%s: busbw GB/s, median of %d runs [min, max]" % (name, len(d[next(iter(d))])))
    print("| bytes | before, offset 0 | before, offset 16 | after, offset 0 | after, offset 16 "
          "| after/before at 16 | after/before at 0 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for b in sorted({k[1] for k in d if k[0] == col}):
        m = {(v, o): statistics.median(d[(col, b, v, o)]) for v in ("before", "after")
             for o in ("off0", "off16")}
        cell = lambda v, o: "%.2f [%.2f, %.2f]" % (m[(v, o)], min(d[(col, b, v, o)]),
                                                  max(d[(col, b, v, o)]))
        print("| %d | %s | %s | %s | %s | %.2fx | %.2fx |" % (
            b, cell("before", "off0"), cell("before", "off16"), cell("after", "off0"),
            cell("after", "off16"), m[("after", "off16")] / m[("before", "off16")],
            m[("after", "off0")] / m[("before", "off0")]))
    print()
