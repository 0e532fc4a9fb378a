from sim import load
import collections
T=load()
nxt=[None]*len(T); last={}
for i in range(len(T)-1,-1,-1):
  d=T[i]['hash_ids'][0]; nxt[i]=last.get(d); last[d]=i
cnt=collections.Counter()
rows=[]
for i,r in enumerate(T):
  d=r['hash_ids'][0]; cnt[d]+=1
  g = None if nxt[i] is None else nxt[i]-i
  rows.append((r['output_length'], len(r['hash_ids']), cnt[d], g))
def tab(keyf, name):
  agg=collections.defaultdict(lambda:[0,0,0,0])
  for o,nb,u,g in rows:
    k=keyf(o,nb,u); a=agg[k]; a[0]+=1; a[3]+=nb
    if g is not None: a[1]+=1; a[2]+= (g<=200)
  print(name)
  for k in sorted(agg): a=agg[k]; print('  ',k,'n',a[0],'blocks',a[3],'P(reuse)',round(a[1]/a[0],3),'P(reuse<=200)',round(a[2]/a[0],3))
tab(lambda o,nb,u: min(o.bit_length(),11),'output_length log2')
tab(lambda o,nb,u: min(u,8),'use count')
tab(lambda o,nb,u: (min(o.bit_length(),11)>=6, min(u,3)), 'out>=32?, uses')
