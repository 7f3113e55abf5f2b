"""Per bucket, from the rank-0 timelines of one emulated run (4 hosts, 4 Gbit;
command in README.md): how long the link sat idle before each bucket that
started while backward ran, and each bucket's transfer (start to done) against
t(m) alone under ../raw/cost-model-4gbit.json, by size class."""
import glob, json, os, re, statistics

here = os.path.dirname(os.path.abspath(__file__))
cm = json.load(open(os.path.join(here, "..", "raw", "cost-model-4gbit.json")))
p = 4
busbw, shared = cm["inter_busbw_gbps"], cm.get("shared_gbps", 0)


def alone_us(m):  # Note [Hosts that share a machine]; the fit's latency is 0
    t = 2 * (p - 1) / p * m / (busbw * 1e3)
    return t + (2 * (p - 1) * m / (shared * 1e3) if shared else 0)


for f in sorted(glob.glob(os.path.join(here, "timelines", "*rank0.json"))):
    ev = json.load(open(f))["traceEvents"]
    bend = [e["ts"] for e in ev if e.get("name") == "backward end"][-1]
    starts = {e["args"]["bucket"]: e["ts"] + e["dur"] for e in ev if e.get("name") == "waits to start"}
    buckets = sorted((e for e in ev if re.match(r"bucket \d+$", e.get("name", ""))),
                     key=lambda e: e["ts"])
    idle, rows, prev = [], [], None
    for e in buckets:
        start = starts.get(e["args"]["bucket"], e["ts"])
        done = e["ts"] + e["dur"]
        if prev is not None and start < bend:
            idle.append(start - prev)
        rows.append((e["args"]["bytes"], done - start))
        prev = done
    print("%s: %d buckets; idle before a bucket started in backward: max %.0f us" % (
        os.path.basename(f)[len("resnet50-"):-len("-rank0.json")], len(rows), max(idle or [0])))
    for lo, hi in ((0, 256 << 10), (256 << 10, 1 << 20), (1 << 20, 4 << 20), (4 << 20, 1 << 40)):
        sel = [(m, t) for m, t in rows if lo <= m < hi]
        if sel:
            print("  %9d-%-11d B: %3d buckets, transfer / alone %.2f, excess median %.0f us" % (
                lo, hi, len(sel), sum(t for _, t in sel) / sum(alone_us(m) for m, _ in sel),
                statistics.median(t - alone_us(m) for m, t in sel)))
