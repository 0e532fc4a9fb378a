from docscore import *
import bisect
N = len(T)
def instances(klassf):
    cnt = collections.Counter(); nxt = [None]*N; nl = {}
    for i in range(N-1, -1, -1):
        d = T[i]['hash_ids'][0]; nxt[i] = nl.get(d); nl[d] = i
    out = collections.defaultdict(list)  # class -> list of (g or None, horizon left)
    for i, r in enumerate(T):
        d = r['hash_ids'][0]; cnt[d] += 1
        c = klassf(cnt[d], r, T, i)
        out[c].append((None if nxt[i] is None else nxt[i]-i, N-i))
    return out
def table(klassf, H):
    inst = instances(klassf); tab = {}
    for c, L in inst.items():
        for b in range(0, 14):
            a = 0 if b == 0 else (1 << (b-1))
            num = den = 0
            for g, left in L:
                if g is not None and g <= a: continue
                if g is None and left <= a: continue
                if g is not None and g <= a + H: num += 1; den += 1
                elif (g is None and left > a + H) or (g is not None): den += 1
            tab[(c, b)] = (num + 0.1) / (den + 1)
    return tab
def probscore(tab, klassf):
    def f(s, now, pol):
        a = now - s.times[-1]
        c = klassf(len(s.times), {'output_length': s.outs[-1], 'hash_ids': [0]*s.nblk[-1]}, None, None)
        return tab[(c, min(a.bit_length(), 13))] + 1e-9 * s.times[-1]
    return f
def k_u_out(u, r, T, i): return (min(u, 8), 0 if r['output_length'] < 32 else (1 if r['output_length'] < 128 else 2))
def k_u(u, r, T, i): return (min(u, 8),)
if __name__ == '__main__':
    caps = sys.argv[1].split(',') if len(sys.argv) > 1 else ('1M','3M')
    for kname, kf in (('u,out', k_u_out), ('u', k_u)):
        for H in (100, 200, 400, 800):
            tab = table(kf, H)
            show(f'P(reuse in H={H}) offline tab {kname}', lambda n: DocScore(n, probscore(tab, kf)), caps)
