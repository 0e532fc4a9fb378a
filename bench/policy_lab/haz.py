from sim import *
import collections, math, sys

T = load()
NB = 14
def abucket(a): return min(a.bit_length(), NB-1)   # age in requests: 0,1,2-3,4-7,...
def outc(o):
    return 0 if o < 32 else (1 if o < 128 else 2)
def klass(u, o, nblk):
    return (min(u, 6), outc(o))

def offline_table(T, klassf):
    # events/exposure by (class, age bucket), exposure counted in requests
    ev = collections.Counter(); ex = collections.Counter()
    uses = collections.Counter(); last = {}
    N = len(T)
    nxt = [None]*N; nl = {}
    for i in range(N-1, -1, -1):
        d = T[i]['hash_ids'][0]; nxt[i] = nl.get(d); nl[d] = i
    for i, r in enumerate(T):
        d = r['hash_ids'][0]; uses[d] += 1
        c = klassf(uses[d], r['output_length'], len(r['hash_ids']))
        end = nxt[i] if nxt[i] is not None else N
        g = end - i
        # exposure for ages 1..g (age = i' - i for i' in (i, end])
        # bucket of age a: bit_length(a); bucket b covers [2^(b-1), 2^b -1]
        for b in range(1, NB):
            lo = 1 << (b-1); hi = (1 << b) - 1 if b < NB-1 else 10**9
            if lo > g: break
            ex[(c, b)] += min(hi, g) - lo + 1
        if nxt[i] is not None:
            ev[(c, abucket(g))] += 1
    return {k: ev[k] / ex[k] for k in ex}

class HazardDoc:
    """Doc-level: evict from doc with lowest hazard; deepest page first within doc."""
    def __init__(self, n, table, klassf, tie=0.0):
        self.table = table; self.klassf = klassf
        self.docpages = collections.defaultdict(dict)  # root -> {page: depth} evictable
        self.pdoc = {}; self.pdepth = {}
        self.docinfo = {}  # root -> (last req idx, class)
        self.uses = collections.Counter()
        self.i = 0; self.cache_i = -1; self.heap = None
    def bind(self, ctx): self.ctx = ctx
    def begin(self, r, n):
        self.i = self.ctx.req_index; d = r['hash_ids'][0]
        self.uses[d] += 1
        self.curdoc = d
        self.docinfo[d] = (self.i, self.klassf(self.uses[d], r['output_length'], len(r['hash_ids'])))
        self.heap = None
    def on_publish(self, p, h, ext):
        self.pdoc[p] = self.curdoc; self.pdepth[p] = self.ctx.depth_of[p]
    def on_hit(self, p): pass
    def insert(self, p): self.docpages[self.pdoc[p]][p] = self.pdepth[p]
    def erase(self, p):
        d = self.pdoc[p]; del self.docpages[d][p]
        if not self.docpages[d]: del self.docpages[d]
    def score(self, d):
        li, c = self.docinfo[d]; a = self.i + 1 - li
        return self.table.get((c, abucket(a)), 0.0)
    def evict(self):
        best = None; bs = None
        for d in self.docpages:
            s = self.score(d)
            if bs is None or s < bs or (s == bs and self.docinfo[d][0] < self.docinfo[best][0]):
                best, bs = d, s
        pages = self.docpages[best]
        p = max(pages, key=pages.get)
        self.erase(p); del self.pdoc[p]; del self.pdepth[p]
        return p
    def size(self): return sum(len(v) for v in self.docpages.values())

def show(name, f, caps=('0.5M','1M','2M','3M','6M')):
    base = {'0.5M':0.0842,'1M':0.1471,'2M':0.2391,'3M':0.3148,'6M':0.4720}
    r = {c: simulate(T, CAPS[c], f)[0] for c in caps}
    print(f'{name:40s}', ' '.join(f'{c}:{v:.4f}({v/base[c]:.2f})' for c, v in r.items()), flush=True)

if __name__ == '__main__':
    tab = offline_table(T, klass)
    for k in sorted(tab):
        pass
    show('hazard offline table (u,out)', lambda n: HazardDoc(n, tab, klass), caps=('1M','3M'))
    k2 = lambda u,o,nb: (min(u,6),)
    tab2 = offline_table(T, k2)
    show('hazard offline table (u)', lambda n: HazardDoc(n, tab2, k2), caps=('1M','3M'))
