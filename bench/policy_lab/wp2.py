from window_prob import *

# precompute per-instance features with a general klass using the doc's history
def make_k(fn):
    # fn(hist_times, hist_outs, hist_nblk, i) -> class
    cache = {}
    hist = collections.defaultdict(list)
    for i, r in enumerate(T):
        d = r['hash_ids'][0]; hist[d].append(i)
        cache[i] = fn([t for t in hist[d]], [T[t]['output_length'] for t in hist[d]], [len(T[t]['hash_ids']) for t in hist[d]], i)
    return cache
def ob(o): return 0 if o < 32 else (1 if o < 128 else 2)
def gb(g): return min(g.bit_length(), 12) // 2
FEATS = {
 'u,out,lastgap': lambda ts, os, nb, i: (min(len(ts), 8), ob(os[-1]), gb(ts[-1]-ts[-2]) if len(ts) > 1 else -1),
 'u,out,time': lambda ts, os, nb, i: (min(len(ts), 8), ob(os[-1]), i // 1000),
 'u,out,minout': lambda ts, os, nb, i: (min(len(ts), 8), ob(os[-1]), ob(min(os))),
 'u,out,nblk': lambda ts, os, nb, i: (min(len(ts), 8), ob(os[-1]), min(nb[-1].bit_length(), 7)),
 'u,out,lastgap,time': lambda ts, os, nb, i: (min(len(ts), 8), ob(os[-1]), gb(ts[-1]-ts[-2]) if len(ts) > 1 else -1, i//1000),
}
def table2(cls, H):
    nxt = [None]*N; nl = {}
    for i in range(N-1, -1, -1):
        d = T[i]['hash_ids'][0]; nxt[i] = nl.get(d); nl[d] = i
    inst = collections.defaultdict(list)
    for i in range(N): inst[cls[i]].append((None if nxt[i] is None else nxt[i]-i, N-i))
    tab = {}
    for c, L in inst.items():
        for b in range(0, 14):
            a = 0 if b == 0 else (1 << (b-1)); num = den = 0
            for g, left in L:
                if g is not None and g <= a: continue
                if g is None and left <= a: continue
                if g is not None and g <= a + H: num += 1; den += 1
                elif (g is None and left > a + H) or (g is not None): den += 1
            tab[(c, b)] = (num + 0.1) / (den + 1)
    return tab
def score2(tab, cls):
    def f(s, now, pol):
        a = now - s.times[-1]
        return tab.get((cls[s.times[-1]], min(a.bit_length(), 13)), 0) + 1e-9 * s.times[-1]
    return f
if __name__ == '__main__':
    caps = sys.argv[1].split(',') if len(sys.argv) > 1 else ('1M','3M')
    for name, fn in FEATS.items():
        cls = make_k(fn)
        for H in (200, 400):
            tab = table2(cls, H)
            show(f'{name} H={H}', lambda n: DocScore(n, score2(tab, cls)), caps)
