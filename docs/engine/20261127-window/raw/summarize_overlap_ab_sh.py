import re,statistics as st,collections,sys
d=collections.defaultdict(lambda: collections.defaultdict(list))
for l in open(sys.argv[1]):
    m=re.match(r"(\d+) (\S+) per-tensor\(p50 p99 iter\)=(\S+) (\S+) (\S+) ddp=(\S+) (\S+) (\S+)",l)
    if not m: continue
    n=m.group(2); v=[float(x) for x in m.groups()[2:]]
    for k,x in zip(["pt50","pt99","ptit","dd50","dd99","ddit"],v): d[n][k].append(x)
for n in d:
    print(n, " ".join("%s=%.1f[%.1f-%.1f]"%(k,st.median(v),min(v),max(v)) for k,v in d[n].items()))
