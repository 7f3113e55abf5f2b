#!/usr/bin/env python3
"""The gap report's launch->start term (ms per iteration) and iteration (ms) per plan, model and
configuration, from commbound.sh's logs: medians over rounds [range]."""
import collections, glob, os, re, statistics, sys
d = sys.argv[1]
term = collections.defaultdict(list)
it = collections.defaultdict(list)
for f in glob.glob(os.path.join(d, "*.log")):
    model, cfg, _ = os.path.basename(f)[:-4].rsplit("-", 2)
    for line in open(f):
        m = re.match(r"^\[0\]:   (ddp|ddp-cap1mb|ddp-cap5mb|horovod)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)", line)
        if m:  # the gap table: plan iter gap late-grads window launch->start
            term[(model, m.group(1), cfg)].append(float(m.group(6)))
            it[(model, m.group(1), cfg)].append(float(m.group(2)))
print("| model | plan | launch->start before / after / off (ms) | iteration before / after / off (ms) |")
print("| --- | --- | --- | --- |")
for model in sorted({k[0] for k in term}):
    for plan in ["ddp", "ddp-cap1mb", "ddp-cap5mb", "horovod"]:
        cells = []
        for src in (term, it):
            cells.append(" / ".join("%.2f" % statistics.median(src[(model, plan, c)]) for c in ("before", "after", "off")))
        print("| %s | %s | %s | %s |" % (model, plan, cells[0], cells[1]))
