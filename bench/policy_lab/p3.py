from p2 import *
import random
class ARC:
    """ARC over evictable pages; T1 = seen once (incl. ghost), T2 = seen >=2; ghosts B1/B2 of hashes adapt p."""
    def __init__(self, n):
        self.c = n; self.p = 0.0
        self.t = [OrderedDict(), OrderedDict()]; self.b = [OrderedDict(), OrderedDict()]
        self.where = {}; self.hash = {}; self.freq = {}
    def on_publish(self, pg, h, ext):
        self.hash[pg] = h
        if h in self.b[0]:
            self.p = min(self.c, self.p + max(1, len(self.b[1]) / max(1, len(self.b[0])))); del self.b[0][h]; self.freq[pg] = 1
        elif h in self.b[1]:
            self.p = max(0, self.p - max(1, len(self.b[0]) / max(1, len(self.b[1])))); del self.b[1][h]; self.freq[pg] = 1
        else: self.freq[pg] = 0
    def on_hit(self, pg): self.freq[pg] = 1
    def insert(self, pg): k = self.freq[pg]; self.t[k][pg] = None; self.where[pg] = k
    def erase(self, pg): del self.t[self.where.pop(pg)][pg]
    def evict(self):
        k = 0 if (self.t[0] and (len(self.t[0]) > self.p or not self.t[1])) else 1
        pg = self.t[k].popitem(last=False)[0]; del self.where[pg]
        h = self.hash.pop(pg); del self.freq[pg]
        self.b[k][h] = None
        while len(self.b[k]) > self.c: self.b[k].popitem(last=False)
        return pg
    def size(self): return len(self.where)

class TinyAdmit:
    """W-TinyLFU flavour: window LRU (frac) + main LRU; a window victim enters main only if its hash
    frequency (decayed counter, doorkeeper-free exact dict here) >= main victim's; else evicted."""
    def __init__(self, n, frac=0.05, reset=10):
        self.n = n; self.wcap = max(1, int(frac * n))
        self.win = OrderedDict(); self.main = OrderedDict(); self.where = {}; self.hash = {}
        self.cnt = collections.Counter() if False else {}; self.ops = 0; self.reset = reset * n
        self.inwin = {}
    def bump(self, h):
        self.cnt[h] = self.cnt.get(h, 0) + 1; self.ops += 1
        if self.ops >= self.reset:
            self.ops = 0; self.cnt = {k: v // 2 for k, v in self.cnt.items() if v // 2}
    def on_publish(self, pg, h, ext): self.hash[pg] = h; self.bump(h); self.inwin[pg] = True
    def on_hit(self, pg): self.bump(self.hash[pg])
    def insert(self, pg):
        if self.inwin[pg]: self.win[pg] = None; self.where[pg] = 0
        else: self.main[pg] = None; self.where[pg] = 1
    def erase(self, pg): (self.win if self.where.pop(pg) == 0 else self.main).pop(pg)
    def evict(self):
        while True:
            if self.win and (len(self.win) > self.wcap or not self.main):
                cand = next(iter(self.win))
                if self.main:
                    vic = next(iter(self.main))
                    if self.cnt.get(self.hash[cand], 0) > self.cnt.get(self.hash[vic], 0):
                        # admit candidate to main, evict main victim
                        del self.win[cand]; self.main[cand] = None; self.where[cand] = 1; self.inwin[cand] = False
                        pg = vic; del self.main[pg]; break
                pg = cand; del self.win[pg]; break
            pg = self.main.popitem(last=False)[0]; break
        del self.where[pg]; del self.hash[pg]; del self.inwin[pg]
        return pg
    def size(self): return len(self.where)

class LeCaR:
    """LeCaR: mix LRU and LFU(ghost-backed count) with regret weights."""
    def __init__(self, n, lr=0.45, seed=1):
        self.lru = OrderedDict(); self.hash = {}; self.cnt = {}; self.n = n
        self.w = [0.5, 0.5]; self.lr = lr; self.d = 0.005 ** (1 / n); self.rng = random.Random(seed)
        self.hist = [OrderedDict(), OrderedDict()]; self.t = 0; self.freq = {}
        import heapq; self.heap = []; self.ver = {}
    def on_publish(self, pg, h, ext):
        self.t += 1; self.hash[pg] = h
        for k in (0, 1):
            if h in self.hist[k]:
                age = self.t - self.hist[k].pop(h)
                r = self.d ** age
                self.w[k] *= __import__('math').exp(-self.lr * r)  # policy k was wrong
                s = sum(self.w); self.w = [x / s for x in self.w]
        self.cnt[h] = self.cnt.get(h, 0) + 1
    def on_hit(self, pg): h = self.hash[pg]; self.cnt[h] = self.cnt.get(h, 0) + 1
    def insert(self, pg):
        import heapq
        self.lru[pg] = None; v = self.ver.get(pg, 0) + 1; self.ver[pg] = v
        heapq.heappush(self.heap, (self.cnt[self.hash[pg]], self.t, pg, v)); self.t += 1
    def erase(self, pg): del self.lru[pg]; self.ver[pg] += 1
    def evict(self):
        import heapq
        k = 0 if self.rng.random() < self.w[0] else 1
        if k == 0: pg = next(iter(self.lru))
        else:
            while True:
                c, _, pg, v = heapq.heappop(self.heap)
                if self.ver.get(pg) == v and pg in self.lru: break
        del self.lru[pg]; self.ver[pg] += 1
        h = self.hash.pop(pg); self.hist[k][h] = self.t
        while len(self.hist[k]) > self.n: self.hist[k].popitem(last=False)
        return pg
    def size(self): return len(self.lru)

if __name__ == '__main__':
    caps = sys.argv[1].split(',') if len(sys.argv) > 1 else ('1M', '3M')
    show('ARC', ARC, caps)
    for fr in (0.01, 0.05, 0.2):
        for rs in (10, 100):
            show(f'W-TinyLFU-ish win={fr} reset={rs}xN', lambda n: TinyAdmit(n, fr, rs), caps)
    show('LeCaR lr=0.45', LeCaR, caps)
