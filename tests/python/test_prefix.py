"""Prefix caching through the Python binding: match_prefix, step(token_ids=),
fork + copy-on-write, truncate, pin_prefix, metrics, eviction policies, events."""
import sys
import threading
import time

import numpy as np
import pytest

import kvcache

PAGE = 4
LAYERS = 2
HEADS = 2
DIM = 8


def make(enable=True, pages=16, max_batch=4, **kwargs):
    params = kvcache.KVCacheParams(dtype="float32", n_kv_heads=HEADS, head_dim=DIM,
                                   num_layers=LAYERS, cache_strategy="paged", page_size=PAGE,
                                   enable_prefix_caching=enable)
    return kvcache.PagedKVCacheManager(params, max_batch, 64, total_num_pages=pages, **kwargs)


def prefill(m, seq, prompt, rng):
    """fetch + store random K/V for every uncached prompt token + step(token_ids=)."""
    start = m.cache_length(seq)
    n = len(prompt) - start
    inputs = m.fetch([seq], [n])
    offsets = np.array([0, n], np.uint32)
    kvs = []
    for layer in range(LAYERS):
        k = rng.standard_normal((n, HEADS, DIM), dtype=np.float32)
        v = rng.standard_normal((n, HEADS, DIM), dtype=np.float32)
        kvcache.store_kv(inputs, layer, k, v, offsets)
        kvs.append((k, v))
    m.step([seq], [n], token_ids=list(prompt[start:]))
    return inputs, kvs


