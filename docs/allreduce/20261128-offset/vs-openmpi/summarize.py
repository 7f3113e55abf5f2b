"""Medians over run.sh's repeats: busbw at --offset 16, and fusebox / OpenMPI."""
import glob, json, os, statistics

here = os.path.dirname(os.path.abspath(__file__))
d = {}
for f in glob.glob(os.path.join(here, "raw", "*.json")):
    who = os.path.basename(f).split("-")[0]
    for r in json.load(open(f))["results"]:
        for col in ("oop", "ip"):
            d.setdefault((col, r["bytes"], who), []).append(r[col]["busbw"])
for col, name in (("oop", "out of place"), ("ip", "in place")):
    print("%s, offset 16: busbw GB/s, median of 3" % name)
    print("| bytes | fusebox before | fusebox after | OpenMPI (default) | before / OpenMPI "
          "| after / OpenMPI |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for b in sorted({k[1] for k in d if k[0] == col}):
        m = {w: statistics.median(d[(col, b, w)]) for w in ("before", "after", "openmpi")}
        print("| %d | %.2f | %.2f | %.2f | %.2fx | %.2fx |" % (
            b, m["before"], m["after"], m["openmpi"], m["before"] / m["openmpi"],
            m["after"] / m["openmpi"]))
    print()
