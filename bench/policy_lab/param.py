from docscore import *
def ob(o): return 0 if o < 32 else (1 if o < 128 else 2)
def para(a, c, A, p=1.0, which='last'):
    def f(s, now, pol):
        u = len(s.times)
        o = s.outs[-1] if which == 'last' else min(s.outs)
        h = a[ob(o)] if u == 1 else (u + c) 
        age = now + 1 - s.times[-1]
        return h / (1 + (age / A) ** p) + 1e-9 * s.times[-1]
    return f
if __name__ == '__main__':
    caps = sys.argv[1].split(',') if len(sys.argv) > 1 else ('1M','3M')
    for a in ((1.0, 0.3, 0.05), (0.5, 0.2, 0.03), (2.0, 0.5, 0.1)):
        for c in (0, 2):
            for A in (100, 300, 1000):
                for p in (1, 2):
                    show(f'para a={a} c={c} A={A} p={p}', lambda n: DocScore(n, para(a, c, A, p)), caps)
