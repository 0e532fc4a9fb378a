"""Storage tiers through the Python binding: kvcache.HostTier / DiskTier below
a PagedKVCacheManager, pages the pool evicts written back and loaded again by
match_prefix bit for bit, pending loads refused by fetch, a second manager on
a disk tier's directory after a restart, events with their medium,
stats()["tiers"], and bad arguments raising ValueError subclasses that name
the value."""
import gc
import threading

import numpy as np
import pytest

import kvcache

PAGE = 4
LAYERS = 3
HEADS = 2
DIM = 4


def params(arrangement="interleaved", prefix=True):
    return kvcache.KVCacheParams(dtype="float32", n_kv_heads=HEADS, head_dim=DIM,
                                 num_layers=LAYERS, cache_strategy="paged", page_size=PAGE,
                                 enable_prefix_caching=prefix, pool_arrangement=arrangement)


def host(p, **kwargs):
    kwargs.setdefault("capacity_pages", 64)
    kwargs.setdefault("model_id", "model")
    kwargs.setdefault("synchronous", True)
    return kvcache.HostTier(p, **kwargs)


def disk(p, path, **kwargs):
    kwargs.setdefault("model_id", "model")
    kwargs.setdefault("slab_bytes", 1 << 20)
    return kvcache.DiskTier(p, path, **kwargs)


def manager(p, tiers, events=None, pages=4, **kwargs):
    return kvcache.PagedKVCacheManager(p, 4, 64, total_num_pages=pages, tiers=tiers,
                                       on_event=None if events is None else events.append,
                                       **kwargs)


def prefill(m, seq, tokens, rng):
    """Stores random K/V for every token of a fresh seq and commits them with their ids;
    returns [layer] -> (k, v), each [tokens, heads, dim]."""
    n = len(tokens)
    inputs = m.fetch([seq], [n])
    rows = np.array([0, n], np.uint32)
    written = []
    for layer in range(LAYERS):
        k = rng.standard_normal((n, HEADS, DIM), dtype=np.float32)
        v = rng.standard_normal((n, HEADS, DIM), dtype=np.float32)
        kvcache.store_kv(inputs, layer, k, v, rows)
        written.append((k, v))
    m.step([seq], [n], token_ids=list(tokens))
    return written


