import statistics as st, collections, sys
rows=[l.split() for l in open(sys.argv[1])]
per={}; d=collections.defaultdict(list)
for r in rows:
    if len(r)<4: continue
    v=min(float(r[2]),float(r[3])); d[r[1]].append(v); per[(r[0],r[1])]=v
for k,v in d.items(): print(k, "median %.3f"%st.median(v), "min %.2f max %.2f"%(min(v),max(v)))
vs=[k for k in d if k!='mpi']
for v in vs:
    rat=[per[(i,v)]/per[(i,'mpi')] for i in set(x[0] for x in per) if (i,v) in per and (i,'mpi') in per]
    print(v,"/mpi median %.3f"%st.median(rat), sorted(round(x,2) for x in rat))
