from docscore import *
N = len(T)
dr = collections.defaultdict(list)
for i, r in enumerate(T): dr[r['hash_ids'][0]].append(i)
def oracle_rate(s, now, pol):
    d = pol.curdoc_of_state[id(s)] if False else None
def mk_oracle():
    def f(s, now, pol):
        idx = dr[T[s.times[0]]['hash_ids'][0]]
        return (len(idx) - 1) / (N - idx[0] + 1) + 1e-9 * s.times[-1]
    return f
def ob(o): return 0 if o < 32 else (1 if o < 128 else 2)
def bayes(means, beta, which='first'):
    def f(s, now, pol):
        o = s.outs[0] if which == 'first' else (s.outs[-1] if which == 'last' else min(s.outs))
        m = means[ob(o)]
        return (m * beta + len(s.times) - 1) / (beta + now - s.times[0]) + 1e-9 * s.times[-1]
    return f
if __name__ == '__main__':
    caps = sys.argv[1].split(',') if len(sys.argv) > 1 else ('1M','3M')
    show('oracle rate (K-1)/(N-t0)', lambda n: DocScore(n, mk_oracle()), caps)
    for beta in (100, 300, 1000):
        for means in ((0.003, 0.001, 0.0002), (0.002, 0.0005, 0.0001), (0.005, 0.002, 0.0005)):
            for w in ('first', 'last'):
                show(f'bayes beta={beta} m={means} {w}', lambda n: DocScore(n, bayes(means, beta, w)), caps)