def expect_holds(m, seq, written, upto):
    """Tokens [0, upto) of seq hold, bit for bit, what prefill wrote."""
    inputs = m.fetch([seq], [1])
    blocks = inputs.blocks
    per_layer = m.params.pool_arrangement == "per_layer"
    for layer, (k, v) in enumerate(written):
        for t in range(upto):
            page = int(inputs.lookup_table[0, t // PAGE])
            for kv, want in ((0, k), (1, v)):
                got = (blocks[layer, kv, page, t % PAGE] if per_layer
                       else blocks[page, kv, layer, t % PAGE])
                assert got.tobytes() == want[t].tobytes(), (layer, kv, t)


def write_and_evict(m, a, rng):
    """Writes prompt a (13 tokens: 3 full pages), releases it, then fills the 4-page pool
    with another request so a's pages are evicted (written back to the first tier)."""
    s, = m.claim(1)
    written = prefill(m, s, a, rng)
    m.release(s)
    other, = m.claim(1)
    prefill(m, other, list(range(1000, 1016)), rng)
    m.release(other)
    m.wait_tiers()  # write-backs wait in staging for a batch: hand them over
    m.check_invariants()
    return written


def match_pending(m, a):
    """match_prefix on a fresh seq: 12 tokens come from the tier, pending until finished;
    fetch / fork / truncate refuse it, naming it, and change nothing."""
    c, = m.claim(1)
    assert m.match_prefix(c, a) == 12
    assert m.has_pending_loads(c)
    before = m.snapshot()
    for call in (lambda: m.fetch([c], [1]), lambda: m.fork(c), lambda: m.truncate(c, 4)):
        with pytest.raises(kvcache.InvalidArgument, match=f"seq {c} has pending loads"):
            call()
    assert m.snapshot() == before
    assert m.cache_length(c) == 12
    return c


A = list(range(7, 20))  # 13 tokens


@pytest.mark.parametrize("arrangement", ["interleaved", "per_layer"])
def test_host_tier_round_trip_is_byte_exact(arrangement):
    p = params(arrangement)
    tier = host(p)
    events = []
    m = manager(p, [tier], events)  # model_id is the tier's
    assert m.has_tiers
    rng = np.random.default_rng(1)
    written = write_and_evict(m, A, rng)
    c = match_pending(m, A)
    assert m.stats()["pending_loads"] == 3
    assert m.poll_loads() == [c]
    assert not m.has_pending_loads(c)
    expect_holds(m, c, written, 12)
    m.check_invariants()

    stats = m.stats()
    assert stats["pending_loads"] == 0
    assert [t["name"] for t in stats["tiers"]] == ["host"]
    figures = stats["tiers"][0]
    assert figures["pages_onboarded"] == 3
    assert figures["pages_loaded"] == 3
    assert figures["load_failures"] == 0
    assert figures["pages_offloaded"] >= 3
    assert figures["capacity_bytes"] == 64 * tier.page_bytes
    assert stats["prefix_hit_tokens"] == 12
    stored = [e for e in events if e.medium == "host" and e.kind == "stored"]
    assert len(stored) == figures["pages_offloaded"]
    assert sum(e.medium == "device" and e.kind == "removed" for e in events) >= 3
    assert all(e.key != (0, 0) for e in events)
    assert "medium='host'" in repr(stored[0])
    assert tier.stats()["pages_stored"] == figures["pages_stored"]


def test_disk_tier_round_trip_and_restart(tmp_path):
    p = params()
    tier = disk(p, tmp_path / "tier")  # an os.PathLike
    assert tier.recovery["fresh"]
    assert tier.stats()["capacity_bytes"] is None  # unlimited
    m = manager(p, [tier], model_id="model")
    rng = np.random.default_rng(2)
    written = write_and_evict(m, A, rng)
    m.wait_tiers()
    assert tier.stats()["pages_stored"] >= 3
    c = match_pending(m, A)
    m.wait_loads(c)
    assert not m.has_pending_loads(c)
    expect_holds(m, c, written, 12)
    with pytest.raises(kvcache.InvalidArgument, match=str(tmp_path / "tier")):
        disk(p, str(tmp_path / "tier"))  # locked while the first lives
    m.wait_tiers()
    del m, tier, c
    gc.collect()

    again = disk(p, str(tmp_path / "tier"), io="threads")
    assert again.io_backend == "threads"
    assert not again.recovery["fresh"]
    assert again.recovery["pages"] >= 3
    assert again.dir == str(tmp_path / "tier")
    second = manager(p, [again])
    del again  # the manager keeps the tier alive
    c = match_pending(second, A)
    second.wait_loads(c)
    assert second.cache_length(c) == 12
    expect_holds(second, c, written, 12)
    assert second.stats()["tiers"][0]["name"] == "disk"
    assert second.stats()["tiers"][0]["pages_onboarded"] == 3


def test_host_then_disk_and_reprs(tmp_path):
    p = params()
    h = host(p, capacity_bytes=None, capacity_pages=2, threads=1, synchronous=False)
    d = disk(p, tmp_path, cache_salt="")
    assert isinstance(h, kvcache.Tier) and isinstance(d, kvcache.Tier)
    assert (h.name, d.name) == ("host", "disk")
    assert h.num_slots == 2 and h.slot_bytes >= h.page_bytes
    assert h.page_bytes == 2 * LAYERS * PAGE * HEADS * DIM * 4
    assert repr(h).startswith("HostTier(capacity_bytes=") and "model_id='model'" in repr(h)
    assert repr(d).startswith("DiskTier(") and "io_backend=" in repr(d)
    m = manager(p, [h, d], admission="reused", staging_pages=4)
    assert [t["name"] for t in m.stats()["tiers"]] == ["host", "disk"]
    assert m.poll_loads() == []
    m.wait_tiers()


def test_wait_loads_releases_the_gil():
    """Another Python thread runs while one waits for loads (asynchronous tier)."""
    p = params()
    tier = host(p, synchronous=False, threads=1)
    m = manager(p, [tier])
    rng = np.random.default_rng(3)
    written = write_and_evict(m, A, rng)
    m.wait_tiers()
    c, = m.claim(1)
    assert m.match_prefix(c, A) == 12
    ran = []
    t = threading.Thread(target=lambda: ran.append(m.stats()["active_sequences"]))
    t.start()
    m.wait_loads(c)
    t.join()
    assert ran == [1]
    expect_holds(m, c, written, 12)


def test_continuous_manager_stats_have_no_tiers():
    p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=HEADS, head_dim=DIM, num_layers=1)
    m = kvcache.ContinuousBatchingKVCacheManager(p, 2, 16)
    m.claim(1)
    s = m.stats()
    assert s["tiers"] == [] and s["pending_loads"] == 0 and s["active_sequences"] == 1


def test_bad_tier_arguments_name_the_value(tmp_path):
    p = params()
    cases = [
        (lambda: kvcache.HostTier(p, model_id="m"), "capacity_bytes or capacity_pages"),
        (lambda: kvcache.HostTier(p, capacity_bytes=1, capacity_pages=1), "not both"),
        (lambda: kvcache.HostTier(p, capacity_bytes=-1), "capacity_bytes is -1"),
        (lambda: kvcache.HostTier(p, capacity_pages=2**63), "capacity_pages 9223372036854775808"),
        (lambda: kvcache.HostTier(p, capacity_pages=4, threads=0), "threads is 0"),
        (lambda: kvcache.HostTier(p, capacity_pages=4, threads=5000), "threads is 5000"),
        (lambda: kvcache.HostTier(p, capacity_pages=4, checksums=1), "checksums must be True or False, got 1"),
        (lambda: kvcache.HostTier(p, capacity_pages=4, model_id=3), "model_id must be a str"),
        (lambda: kvcache.HostTier(kvcache.KVCacheParams(dtype="float32", n_kv_heads=2, head_dim=4,
                                                        num_layers=1), capacity_pages=4),
         "cache_strategy is 'continuous'"),
        (lambda: kvcache.DiskTier(p, 7), "dir must be a str or an os.PathLike, got <class 'int'>"),
        (lambda: kvcache.DiskTier(p, ""), "dir is empty"),
        (lambda: kvcache.DiskTier(p, tmp_path, io="aio"), "io 'aio'"),
        (lambda: kvcache.DiskTier(p, tmp_path, queue_depth=0), "queue_depth 0"),
        (lambda: kvcache.DiskTier(p, "/proc/kvcache-no-such-dir"), "/proc/kvcache-no-such-dir"),
    ]
    for call, needle in cases:
        with pytest.raises(ValueError) as info:
            call()
        assert isinstance(info.value, kvcache.InvalidArgument)
        assert needle in str(info.value), (needle, str(info.value))


def test_bad_manager_tier_arguments_name_the_value():
    p = params()
    tier = host(p)
    cases = [
        (dict(tiers=[tier], model_id="other"), "model_id is 'model' but this manager's is 'other'"),
        (dict(tiers=[tier], cache_salt="tenant"), "cache_salt"),
        (dict(tiers=[tier, "disk"]), "tiers[1] is a <class 'str'>"),
        (dict(tiers=tier), "tiers must be a list"),
        (dict(tiers=[tier], admission="sometimes"), "admission 'sometimes'"),
        (dict(tiers=[tier], staging_pages=0), "staging_pages is 0"),
        (dict(tiers=[tier], staging_pages=-2), "staging_pages"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(kvcache.InvalidArgument) as info:
            manager(p, **kwargs)
        assert needle in str(info.value), (needle, str(info.value))
    with pytest.raises(kvcache.InvalidArgument, match="enable_prefix_caching"):
        kvcache.PagedKVCacheManager(params(prefix=False), 4, 64, total_num_pages=4, tiers=[tier])
    m = manager(p, [tier])
    with pytest.raises(kvcache.UnknownSequence, match="seq 3"):
        m.has_pending_loads(3)
    with pytest.raises(kvcache.UnknownSequence, match="seq 3"):
        m.wait_loads(3)