def test_shared_prompt_reuses_pages_and_their_data():
    m = make()
    rng = np.random.default_rng(1)
    prompt = np.arange(1000, 1010, dtype=np.uint32)  # 10 tokens: 2 full pages + 2
    a, b = m.claim(2)
    assert m.match_prefix(a, prompt) == 0
    first, kvs = prefill(m, a, prompt, rng)
    assert m.match_prefix(b, prompt.astype(np.int64)) == 8  # NumPy int arrays work too
    assert m.cache_length(b) == 8
    second = m.fetch([b], [2])
    assert list(second.cache_lengths) == [8]
    assert list(second.lookup_table[0, :2]) == list(first.lookup_table[0, :2])
    assert second.lookup_table[0, 2] != first.lookup_table[0, 2]
    # K/V the first request wrote are visible through the second's view.
    k0 = kvs[1][0]
    for t in range(8):
        page = second.lookup_table[0, t // PAGE]
        np.testing.assert_array_equal(second.blocks[page, 0, 1, t % PAGE], k0[t])
    snap = m.snapshot()
    shared = [int(p) for p in first.lookup_table[0, :2]]
    assert snap["cached_blocks"] == sorted(shared)
    assert snap["cached_priorities"] == [0, 0]
    assert [snap["ref_counts"][p] for p in shared] == [2, 2]
    m.check_invariants()


def test_step_token_ids_flat_and_per_sequence_publish_the_same():
    prompts = [list(range(8)), list(range(50, 58))]
    for flat in (True, False):
        m = make()
        seqs = m.claim(2)
        m.fetch(seqs, [8, 8])
        tokens = prompts[0] + prompts[1] if flat else prompts
        m.step(seqs, [8, 8], token_ids=tokens)
        assert m.metrics().pages_published == 4
        c, = m.claim(1)
        assert m.match_prefix(c, prompts[1] + [7]) == 8


def test_step_without_token_ids_publishes_nothing():
    m = make()
    a, = m.claim(1)
    m.fetch([a], [8])
    # By accident (no token ids on a prefix-caching manager): refused, nothing changed.
    with pytest.raises(kvcache.InvalidArgument, match="step_without_token_ids"):
        m.step([a], [8])
    assert m.cache_length(a) == 0
    m.step_without_token_ids([a], [8])  # on purpose
    assert m.cache_length(a) == 8
    assert m.metrics().pages_published == 0
    assert m.snapshot()["cached_blocks"] == []


def test_fork_copy_on_write_keeps_parent_bytes():
    m = make()
    rng = np.random.default_rng(2)
    parent, = m.claim(1)
    prompt = list(range(200, 210))  # last page holds 2 tokens
    first, _ = prefill(m, parent, prompt, rng)
    child = m.fork(parent)
    assert m.cache_length(child) == 10
    assert m.snapshot()["sequences"][1]["blocks"] == m.snapshot()["sequences"][0]["blocks"]
    parent_page = int(first.lookup_table[0, 2])
    before = first.blocks[parent_page].copy()
    assert first.block_copies.shape == (0, 2)
    inputs = m.fetch([child], [1])  # first write into the shared partial page: copy
    child_page = int(inputs.lookup_table[0, 2])
    assert child_page != parent_page
    assert m.metrics().cow_copies == 1
    assert inputs.block_copies.tolist() == [[parent_page, child_page]]
    assert not inputs.block_copies.flags.writeable
    np.testing.assert_array_equal(inputs.blocks[child_page, :, :, :2], before[:, :, :2])
    k = rng.standard_normal((1, HEADS, DIM), dtype=np.float32)
    for layer in range(LAYERS):
        kvcache.store_kv(inputs, layer, k, k, np.array([0, 1], np.uint32))
    m.step([child], [1], token_ids=[[210]])
    np.testing.assert_array_equal(inputs.blocks[child_page, 0, 0, 2], k[0])
    np.testing.assert_array_equal(inputs.blocks[parent_page], before)  # parent untouched
    assert m.cache_length(parent) == 10 and m.cache_length(child) == 11
    m.check_invariants()


def test_truncate_rolls_back_and_unpublishes_the_cut_page():
    events = []
    m = make(on_event=events.append)
    a, = m.claim(1)
    m.fetch([a], [10])
    m.step([a], [10], token_ids=list(range(10)))
    assert [e.kind for e in events] == ["stored", "stored"]
    pages = m.snapshot()["sequences"][0]["blocks"]
    m.truncate(a, 6)
    assert m.cache_length(a) == 6
    snap = m.snapshot()
    assert snap["sequences"][0]["blocks"] == pages[:2]
    assert snap["cached_blocks"] == [pages[0]]  # page 1 is partial now: unpublished
    assert events[-1].kind == "removed" and events[-1].page == pages[1]
    before = m.snapshot()
    with pytest.raises(kvcache.InvalidArgument):
        m.truncate(a, 7)  # past cache_length
    assert m.snapshot() == before
    m.check_invariants()


def test_metrics_hit_rate_and_reset():
    m = make()
    prompt = list(range(12))
    a, b = m.claim(2)
    m.match_prefix(a, prompt)
    m.fetch([a], [12])
    m.step([a], [12], token_ids=prompt)
    m.match_prefix(b, prompt)  # 8 of 12 reused (the last token is always computed)
    metrics = m.metrics()
    assert metrics.match_calls == 2
    assert metrics.prompt_tokens == 24 and metrics.reused_tokens == 8
    assert metrics.hit_rate == pytest.approx(8 / 24)
    assert metrics.as_dict()["hit_rate"] == pytest.approx(8 / 24)
    assert metrics.pages_total == 16
    with pytest.raises(AttributeError):
        metrics.match_calls = 0  # read-only
    m.reset_metrics()
    assert m.metrics().match_calls == 0 and m.metrics().hit_rate == 0.0


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "tiered", "interval", "adaptive"])
def test_policies_evict_cached_pages_when_the_pool_is_full(policy):
    events = []
    m = make(pages=4, eviction_policy=policy, on_event=events.append)
    a, = m.claim(1)
    m.fetch([a], [8])
    m.step([a], [8], token_ids=list(range(8)))
    m.release(a)
    assert m.metrics().pages_cached == 2
    b, = m.claim(1)
    m.fetch([b], [16])  # needs all 4 pages: both cached ones are evicted
    assert m.metrics().evictions == 2
    assert sorted(e.page for e in events if e.kind == "removed") == \
        sorted(e.page for e in events if e.kind == "stored")
    m.check_invariants()


def test_release_hint_steers_the_tiered_policy():
    # a and b: 2 full pages each (page size 4) in a 6-page pool; c needs 4
    # pages, so 2 cached pages go: b's (unlikely) although a was released first.
    m = make(pages=6, eviction_policy="tiered")
    a_tokens, b_tokens = list(range(1, 10)), list(range(100, 109))
    for tokens, hint in ((a_tokens, "likely"), (b_tokens, "unlikely")):
        s, = m.claim(1)
        m.fetch([s], [9])
        m.step([s], [9], token_ids=tokens)
        m.release(s, hint)
    c, = m.claim(1)
    m.fetch([c], [16])
    assert m.metrics().evictions == 2
    m.release(c)
    probe, = m.claim(1)
    assert m.match_prefix(probe, a_tokens) == 8
    m.release(probe)
    probe, = m.claim(1)
    assert m.match_prefix(probe, b_tokens) == 0
    with pytest.raises(kvcache.InvalidArgument, match="unknown reuse hint 'maybe'"):
        m.release(probe, "maybe")
    assert probe in m  # nothing released
    m.release(probe, hint="unknown")
    m.check_invariants()


