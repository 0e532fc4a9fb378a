"""Lifecycle of both managers through Python: claim -> fetch -> step -> release."""
import numpy as np
import pytest

import kvcache
from kv_helpers import make_manager

STRATEGIES = ["continuous", "paged"]


def test_params_fields_and_repr():
    p = kvcache.KVCacheParams(dtype="bfloat16", n_kv_heads=8, head_dim=128, num_layers=32,
                              cache_strategy=kvcache.KVCacheStrategy.PAGED, page_size=16)
    assert p.dtype == kvcache.DType.bf16
    assert p.numpy_dtype == np.uint16
    assert (p.n_kv_heads, p.head_dim, p.num_layers, p.page_size) == (8, 128, 32, 16)
    assert p.cache_strategy == kvcache.KVCacheStrategy.PAGED
    assert p.bytes_per_token() == 2 * 32 * 8 * 128 * 2
    assert "page_size=16" in repr(p)
    same = kvcache.KVCacheParams(dtype="bf16", n_kv_heads=8, head_dim=128, num_layers=32,
                                 cache_strategy="paged", page_size=16)
    assert p == same


def test_params_accept_numpy_dtypes():
    assert kvcache.KVCacheParams(dtype=np.float16, n_kv_heads=1, head_dim=4).dtype == \
        kvcache.DType.f16
    assert kvcache.KVCacheParams(dtype=np.float32, n_kv_heads=1, head_dim=4).dtype == \
        kvcache.DType.f32


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_claim_fetch_step_release(strategy):
    m = make_manager(strategy)
    ids = m.claim(3)
    assert ids == [0, 1, 2]
    assert m.num_active_sequences == 3
    inputs = m.fetch(ids, num_new_tokens=[5, 1, 9])
    blocks, cache_lengths, lookup_table, is_cache_empty = inputs[0]  # device 0
    assert list(cache_lengths) == [0, 0, 0]
    assert bool(is_cache_empty)
    # MAX: max_cache_length is the history maximum; with the new tokens: max_full_context_length
    assert inputs.max_seq_length == 9 and inputs.max_cache_length == 0
    assert inputs.max_full_context_length == 9
    m.step(ids, [5, 1, 9])
    assert [m.cache_length(s) for s in ids] == [5, 1, 9]
    inputs = m.fetch(ids)  # default: one new token each (decode)
    assert list(inputs.cache_lengths) == [5, 1, 9]
    assert not inputs.is_cache_empty
    assert inputs.max_seq_length == 1 and inputs.max_cache_length == 9
    assert inputs.max_full_context_length == 10
    m.step({0: 1, 1: 1, 2: 0})  # dict form
    assert [m.cache_length(s) for s in ids] == [6, 2, 9]
    m.release(1)
    assert 1 not in m and 0 in m and m.contains(2)
    assert m.num_active_sequences == 2
    m.check_invariants()
    for s in (0, 2):
        m.release(s)
    assert m.free_blocks == m.total_blocks
    m.check_invariants()


def test_continuous_lookup_table_is_the_slot():
    m = make_manager("continuous", max_batch=3)
    ids = m.claim(3)
    inputs = m.fetch([ids[2], ids[0]], [1, 1])
    snap = {s["id"]: s["blocks"] for s in m.snapshot()["sequences"]}
    assert inputs.lookup_table.shape == (2,)
    assert list(inputs.lookup_table) == [snap[ids[2]][0], snap[ids[0]][0]]


def test_paged_lookup_table_has_sentinel_and_page_table():
    m = make_manager("paged", page_size=4, max_batch=2, max_seq_len=32)
    a, b = m.claim(2)
    inputs = m.fetch([a, b], [9, 2])  # 3 pages and 1 page
    table = inputs.lookup_table
    assert table.shape == (2, 3)
    assert table[1, 1] == table[1, 2] == m.total_num_pages  # sentinel
    snap = {s["id"]: s["blocks"] for s in m.snapshot()["sequences"]}
    assert list(table[0]) == snap[a]
    assert m.free_blocks == m.total_blocks - 4


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_block_shape_and_blocks_view_shape(strategy):
    m = make_manager(strategy, n_kv_heads=2, head_dim=8, num_layers=3, page_size=4,
                     max_batch=4, max_seq_len=16)
    tokens = 4 if strategy == "paged" else 16
    assert m.block_shape(5) == [5, 2, 3, tokens, 2, 8]
    inputs = m.fetch(m.claim(1), 1)
    assert list(inputs.blocks.shape) == m.block_shape(m.total_blocks)
    assert inputs.blocks.dtype == np.float32


