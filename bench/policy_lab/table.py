import sys, io, contextlib
with contextlib.redirect_stdout(io.StringIO()):
    from p3 import *
    from base_pols import Tiered, Interval
    from p1 import ClassLRU
    from param import para
    from online import OnlineProb, FE
    from rate import mk_oracle
    from docscore import DocScore, lru_s
    import wp2
rows = [
 ('LRU', LRU), ('tiered (ghost 16x)', Tiered), ('interval (ghost 16x)', Interval), ('ARC', ARC), ('LeCaR', LeCaR),
 ('[out] class LRU: out<32 or reused high', lambda n: ClassLRU(n, lambda r,nh,u,pub: 1 if (r['output_length']<32 or u>=2) else 0)),
 ('[out] 3-class aged, T=32 w=(1e6,1,2)', lambda n: WeightedClassLRU(n, c3(32), (1e6,1,2))),
 ('[out] doc score h(u,out)/(1+(age/100)^1)', lambda n: DocScore(n, para((0.5,0.2,0.03), 2, 100, 1))),
 ('[out] online-learned P(reuse|u,out,age) H=200', lambda n: OnlineProb(n, FE['u,out'], 200, 1.0)),
 ('[oracle] rate (K-1)/(N-t0)', lambda n: DocScore(n, mk_oracle())),
]
cls = wp2.make_k(wp2.FEATS['u,out,lastgap,time']); tab = wp2.table2(cls, 200)
rows.append(('[offline-fit] P(reuse|u,out,lastgap,time,age)', lambda n: DocScore(n, wp2.score2(tab, cls))))
for name, f in rows:
    show(name, f)
