from sim import *
from belady import Belady
from p1 import ClassLRU
import collections, sys
T = load()
cap = CAPS[sys.argv[1] if len(sys.argv)>1 else '1M']
# instrument: per request hits
def run(f):
    hits = []
    class W:
        def __init__(s, n): s.p = f(n)
        def bind(s, ctx): s.ctx = ctx; getattr(s.p, 'bind', lambda c: None)(ctx)
        def begin(s, r, n):
            hits.append(n); getattr(s.p, 'begin', lambda r, n: None)(r, n)
        def __getattr__(s, k): return getattr(s.p, k)
    simulate(T, cap, W)
    return hits
hl = run(LRU); hb = run(Belady)
cnt = collections.Counter(); last = {}
byw = collections.defaultdict(lambda: [0, 0, 0]); byc = collections.defaultdict(lambda: [0, 0, 0]); byg = collections.defaultdict(lambda: [0, 0, 0])
for i, r in enumerate(T):
    d = r['hash_ids'][0]
    c = min(cnt[d], 9); g = i - last[d] if d in last else None
    gb = None if g is None else g.bit_length()
    for tab, k in ((byw, i // 400), (byc, c), (byg, gb)):
        tab[k][0] += len(r['hash_ids']); tab[k][1] += hl[i]; tab[k][2] += hb[i]
    cnt[d] += 1; last[d] = i
for name, tab in (('window', byw), ('prior count', byc), ('gap bits', byg)):
    print(name)
    for k in sorted(tab, key=lambda x: (x is None, x)):
        a = tab[k]; print(f'   {k}: blocks {a[0]} lru {a[1]} belady {a[2]}')
