"""Readable repr()s: params (a constructor call that makes equal params),
managers (their constructor arguments; no lock taken, so safe inside on_event),
batches / KVCacheInputs (seq ids and lengths, long lists shortened), RopeTable."""
import threading

import numpy as np

import kvcache
from kv_helpers import offsets_of

NAMES = {"KVCacheParams": kvcache.KVCacheParams,
         "PagedKVCacheManager": kvcache.PagedKVCacheManager,
         "ContinuousBatchingKVCacheManager": kvcache.ContinuousBatchingKVCacheManager}


def test_params_repr_is_a_constructor_call_of_equal_params():
    for kwargs in ({"n_kv_heads": 2, "head_dim": 16},
                   {"dtype": "bfloat16", "n_kv_heads": 8, "head_dim": 128, "num_layers": 32,
                    "cache_strategy": "paged", "page_size": 16, "enable_prefix_caching": True,
                    "n_devices": 2, "page_layout": "hnd", "pool_arrangement": "per_layer"}):
        p = kvcache.KVCacheParams(**kwargs)
        assert eval(repr(p), NAMES) == p
    assert repr(kvcache.KVCacheParams(dtype="float16", n_kv_heads=2, head_dim=16)) == (
        "KVCacheParams(dtype='f16', n_kv_heads=2, head_dim=16, num_layers=None, "
        "cache_strategy='continuous')")


def paged_params(**extra):
    return kvcache.KVCacheParams(n_kv_heads=2, head_dim=8, num_layers=2, cache_strategy="paged",
                                 page_size=4, **extra)


def test_manager_repr_shows_its_constructor_arguments():
    m = kvcache.PagedKVCacheManager(paged_params(), 8, 512, total_num_pages=64)
    assert repr(m) == (
        "PagedKVCacheManager(KVCacheParams(dtype='f32', n_kv_heads=2, head_dim=8, "
        "num_layers=2, cache_strategy='paged', page_size=4), max_cache_batch_size=8, "
        "max_seq_len=512, total_num_pages=64)")
    again = eval(repr(m), NAMES)
    assert again.params == m.params and again.total_num_pages == 64
    c = kvcache.ContinuousBatchingKVCacheManager(
        kvcache.KVCacheParams(n_kv_heads=1, head_dim=8), 4, 32, num_layers=3)
    assert repr(c) == (
        "ContinuousBatchingKVCacheManager(KVCacheParams(dtype='f32', n_kv_heads=1, head_dim=8, "
        "num_layers=3, cache_strategy='continuous'), max_cache_batch_size=4, max_seq_len=32)")


def test_manager_repr_is_safe_inside_on_event():
    # on_event runs under the manager's lock: a repr that took it would hang here.
    seen, holder = [], []
    m = kvcache.PagedKVCacheManager(paged_params(enable_prefix_caching=True), 2, 64,
                                    on_event=lambda e: seen.append(repr(holder[0])))
    holder.append(m)

    def publish():
        s, = m.claim(1)
        m.fetch([s], [4])
        m.step([s], [4], token_ids=[1, 2, 3, 4])

    worker = threading.Thread(target=publish, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "repr(manager) inside on_event deadlocked"
    assert seen == [repr(m)]
    holder.clear()


def test_batch_repr_shows_ids_and_lengths():
    m = kvcache.PagedKVCacheManager(paged_params(enable_prefix_caching=True), 16, 64)
    ids = m.claim(2)
    inputs = m.fetch(ids, [5, 3], num_steps=2)
    expected = ("(paged f32, seq_ids=[0, 1], cache_lengths=[0, 0], reserved_lengths=[6, 4], "
                "max_seq_length=5, max_cache_length=0, is_cache_empty=True)")
    assert repr(inputs) == "KVCacheInputs" + expected
    assert repr(inputs.batch) == "KVCacheBatch" + expected
    inputs.increment_cache_lengths(offsets_of([5, 3]))
    assert "cache_lengths=[5, 3]" in repr(inputs) and "is_cache_empty=False" in repr(inputs)
    m.step(ids, [5, 3], token_ids=[[1, 2, 3, 4, 5], [6, 7, 8]])
    child = m.fork(ids[0])  # shares the half-full second page: the next fetch copies it
    assert "block_copies=1" in repr(m.fetch([child], [1]))


def test_a_long_batch_is_shortened():
    m = kvcache.ContinuousBatchingKVCacheManager(
        kvcache.KVCacheParams(n_kv_heads=1, head_dim=8), 12, 16, 1)
    text = repr(m.fetch(m.claim(12), 2))
    assert "seq_ids=[0, 1, 2, 3, 4, 5, ..., 10, 11] (12 entries)" in text
    assert "cache_lengths=[0, 0, 0, 0, 0, 0, ..., 0, 0] (12 entries)" in text
    nine = repr(m.fetch(list(range(9)), 1))  # short enough to show whole
    assert "seq_ids=[0, 1, 2, 3, 4, 5, 6, 7, 8]," in nine


def test_multi_device_batch_names_its_devices():
    p = kvcache.KVCacheParams(n_kv_heads=2, head_dim=8, num_layers=1, n_devices=2)
    m = kvcache.ContinuousBatchingKVCacheManager(p, 2, 16)
    assert repr(m.fetch(m.claim(1))).endswith(", devices=2)")


def test_rope_table_repr():
    assert repr(kvcache.RopeTable(8, 16)) == (
        "RopeTable(max_positions=16, theta=10000.0, rotary_dim=8)")
    assert repr(kvcache.RopeTable(8, 4, theta=500000.0, rotary_dim=4)) == (
        "RopeTable(max_positions=4, theta=500000.0, rotary_dim=4)")
    assert np.isfinite(kvcache.RopeTable(8, 4).cos_sin(3)).all()
