"""Medians over the repeats of run.sh.   python3 summarize.py [FOLDER]"""
import glob, json, os, re, statistics, sys

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
raw = os.path.join(here, "raw")
rows = []
for pat, name in (
        ("cv-nice0-blocks-idle100", "condition variable, nice 0, issuer blocks, idle 100 us"),
        ("cv-nice-10-blocks-idle100", "condition variable, nice -10, issuer blocks, idle 100 us"),
        ("cv-nice-10-yields-idle100", "condition variable, nice -10, issuer yields, idle 100 us"),
        ("core-nice-10-yields-idle100", "AsyncCore, no-op executor, nice -10, idle 100 us"),
        ("cv-nice-10-yields-idle1000", "condition variable, nice -10, issuer yields, idle 1 ms"),
        ("core-nice-10-yields-idle1000", "AsyncCore, no-op executor, nice -10, idle 1 ms")):
    p50, p99 = [], []
    for f in glob.glob(os.path.join(raw, pat + "-*.txt")):
        m = re.search(r"p50 ([0-9.]+) p90 [0-9.]+ p99 ([0-9.]+)", open(f).read())
        p50.append(float(m.group(1)))
        p99.append(float(m.group(2)))
    rows.append((name, p50, p99))
fb = {}
for f in glob.glob(os.path.join(raw, "fusebox-*.json")):
    for r in json.load(open(f))["results"]:
        if "launch_us" in r:
            fb.setdefault(r["bytes"], ([], []))
            fb[r["bytes"]][0].append(r["launch_us"]["p50"])
            fb[r["bytes"]][1].append(r["launch_us"]["p99"])
for b in sorted(fb):
    rows.append(("fusebox-perf launch-to-start, UCX, 2 ranks, %d B, idle 1 ms" % b, *fb[b]))
print("| what | p50 us, median [min, max] | p99 us, median [min, max] | runs |")
print("| --- | ---: | ---: | ---: |")
cell = lambda v: "%.2f [%.2f, %.2f]" % (statistics.median(v), min(v), max(v))
for name, p50, p99 in rows:
    print("| %s | %s | %s | %d |" % (name, cell(p50), cell(p99), len(p50)))
