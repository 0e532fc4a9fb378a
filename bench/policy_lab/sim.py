"""Python replica of kvcache sequential replay (page size 512) with pluggable policies.

A "page" handed to policies is an incarnation id (int, unique per publish).
"""
import json
from collections import OrderedDict

import os

# The Mooncake trace beside the checkout (../shared), or $KVCACHE_TRACE.
TRACE = os.environ.get('KVCACHE_TRACE', os.path.join(
    os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', 'shared', 'data',
    'mooncake_synthetic_trace.jsonl'))
PS = 512


def load():
    return [json.loads(l) for l in open(TRACE)]


CAPS = {'0.5M': 500000, '1M': 1000000, '2M': 2000000, '3M': 3000000, '6M': 6000000}


class Ctx:
    """Info the simulator exposes to policies (online only)."""
    def __init__(self):
        self.req_index = 0
        self.req = None
        self.n_hit = 0
        self.hash_of = {}     # inc -> hash id
        self.depth_of = {}    # inc -> depth in chain


def simulate(trace, cap_tokens, policy_factory, ctx_hook=None):
    npages = max(1, cap_tokens // PS)
    pol = policy_factory(npages)
    ctx = Ctx()
    if hasattr(pol, 'bind'):
        pol.bind(ctx)
    index = {}        # hash -> inc
    parent_inc = {}   # inc -> parent inc (None for root)
    free = npages
    nextinc = 0
    hits = total = 0
    rejected = 0
    for i, r in enumerate(trace):
        L = r['input_length']
        if L == 0:
            continue
        h = r['hash_ids']
        ctx.req_index = i
        ctx.req = r
        nmax = (L - 1) // PS
        matched = []
        prev = None
        for j in range(nmax):
            inc = index.get(h[j])
            if inc is None or parent_inc[inc] != prev:
                break
            matched.append(inc)
            prev = inc
        n = len(matched)
        ctx.n_hit = n
        if hasattr(pol, 'begin'):
            pol.begin(r, n)
        for inc in matched:
            pol.erase(inc)
            pol.on_hit(inc)
        need = (L + PS - 1) // PS - n
        if need > free + pol.size():
            rejected += 1
            for inc in reversed(matched):
                pol.insert(inc)
            continue
        for _ in range(need):
            if free > 0:
                free -= 1
            else:
                v = pol.evict()
                hv = ctx.hash_of.pop(v)
                ctx.depth_of.pop(v, None)
                del index[hv]
                del parent_inc[v]
        # publish
        full = L // PS
        pages = list(matched)  # incs of published pages in seq (None = private)
        ok = True
        prev = matched[-1] if matched else None
        for j in range(n, full):
            if ok and h[j] not in index:
                inc = nextinc
                nextinc += 1
                index[h[j]] = inc
                parent_inc[inc] = prev
                ctx.hash_of[inc] = h[j]
                ctx.depth_of[inc] = j
                pol.on_publish(inc, h[j], n > 0)
                pages.append(inc)
                prev = inc
            else:
                ok = False
                pages.append(None)
        nprivate = need - sum(1 for p in pages[n:] if p is not None)
        # release tail first
        for inc in reversed(pages):
            if inc is not None:
                pol.insert(inc)
        free += nprivate
        hits += n
        total += len(h)
    return hits / total, rejected


# ---------------- policies -----------------
class LRU:
    def __init__(self, n):
        self.q = OrderedDict()

    def on_publish(self, p, h, ext): pass
    def on_hit(self, p): pass
    def insert(self, p): self.q[p] = None
    def erase(self, p): del self.q[p]
    def evict(self): return self.q.popitem(last=False)[0]
    def size(self): return len(self.q)


def run_all(factory, caps=('0.5M', '1M', '2M', '3M', '6M'), trace=None):
    trace = trace or load()
    return {c: simulate(trace, CAPS[c], factory)[0] for c in caps}


if __name__ == '__main__':
    res = run_all(LRU)
    print({k: round(v, 4) for k, v in res.items()})