def test_pin_prefix_and_reset_prefix_cache():
    events = []
    m = make(on_event=events.append)
    prompt = list(range(8))
    a, = m.claim(1)
    m.fetch([a], [8])
    m.step([a], [8], token_ids=prompt)
    assert m.pin_prefix(prompt, priority=5) == 8
    assert m.snapshot()["cached_priorities"] == [5, 5]
    assert m.metrics().pages_pinned == 2
    m.release(a)
    m.reset_prefix_cache()
    assert m.snapshot()["cached_blocks"] == []
    assert m.free_blocks == 16
    assert sum(e.kind == "removed" for e in events) == 2


def test_extra_key_isolates_tenants():
    m = make()
    prompt = list(range(9))
    a, b, c = m.claim(3)
    m.match_prefix(a, prompt, extra_key=7)
    m.fetch([a], [9])
    m.step([a], [9], token_ids=prompt)
    assert m.match_prefix(b, prompt) == 0
    assert m.match_prefix(c, prompt, extra_key=7) == 8


def test_event_fields():
    events = []
    m = make(on_event=events.append)
    a, = m.claim(1)
    m.match_prefix(a, list(range(8)), extra_key=3)
    m.fetch([a], [8])
    m.step([a], [8], token_ids=list(range(8)))
    first, second = events
    assert (first.kind, first.tokens, first.parent_hash, first.extra_key) == \
        ("stored", [0, 1, 2, 3], 0, 3)
    assert second.parent_hash == first.hash and second.tokens == [4, 5, 6, 7]
    assert first.page != second.page


def test_callback_exception_does_not_reach_cpp(monkeypatch):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    def boom(event):
        raise RuntimeError("callback failed")

    m = make(on_event=boom)
    a, = m.claim(1)
    m.fetch([a], [8])
    m.step([a], [8], token_ids=list(range(8)))  # two events, both raise
    assert len(reported) == 2
    assert isinstance(reported[0].exc_value, RuntimeError)
    assert m.metrics().pages_published == 2
    m.check_invariants()


def test_callback_with_python_threads_does_not_deadlock():
    # The callback takes the GIL under the manager's lock; calls release the GIL
    # while they wait for the lock, so two threads cannot deadlock.
    counts = {"events": 0}

    def on_event(event):
        counts["events"] += len(event.tokens)
        time.sleep(0)  # gives the GIL away while the manager's lock is held

    m = make(pages=64, on_event=on_event)

    def worker(base):
        for i in range(100):
            s, = m.claim(1)
            prompt = [base + i % 5] * 9
            m.match_prefix(s, prompt)
            m.fetch([s], [9 - m.cache_length(s)])
            m.step([s], [9 - m.cache_length(s)], token_ids=prompt[m.cache_length(s):])
            m.release(s)

    threads = [threading.Thread(target=worker, args=(k * 100,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert counts["events"] > 0
    m.check_invariants()


def test_errors():
    off = make(enable=False)
    s, = off.claim(1)
    with pytest.raises(kvcache.InvalidArgument, match="enable_prefix_caching"):
        off.match_prefix(s, [1, 2, 3])
    with pytest.raises(kvcache.InvalidArgument, match="enable_prefix_caching"):
        off.pin_prefix([1, 2, 3, 4])
    with pytest.raises(kvcache.InvalidArgument, match="enable_prefix_caching"):
        make(enable=False, eviction_policy="lru")
    with pytest.raises(kvcache.InvalidArgument, match="lru, s3fifo, tiered, interval"):
        make(eviction_policy="fifo")
    with pytest.raises(kvcache.InvalidArgument, match="callable"):
        make(on_event=42)

    m = make()
    a, = m.claim(1)
    with pytest.raises(kvcache.UnknownSequence):
        m.match_prefix(99, [1, 2, 3])
    with pytest.raises(kvcache.UnknownSequence):
        m.fork(99)
    with pytest.raises(kvcache.InvalidArgument):
        m.match_prefix(a, [-1, 2])
    m.fetch([a], [4])
    before = m.snapshot()
    with pytest.raises(kvcache.InvalidArgument):
        m.step([a], [4], token_ids=[1, 2, 3])  # 3 ids for 4 tokens
    with pytest.raises(kvcache.InvalidArgument, match=r"token_ids\[0\] has 3 ids"):
        m.step([a], [4], token_ids=[[1, 2, 3]])
    assert m.snapshot() == before
    m.step([a], [4], token_ids=[1, 2, 3, 4])
    with pytest.raises(kvcache.InvalidArgument):
        m.match_prefix(a, [1, 2, 3, 4, 5])  # not a fresh sequence
    with pytest.raises(kvcache.CapacityExceeded):
        for _ in range(4):
            m.fork(a)
    m.check_invariants()
