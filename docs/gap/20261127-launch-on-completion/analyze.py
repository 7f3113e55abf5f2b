import json, glob, collections, statistics, sys
D = sys.argv[1]
it = collections.defaultdict(dict)   # (model, ratio, plan, cfg) -> {round: iteration ms}
l2s = collections.defaultdict(list)
bb = collections.defaultdict(dict)   # (model, ratio, cfg) -> {round: best/bound}
for f in sorted(glob.glob(D + '/*.json')):
    m, r, cfg, rnd = f.split('/')[-1][:-5].rsplit('-', 3)
    j = json.load(open(f))
    best = min(res['iteration_us'] / res['bound_us'] for res in j['results'])
    bb[(m, r, cfg)][rnd] = best
    for res in j['results']:
        it[(m, r, res['plan'], cfg)][rnd] = res['iteration_us'] / 1e3
        l2s[(m, r, res['plan'], cfg)].append(res['gap']['launch_to_start_us'] / 1e3)
print("| model | ratio | plan | iter on (ms) | iter off (ms) | on/off, paired by round: median [min, max] | launch->start on (ms) | off (ms) |")
print("|---|---|---|---:|---:|---|---:|---:|")
for k in sorted({k[:3] for k in it}):
    on, off = it[k + ('on',)], it[k + ('off',)]
    pairs = sorted(on[x] / off[x] for x in on if x in off)
    print("| %s | %s | %s | %.2f | %.2f | %.3f [%.3f, %.3f] | %.2f | %.2f |" % (
        k[0], k[1], k[2], statistics.median(on.values()), statistics.median(off.values()),
        statistics.median(pairs), pairs[0], pairs[-1], statistics.median(l2s[k + ('on',)]),
        statistics.median(l2s[k + ('off',)])))
print()
print("| model | ratio | best/bound on (median of rounds) | off | rounds |")
print("|---|---|---:|---:|---:|")
for c in sorted({k[:2] for k in bb}):
    on, off = bb[c + ('on',)], bb[c + ('off',)]
    print("| %s | %s | %.3f | %.3f | %d |" % (c[0], c[1], statistics.median(on.values()),
                                             statistics.median(off.values()), len(on)))
