from collections import OrderedDict
from sim import *

class Ghost:
    def __init__(self, cap):
        self.cap = max(1, cap); self.q = OrderedDict()
    def __contains__(self, h): return h in self.q
    def remember(self, h, v=None):
        if h in self.q:
            self.q[h] = v; return
        if len(self.q) >= self.cap: self.q.popitem(last=False)
        self.q[h] = v
    def get(self, h): return self.q.get(h)

class Tiered:
    def __init__(self, n, gf=16):
        self.l = [OrderedDict(), OrderedDict()]; self.seen = {}; self.hash = {}
        self.g = Ghost(int(gf * n)); self.where = {}
    def on_publish(self, p, h, ext):
        self.hash[p] = h; self.seen[p] = 1 if h in self.g else 0
    def on_hit(self, p): self.seen[p] = 1
    def insert(self, p): self.l[self.seen[p]][p] = None; self.where[p] = self.seen[p]
    def erase(self, p): del self.l[self.where.pop(p)][p]
    def evict(self):
        k = 0 if self.l[0] else 1
        p = self.l[k].popitem(last=False)[0]; del self.where[p]
        self.g.remember(self.hash.pop(p)); del self.seen[p]
        return p
    def size(self): return len(self.l[0]) + len(self.l[1])

class Interval:
    KB = 48; FRESH = 64
    def __init__(self, n, gf=16):
        self.l = [OrderedDict() for _ in range(self.KB)]; self.where = {}
        self.hash = {}; self.st = {}; self.since = {}; self.clock = 0
        self.fresh = self.FRESH * max(n, 1); self.g = Ghost(int(gf * n))
    def on_publish(self, p, h, ext):
        self.hash[p] = h
        s = self.g.get(h)
        self.st[p] = list(s) if s is not None else [self.clock, self.clock, 0]
        self.use(p)
    def use(self, p):
        s = self.st[p]; s[1] = self.clock; s[2] += 1
    def on_hit(self, p): self.use(p)
    def interval(self, s):
        return self.fresh if s[2] < 2 else (s[1] - s[0]) // (s[2] - 1)
    def bucket(self, g): return min((g + 1).bit_length() - 1, self.KB - 1)
    def insert(self, p):
        self.since[p] = self.clock; self.clock += 1
        b = self.bucket(self.interval(self.st[p])); self.l[b][p] = None; self.where[p] = b
    def erase(self, p): del self.l[self.where.pop(p)][p]
    def evict(self):
        best = 0; bs = 0
        for b in range(self.KB - 1, -1, -1):
            if not self.l[b]: continue
            f = next(iter(self.l[b]))
            sc = 2 * (self.clock - self.since[f]) + (1 << b)
            if sc > bs: best, bs = b, sc
        p = self.l[best].popitem(last=False)[0]; del self.where[p]
        self.g.remember(self.hash.pop(p), tuple(self.st.pop(p)))
        return p
    def size(self): return len(self.where)

if __name__ == '__main__':
    T = load()
    for name, f in [('tiered', Tiered), ('interval', Interval)]:
        r = run_all(f, trace=T); print(name, {k: round(v, 4) for k, v in r.items()})
