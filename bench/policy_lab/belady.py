from sim import *
import collections, heapq
T = load()
occ = collections.defaultdict(list)
for i, r in enumerate(T):
    for j, h in enumerate(r['hash_ids']):
        occ[h].append(i)
class Belady:
    def __init__(self, n):
        self.h = []; self.live = {}; self.hash = {}
    def bind(self, ctx): self.ctx = ctx
    def nextuse(self, h):
        o = occ[h]; i = self.ctx.req_index
        import bisect
        k = bisect.bisect_right(o, i)
        return o[k] if k < len(o) else 10**9
    def on_publish(self, p, h, ext): self.hash[p] = h
    def on_hit(self, p): pass
    def insert(self, p):
        key = (-self.nextuse(self.hash[p]), -self.ctx.depth_of[p], p)
        self.live[p] = key; heapq.heappush(self.h, key)
    def erase(self, p): del self.live[p]
    def evict(self):
        while True:
            k = heapq.heappop(self.h); p = k[2]
            if self.live.get(p) == k:
                del self.live[p]; del self.hash[p]; return p
    def size(self): return len(self.live)
if __name__ == '__main__':
    for c in ('1M', '3M'):
        print(c, simulate(T, CAPS[c], Belady)[0])
