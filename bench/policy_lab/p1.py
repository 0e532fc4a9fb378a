from sim import *
from base_pols import Ghost
import sys

class ClassLRU:
    """k LRU lists; evict from lowest non-empty class. cls decided at request begin."""
    def __init__(self, n, clsf, gf=16, nclass=2):
        self.l=[OrderedDict() for _ in range(nclass)]; self.where={}; self.cls={}
        self.clsf=clsf; self.hash={}; self.g=Ghost(int(gf*n)); self.cur=0; self.uses={}
    def begin(self, r, n): self.r=r; self.n=n
    def on_publish(self,p,h,ext):
        self.hash[p]=h; u=self.g.get(h) or 0; self.uses[p]=u+1
        self.cls[p]=self.clsf(self.r,self.n,u+1,True)
    def on_hit(self,p):
        self.uses[p]+=1; self.cls[p]=max(self.cls[p], self.clsf(self.r,self.n,self.uses[p],False))
    def insert(self,p): c=self.cls[p]; self.l[c][p]=None; self.where[p]=c
    def erase(self,p): del self.l[self.where.pop(p)][p]
    def evict(self):
        for L in self.l:
            if L:
                p=L.popitem(last=False)[0]; del self.where[p]
                self.g.remember(self.hash.pop(p), self.uses.pop(p)); del self.cls[p]; return p
    def size(self): return len(self.where)

T=load()
def show(name,f):
    r=run_all(f,trace=T); base=[0.0842,0.1471,0.2391,0.3148,0.4720]
    print(f'{name:40s}', ' '.join(f'{v:.4f}' for v in r.values()), ' x', ' '.join(f'{v/b:.2f}' for v,b in zip(r.values(),base)), flush=True)

for thr in (32,64,128,256):
    show(f'out<{thr} or reused -> high', lambda n,thr=thr: ClassLRU(n, lambda r,nh,u,pub: 1 if (r['output_length']<thr or u>=2) else 0))
    show(f'out<{thr} -> high (any use)', lambda n,thr=thr: ClassLRU(n, lambda r,nh,u,pub: 1 if (r['output_length']<thr) else 0))
