"""A pool apart through the Python binding (pool_apart=True, docs/tiers.md "A pool
apart"): a NumPy array plays the caller's (device) pool. The K/V are written there
only; each fetch's transfers are applied in the documented order (block_offloads,
block_loads, block_copies), then complete_offloads. Round trips through a host tier
bit for bit in both arrangements; another manager's batch refused; the slot views
outliving the manager (a child in development mode); bad arguments;
estimated_bookkeeping_size with tiers equal to what a manager built with the same
configuration reports."""
import gc
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kvcache

PAGE = 4
LAYERS = 3
HEADS = 2
DIM = 4
MODULE_DIR = os.path.dirname(os.path.abspath(kvcache.__file__))


def params(arrangement="interleaved", prefix=True):
    return kvcache.KVCacheParams(dtype="float32", n_kv_heads=HEADS, head_dim=DIM,
                                 num_layers=LAYERS, cache_strategy="paged", page_size=PAGE,
                                 enable_prefix_caching=prefix, pool_arrangement=arrangement)


def host(p):
    return kvcache.HostTier(p, capacity_pages=64, model_id="model", synchronous=True)


class Apart:
    """A manager with a pool apart over one host tier, and the caller's pool `dev`
    (the manager's shape, random bytes to start with)."""

    def __init__(self, arrangement="interleaved", pages=4):
        self.p = params(arrangement)
        self.tier = host(self.p)
        self.m = kvcache.PagedKVCacheManager(self.p, 4, 64, total_num_pages=pages,
                                             tiers=[self.tier], pool_apart=True)
        self.per_layer = arrangement == "per_layer"
        shape = self.m.block_shape(pages)
        rng = np.random.default_rng(99)
        self.dev = rng.standard_normal(shape, dtype=np.float32)
        self.completed = 0

    def page(self, pool, page):
        """Page `page` of a pool as [2][layers][tokens][heads][dim] (a view)."""
        return pool[:, :, page].swapaxes(0, 1) if self.per_layer else pool[page]

    def apply(self, inputs):
        """The batch's transfers into dev, in the documented order."""
        for page, slot in inputs.block_offloads:
            assert slot.dtype == np.uint8 and slot.flags.writeable
            packed = slot.view(np.float32).reshape(2, LAYERS, PAGE, HEADS, DIM)
            packed[...] = self.page(self.dev, page)
        for page in inputs.block_loads:
            self.page(self.dev, page)[...] = self.page(inputs.blocks, page)
        for src, dst in inputs.block_copies:
            self.page(self.dev, dst)[...] = self.page(self.dev, src)

    def fetch(self, seq, n):
        inputs = self.m.fetch([seq], [n])
        self.apply(inputs)
        done = self.m.complete_offloads(inputs)
        assert done == len(inputs.block_offloads)
        self.completed += done
        self.m.check_invariants()
        return inputs

    def token(self, inputs, layer, kv, t):
        """[heads][dim] of token t of batch entry 0 in dev (a view)."""
        page = int(inputs.lookup_table[0, t // PAGE])
        return self.page(self.dev, page)[kv, layer, t % PAGE]

    def prefill(self, tokens, rng):
        """Random K/V for every token of a fresh seq, written into dev, committed."""
        seq, = self.m.claim(1)
        n = len(tokens)
        inputs = self.fetch(seq, n)
        written = rng.standard_normal((LAYERS, 2, n, HEADS, DIM), dtype=np.float32)
        for layer in range(LAYERS):
            for kv in range(2):
                for t in range(n):
                    self.token(inputs, layer, kv, t)[...] = written[layer, kv, t]
        self.m.step([seq], [n], token_ids=list(tokens))
        return seq, written

    def holds(self, inputs, written, upto):
        """Tokens [0, upto) of entry 0 in dev hold, bit for bit, what was written."""
        for layer in range(LAYERS):
            for kv in range(2):
                for t in range(upto):
                    got = self.token(inputs, layer, kv, t)
                    assert got.tobytes() == written[layer, kv, t].tobytes(), (layer, kv, t)


A = list(range(7, 20))  # 13 tokens: 3 full pages
B = list(range(1000, 1016))  # 16 tokens: 4 full pages


@pytest.mark.parametrize("arrangement", ["interleaved", "per_layer"])
def test_round_trip_through_the_callers_pool(arrangement):
    r = Apart(arrangement)
    rng = np.random.default_rng(11)
    sa, wa = r.prefill(A, rng)
    r.m.release(sa)

    sb, = r.m.claim(1)
    inputs = r.m.fetch([sb], [16])  # evicts A's 3 published pages
    assert [page for page, _ in inputs.block_offloads] != []
    assert len(inputs.block_offloads) == 3, "A's pages wait for their bytes"
    assert inputs.batch.block_offloads[0][0] == inputs.block_offloads[0][0]
    assert all(slot.nbytes == r.tier.page_bytes for _, slot in inputs.block_offloads)
    assert inputs.block_loads.dtype == np.uint32 and inputs.block_loads.size == 0
    assert r.tier.stats()["pages_stored"] == 0, "nothing stored before complete_offloads"
    r.apply(inputs)
    assert r.m.complete_offloads(inputs) == 3
    assert r.m.complete_offloads(inputs.batch) == 0, "completed once only"
    assert r.tier.stats()["pages_stored"] == 3
    r.m.release(sb)

    sb2, wb = r.prefill(B, rng)  # B's 4 pages: A's 3 + the free one
    r.m.release(sb2)

    c, = r.m.claim(1)
    assert r.m.match_prefix(c, A) == 12  # evicts 3 of B's pages for the loads
    r.m.wait_loads(c)
    back = r.fetch(c, 1)
    assert len(back.block_offloads) == 4, "B's 3 pages + the one this fetch took"
    assert sorted(back.block_loads.tolist()) == sorted(back.lookup_table[0, :3].tolist())
    with pytest.raises(ValueError):
        back.block_loads[0] = 1  # read-only, like the other index arrays
    r.holds(back, wa, 12)
    r.m.release(c)

    d, = r.m.claim(1)
    assert r.m.match_prefix(d, B) == 12
    r.m.wait_loads(d)
    again = r.fetch(d, 1)
    r.holds(again, wb, 12)  # B's, saved before A's loads overwrote them
    figures = r.m.stats()["tiers"][0]
    assert figures["offload_dropped"] == 0
    assert figures["pages_onboarded"] == 6
    assert figures["load_failures"] == 0
    assert r.completed == 4  # C's fetch: B's 4; A's, evicted for D, are in the tier


def test_another_managers_batch_is_refused_and_changes_nothing():
    r, other = Apart(), Apart()
    rng = np.random.default_rng(5)
    for x in (r, other):
        s, _ = x.prefill(A, rng)
        x.m.release(s)
    mine = r.m.fetch(r.m.claim(1), [16])
    theirs = other.m.fetch(other.m.claim(1), [16])
    assert len(theirs.block_offloads) == 3
    r.apply(mine)
    before = r.m.snapshot()
    with pytest.raises(kvcache.InvalidArgument,
                       match=r"the batch \(3 offloads\) was not fetched from this manager"):
        r.m.complete_offloads(theirs)
    assert r.m.snapshot() == before
    assert r.tier.stats()["pages_stored"] == 0
    assert other.tier.stats()["pages_stored"] == 0
    with pytest.raises(kvcache.InvalidArgument, match="kv_cache_inputs"):
        r.m.complete_offloads([1, 2])
    assert r.m.complete_offloads(mine) == 3
    assert r.tier.stats()["pages_stored"] == 3


def test_without_a_pool_apart_there_are_no_transfers():
    p = params()
    m = kvcache.PagedKVCacheManager(p, 4, 64, total_num_pages=4, tiers=[host(p)])
    inputs = m.fetch(m.claim(1), [16])
    assert inputs.block_offloads == [] and inputs.block_loads.shape == (0,)
    assert m.complete_offloads(inputs) == 0
    plain = kvcache.PagedKVCacheManager(params(prefix=False), 4, 64, total_num_pages=4)
    assert plain.complete_offloads(plain.fetch(plain.claim(1), [4])) == 0


def test_bad_arguments():
    p = params()
    with pytest.raises(kvcache.InvalidArgument, match="pool_apart"):
        kvcache.PagedKVCacheManager(p, 4, 64, total_num_pages=4, pool_apart=True)
    with pytest.raises(kvcache.InvalidArgument, match="pool_apart must be True or False, got 1"):
        kvcache.PagedKVCacheManager(p, 4, 64, total_num_pages=4, tiers=[host(p)], pool_apart=1)
    with pytest.raises(kvcache.InvalidArgument, match="enable_prefix_caching"):
        kvcache.PagedKVCacheManager(params(prefix=False), 4, 64, total_num_pages=4,
                                    pool_apart=False)
    size = kvcache.PagedKVCacheManager.estimated_bookkeeping_size
    with pytest.raises(kvcache.InvalidArgument, match="tiers is 9; a manager takes at most 8"):
        size(p, 4, tiers=9)
    with pytest.raises(kvcache.InvalidArgument, match="tiers must be a list"):
        size(p, 4, tiers="host")
    with pytest.raises(kvcache.InvalidArgument, match="enable_prefix_caching"):
        size(params(prefix=False), 4, tiers=1)


SLOTS_OUTLIVE_THE_MANAGER = """
    import gc, weakref, numpy as np, kvcache
    p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=2, head_dim=4, num_layers=3,
                              cache_strategy="paged", page_size=4, enable_prefix_caching=True)
    tier = kvcache.HostTier(p, capacity_pages=8, model_id="m", synchronous=True)
    m = kvcache.PagedKVCacheManager(p, 2, 64, total_num_pages=4, tiers=[tier], pool_apart=True)
    a, = m.claim(1)
    m.fetch([a], [13])
    m.step([a], [13], token_ids=list(range(13)))
    m.release(a)
    inputs = m.fetch(m.claim(1), [16])
    slots = [slot for _, slot in inputs.block_offloads]
    loads = inputs.block_loads
    assert len(slots) == 3, len(slots)
    alive = weakref.ref(m)
    del inputs, m, tier
    gc.collect()
    assert alive() is not None, "a slot view keeps the manager"
    for i, slot in enumerate(slots):
        slot[...] = i + 1  # the manager's staging, still there
    assert [int(s.sum()) for s in slots] == [(i + 1) * s.size for i, s in enumerate(slots)]
    assert loads.size == 0
    del slots, slot, loads
    gc.collect()
    assert alive() is None, "the last view gone, the manager goes"
    print("ok")
"""


def test_slot_views_outlive_the_manager_in_development_mode():
    path = os.pathsep.join(x for x in (MODULE_DIR, os.environ.get("PYTHONPATH")) if x)
    env = dict(os.environ, PYTHONDEVMODE="1", PYTHONPATH=path)
    result = subprocess.run(
        [sys.executable, "-X", "dev", "-c", textwrap.dedent(SLOTS_OUTLIVE_THE_MANAGER)],
        env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.fixture
def info_lines():
    lines = []
    kvcache.set_log_handler(lambda level, message: lines.append(message))
    kvcache.set_log_level("info")
    yield lines
    kvcache.set_log_handler(None)
    kvcache.set_log_level("off")


def logged_bookkeeping(lines):
    """The bookkeeping bytes of the last manager built (its info line)."""
    found = [re.search(r"(\d+) bytes of bookkeeping", x) for x in lines]
    found = [f for f in found if f]
    assert found, lines
    return int(found[-1].group(1))


@pytest.mark.parametrize("staging_pages, pool_apart", [(None, None), (7, False), (7, True),
                                                       (300, True)])
def test_bookkeeping_size_with_tiers_equals_the_managers(info_lines, staging_pages, pool_apart):
    p = params()
    tiers = [host(p), host(p)]
    size = kvcache.PagedKVCacheManager.estimated_bookkeeping_size
    estimate = size(p, 100, eviction_policy="lru", tiers=tiers, staging_pages=staging_pages,
                    pool_apart=pool_apart)
    kvcache.PagedKVCacheManager(p, 4, 64, total_num_pages=100, eviction_policy="lru",
                                tiers=tiers, staging_pages=staging_pages, pool_apart=pool_apart)
    assert estimate == logged_bookkeeping(info_lines)
    assert estimate == size(p, 100, eviction_policy="lru", tiers=2, staging_pages=staging_pages,
                            pool_apart=pool_apart), "the number of tiers sizes it as the list"
    plain = size(p, 100, eviction_policy="lru")
    assert estimate > plain
    assert size(p, 100, eviction_policy="lru", tiers=0) == plain
    assert size(p, 100, eviction_policy="lru", tiers=[]) == plain
    if pool_apart:
        assert estimate > size(p, 100, eviction_policy="lru", tiers=2,
                               staging_pages=staging_pages)
    gc.collect()
