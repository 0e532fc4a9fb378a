from sim import load
import collections, statistics
T=load()
seen=set()
last={}; uses=collections.Counter(); gaps=[]; ext=collections.Counter()
lens_first_reused=[]; lens_first_once=[]
docreq=collections.defaultdict(list)
for i,r in enumerate(T):
  h=r['hash_ids']; d=h[0]; docreq[d].append(i)
for i,r in enumerate(T):
  h=r['hash_ids']; d=h[0]; k=0
  while k<len(h) and h[k] in seen: k+=1
  if d in last:
    gaps.append(i-last[d])
    ext['same' if k==len(h) else ('extend' if k>0 else 'none')]+=1
  last[d]=i; seen.update(h)
print(ext)
gaps.sort(); n=len(gaps)
print('gaps n',n,[gaps[int(n*q)] for q in (0.05,0.1,0.25,0.5,0.75,0.9)])
# hist of gaps in buckets
b=collections.Counter(min(g.bit_length(),13) for g in gaps); print(sorted(b.items()))
# first-request features for docs reused vs not
fr=[];fo=[]
for d,idx in docreq.items():
  r=T[idx[0]]
  (fr if len(idx)>1 else fo).append((len(r['hash_ids']), r['output_length']))
for name,x in (('reused',fr),('once',fo)):
  print(name, len(x), 'blocks med', statistics.median(a for a,b in x), 'mean', sum(a for a,b in x)/len(x), 'out med', statistics.median(b for a,b in x))
# blocks of once docs
print('blocks in once docs', sum(a for a,b in fo), 'reused docs first', sum(a for a,b in fr))
# block-length hist by reused
for lo,hi in ((1,2),(2,5),(5,20),(20,40),(40,80),(80,400)):
  a=sum(1 for x,_ in fr if lo<=x<hi); c=sum(1 for x,_ in fo if lo<=x<hi); print(lo,hi,a,c, round(a/(a+c+1e-9),3))
