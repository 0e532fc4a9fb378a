from sim import *
from base_pols import Ghost
import sys
T = load()
BASE = {'0.5M':0.0842,'1M':0.1471,'2M':0.2391,'3M':0.3148,'6M':0.4720}
def show(name, f, caps=('0.5M','1M','2M','3M','6M')):
    r = {c: simulate(T, CAPS[c], f)[0] for c in caps}
    print(f'{name:44s}', ' '.join(f'{c}:{v:.4f}({v/BASE[c]:.2f})' for c, v in r.items()), flush=True)
    return r

class WeightedClassLRU:
    """Per-class LRU lists, clock = pages released; evict head with max (age * w[class]).
    class(page) from clsf(out, uses) where uses includes ghost-remembered history."""
    def __init__(self, n, clsf, w, gf=16):
        self.k = len(w); self.w = w
        self.l = [OrderedDict() for _ in range(self.k)]; self.where = {}; self.cls = {}; self.since = {}
        self.clsf = clsf; self.hash = {}; self.g = Ghost(int(gf * n)); self.uses = {}; self.clock = 0
    def begin(self, r, n): self.r = r
    def on_publish(self, p, h, ext):
        self.hash[p] = h; u = self.g.get(h) or 0; self.uses[p] = u + 1
    def on_hit(self, p): self.uses[p] += 1
    def insert(self, p):
        c = self.clsf(self.r['output_length'], self.uses[p]); self.cls[p] = c
        self.l[c][p] = None; self.where[p] = c; self.since[p] = self.clock; self.clock += 1
    def erase(self, p): del self.l[self.where.pop(p)][p]
    def evict(self):
        best = None; bs = -1
        for c, L in enumerate(self.l):
            if L:
                p = next(iter(L)); s = (self.clock - self.since[p]) * self.w[c]
                if s > bs: best, bs = c, s
        p = self.l[best].popitem(last=False)[0]; del self.where[p]
        self.g.remember(self.hash.pop(p), self.uses.pop(p)); del self.cls[p]; del self.since[p]
        return p
    def size(self): return len(self.where)

def c3(T_):
    return lambda o, u: 2 if u >= 2 else (1 if o < T_ else 0)
def c4(T_):
    return lambda o, u: 3 if u >= 3 else (2 if u == 2 else (1 if o < T_ else 0))
if __name__ == '__main__':
    caps = sys.argv[1].split(',') if len(sys.argv) > 1 else ('1M', '3M')
    for T_ in (32, 64, 128):
        for w in ((1e6, 1, 1), (1e6, 1, 2), (1e6, 1, 0.5), (100, 1, 1), (20, 1, 1), (20, 1, 2), (1e6, 1, 4)):
            show(f'wclass3 T={T_} w={w}', lambda n: WeightedClassLRU(n, c3(T_), w), caps)
