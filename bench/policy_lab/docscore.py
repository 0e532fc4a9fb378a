from sim import *
import collections, math, sys

T = load()
BASE = {'0.5M':0.0842,'1M':0.1471,'2M':0.2391,'3M':0.3148,'6M':0.4720}

class DocState:
    __slots__ = ('times', 'outs', 'nblk', 'dec', 'dect', 'hits')
    def __init__(self):
        self.times = []; self.outs = []; self.nblk = []; self.dec = 0.0; self.dect = 0; self.hits = 0

class DocScore:
    """Doc-level score; evict the min-score doc's deepest evictable page. score(ds, now) -> float (higher = keep)."""
    def __init__(self, n, scoref, npages_hint=None):
        self.scoref = scoref; self.n = n
        self.docpages = collections.defaultdict(dict)
        self.pdoc = {}; self.pdepth = {}
        self.ds = collections.defaultdict(DocState)
        self.i = 0; self.sc = None; self.sz = 0
    def bind(self, ctx): self.ctx = ctx
    def begin(self, r, n):
        self.i = self.ctx.req_index; d = r['hash_ids'][0]
        s = self.ds[d]
        s.times.append(self.i); s.outs.append(r['output_length']); s.nblk.append(len(r['hash_ids']))
        if n > 0: s.hits += 1
        self.curdoc = d; self.sc = {}
    def on_publish(self, p, h, ext):
        self.pdoc[p] = self.curdoc; self.pdepth[p] = self.ctx.depth_of[p]
    def on_hit(self, p): pass
    def insert(self, p): self.docpages[self.pdoc[p]][p] = self.pdepth[p]; self.sz += 1
    def erase(self, p):
        d = self.pdoc[p]; del self.docpages[d][p]; self.sz -= 1
        if not self.docpages[d]: del self.docpages[d]
    def score(self, d):
        v = self.sc.get(d)
        if v is None:
            v = self.sc[d] = self.scoref(self.ds[d], self.i, self)
        return v
    def evict(self):
        best = min(self.docpages, key=self.score)
        pages = self.docpages[best]
        p = max(pages, key=pages.get)
        self.erase(p); del self.pdoc[p]; del self.pdepth[p]
        return p
    def size(self): return self.sz

def show(name, f, caps=('0.5M','1M','2M','3M','6M')):
    r = {c: simulate(T, CAPS[c], f)[0] for c in caps}
    print(f'{name:44s}', ' '.join(f'{c}:{v:.4f}({v/BASE[c]:.2f})' for c, v in r.items()), flush=True)
    return r

def lru_s(s, now, pol): return s.times[-1]
def decayed(H):
    def f(s, now, pol):
        return sum(0.5 ** ((now - t) / H) for t in s.times)
    return f
def window(W):
    def f(s, now, pol):
        return sum(1 for t in s.times if now - t < W) + s.times[-1] * 1e-6
    return f

if __name__ == '__main__':
    caps = sys.argv[1].split(',') if len(sys.argv) > 1 else ('1M','3M')
    show('doc LRU', lambda n: DocScore(n, lru_s), caps)
    for H in (50, 100, 200, 400, 800, 1600):
        show(f'decayed count H={H}', lambda n, H=H: DocScore(n, decayed(H)), caps)
