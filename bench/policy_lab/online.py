from docscore import *

def ob(o): return 0 if o < 32 else (1 if o < 128 else 2)
NBK = 13
def abk(a): return min(a.bit_length(), NBK - 1)
def alo(b): return 0 if b == 0 else (1 << (b - 1))

class OnlineProb(DocScore):
    """Doc-level; class from doc history; online-learned P(reuse within (a,a+H] | class, age bucket)."""
    def __init__(self, n, featf, H=200, decay=1.0, prior=(0.1, 1.0), interp=False):
        super().__init__(n, None)
        self.featf = featf; self.H = H; self.decay = decay; self.prior = prior
        self.pos = collections.Counter(); self.tot = collections.Counter()
        self.req = []   # per request: (doc, class)
        self.nextuse = {}  # request idx -> next request idx of same doc
        self.lastreq = {}
        self.interp = interp
    def begin(self, r, n):
        i = self.ctx.req_index
        d = r['hash_ids'][0]
        # close the doc's previous instance
        if d in self.lastreq: self.nextuse[self.lastreq[d]] = i
        super().begin(r, n)
        s = self.ds[d]
        c = self.featf(s, i)
        self.req.append((d, c)); self.lastreq[d] = i
        # resolve
        if self.decay < 1.0:
            # lazy global decay via scale factor
            pass
        for b in range(NBK):
            a = alo(b)
            t = i - a - self.H
            # positives: instance t' whose next use g == i - t' with a < g <= a+H  -> record now
            if t >= 0 and t < len(self.req):
                nu = self.nextuse.get(t)
                if nu is None or nu > i:  # not reused within (t, i]: survived a and a+H -> negative
                    self.add(self.req[t][1], b, 0)
        # positives for the instance just closed
        if d in self.ds and len(s.times) >= 2:
            t = s.times[-2]; g = i - t; c0 = self.req[t][1]
            for b in range(NBK):
                a = alo(b)
                if a < g <= a + self.H: self.add(c0, b, 1)
        self.cls = {}
    def add(self, c, b, y):
        k = (c, b)
        self.tot[k] += self.w; self.pos[k] += self.w * y
    @property
    def w(self):
        return self.decay ** (-self.i) if self.decay < 1.0 else 1.0
    def prob(self, c, b):
        k = (c, b); p0, n0 = self.prior
        return (self.pos[k] + p0 * n0 * self.w) / (self.tot[k] + n0 * self.w)
    def scoref_(self, s, now):
        t = s.times[-1]; a = now + 1 - t
        return self.prob(self.req[t][1], abk(a)) + 1e-9 * t
    def score(self, d):
        v = self.sc.get(d)
        if v is None: v = self.sc[d] = self.scoref_(self.ds[d], self.i)
        return v

def gb(g): return min(g.bit_length(), 12) // 2
FE = {
  'u,out': lambda s, i: (min(len(s.times), 8), ob(s.outs[-1])),
  'u,out,lastgap': lambda s, i: (min(len(s.times), 8), ob(s.outs[-1]), gb(s.times[-1]-s.times[-2]) if len(s.times) > 1 else -1),
  'u,out,nblk': lambda s, i: (min(len(s.times), 8), ob(s.outs[-1]), min(s.nblk[-1].bit_length(), 7)),
  'u,out,lastgap,nblk': lambda s, i: (min(len(s.times), 8), ob(s.outs[-1]), gb(s.times[-1]-s.times[-2]) if len(s.times) > 1 else -1, min(s.nblk[-1].bit_length(), 7)//2),
  'u,lastgap': lambda s, i: (min(len(s.times), 8), gb(s.times[-1]-s.times[-2]) if len(s.times) > 1 else -1),
  'u,lastgap,nblk': lambda s, i: (min(len(s.times), 8), gb(s.times[-1]-s.times[-2]) if len(s.times) > 1 else -1, min(s.nblk[-1].bit_length(), 7)//2),
}
if __name__ == '__main__':
    caps = sys.argv[1].split(',') if len(sys.argv) > 1 else ('1M','3M')
    sel = sys.argv[2].split(';') if len(sys.argv) > 2 else list(FE)
    Hs = [int(x) for x in sys.argv[3].split(',')] if len(sys.argv) > 3 else [200]
    decs = [float(x) for x in sys.argv[4].split(',')] if len(sys.argv) > 4 else [1.0]
    for name in sel:
        for H in Hs:
            for dec in decs:
                show(f'online {name} H={H} dec={dec}', lambda n: OnlineProb(n, FE[name], H, dec), caps)
