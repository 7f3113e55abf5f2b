"""Medians over the repeats of run.sh: busbw per hosts and size, offset 16 against 0.
    python3 summarize.py [FOLDER]   (default: this folder; FOLDER/raw holds the runs)"""
import glob, json, os, statistics, sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
d = {}
for f in glob.glob(os.path.join(here, "raw", "*.json")):
    h, off, _ = os.path.basename(f)[:-5].split("-")
    for r in json.load(open(f))["results"]:
        for col in ("ip", "oop"):
            d.setdefault((col, int(h[1:]), r["bytes"], off), []).append(r[col]["busbw"])
for col, name in (("ip", "in place"), ("oop", "out of place")):
    runs = len(next(iter(d.values())))
    print("%s: busbw GB/s, median of %d runs [min, max]" % (name, runs))
    print("| hosts | bytes | offset 0 | offset 16 | 16 / 0 |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for h, b in sorted({(k[1], k[2]) for k in d if k[0] == col}):
        v = {o: d[(col, h, b, o)] for o in ("off0", "off16")}
        m = {o: statistics.median(x) for o, x in v.items()}
        cell = lambda o: "%.3f [%.3f, %.3f]" % (m[o], min(v[o]), max(v[o]))
        print("| %d | %d | %s | %s | %.2fx |" % (h, b, cell("off0"), cell("off16"),
                                                m["off16"] / m["off0"]))
    print()