def test_estimated_memory_size():
    p = kvcache.KVCacheParams(dtype="float16", n_kv_heads=4, head_dim=16)
    size = kvcache.ContinuousBatchingKVCacheManager.estimated_memory_size(p, 8, 128, 6)
    assert size == 8 * 128 * 2 * 6 * 4 * 16 * 2
    pp = kvcache.KVCacheParams(dtype="float32", n_kv_heads=4, head_dim=16, num_layers=6,
                               cache_strategy="paged", page_size=16)
    # default pool: every sequence can reach max_seq_len: 8 * ceil(100 / 16) pages
    size = kvcache.PagedKVCacheManager.estimated_memory_size(pp, 8, 100)
    assert size == 8 * 7 * 16 * 2 * 6 * 4 * 16 * 4
    assert kvcache.PagedKVCacheManager.estimated_memory_size(pp, 8, 100, total_num_pages=10) \
        == 10 * 16 * pp.bytes_per_token()
    m = kvcache.PagedKVCacheManager(pp, 8, 100, cache_memory=10 * 16 * pp.bytes_per_token())
    assert m.total_num_pages == 10


def test_num_layers_from_manager_or_params():
    p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=1, head_dim=4)
    assert p.num_layers is None
    m = kvcache.ContinuousBatchingKVCacheManager(p, 2, 8, 5)
    assert m.num_layers == 5 and m.params.num_layers == 5
    with pytest.raises(kvcache.InvalidArgument, match="num_layers is unset"):
        kvcache.ContinuousBatchingKVCacheManager(p, 2, 8)
    p3 = kvcache.KVCacheParams(dtype="float32", n_kv_heads=1, head_dim=4, num_layers=3)
    assert kvcache.ContinuousBatchingKVCacheManager(p3, 2, 8).num_layers == 3
    with pytest.raises(kvcache.InvalidArgument, match="num_layers 4 differs"):
        kvcache.ContinuousBatchingKVCacheManager(p3, 2, 8, 4)


def test_devices_must_match_n_devices():
    p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=4, head_dim=4, num_layers=1,
                              n_devices=2)
    m = kvcache.ContinuousBatchingKVCacheManager(p, 2, 8, devices=["cpu0", "cpu1"])
    inputs = m.fetch(m.claim(1))
    per_device = inputs.per_device()
    assert len(per_device) == 2 and len(m.input_symbols()) == 2
    assert per_device[0][0].shape[4] == 2  # heads per device
    assert not np.shares_memory(per_device[0][0], per_device[1][0])
    with pytest.raises(kvcache.InvalidArgument, match="n_devices is 2"):
        kvcache.ContinuousBatchingKVCacheManager(p, 2, 8, devices=1)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_input_symbols_describe_fetch(strategy):
    m = make_manager(strategy, dtype="bfloat16")
    symbols = m.input_symbols()
    assert len(symbols) == 1
    blocks_t, lengths_t, lookup_t, empty_t = symbols[0]
    inputs = m.fetch(m.claim(2), [3, 7])
    for t, arr in zip(symbols[0], inputs[0]):
        assert t.dtype == arr.dtype, t
        assert len(t.shape) == arr.ndim, t
        for dim, size in zip(t.shape, arr.shape):
            assert isinstance(dim, str) or dim == size
    assert blocks_t.name == "blocks" and blocks_t.dtype == np.uint16
    assert lengths_t.shape == ["batch_size"] and empty_t.shape == []
    assert lookup_t.shape[0] == "batch_size"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_increment_cache_lengths_multistep(strategy):
    m = make_manager(strategy)
    ids = m.claim(2)
    inputs = m.fetch(ids, [3, 2], num_steps=3)  # prompt, then 2 more decode steps
    assert inputs.is_cache_empty
    tokens = np.zeros(5, np.int64)
    nxt = m.increment_cache_lengths(inputs, (tokens, np.array([0, 3, 5])))
    assert nxt is not inputs and isinstance(nxt, kvcache.KVCacheInputs)
    assert list(inputs.cache_lengths) == [0, 0] and inputs.is_cache_empty  # untouched
    assert list(nxt.cache_lengths) == [3, 2] and list(nxt[0][1]) == [3, 2]
    assert not nxt.is_cache_empty and not nxt[0][3]
    # MAX: advanced by the first step's max_seq_length (3), then by 1 a step
    assert nxt.max_seq_length == 1 and nxt.max_cache_length == 3
    assert nxt.max_full_context_length == 4
    nxt.increment_cache_lengths(np.array([0, 1, 2]))  # the in-place form
    assert list(nxt.cache_lengths) == [4, 3] and list(nxt[0][1]) == [4, 3]
    if strategy == "paged":  # continuous: the slot, not num_steps, bounds it
        with pytest.raises(kvcache.CapacityExceeded, match="reserved room"):
            nxt.increment_cache_lengths([0, 1, 2])
    else:
        with pytest.raises(kvcache.CapacityExceeded, match="reserved room for 64"):
            nxt.increment_cache_lengths([0, 60, 61])
    assert list(nxt.cache_lengths) == [4, 3]  # unchanged on error
    assert [m.cache_length(s) for s in ids] == [0, 0]  # manager state untouched
    m.step(ids, [5, 4])
    assert [m.cache_length(s) for s in ids] == [5, 4]
