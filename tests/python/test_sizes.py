"""Memory math at the edges (issue 39, item 2): a size product past 2^64 is
refused with InvalidArgument naming the values, never wrapped."""
import pytest

import kvcache


def bf16_params(strategy="continuous", page_size=None):
    return kvcache.KVCacheParams(dtype="bf16", n_kv_heads=64, head_dim=256, num_layers=64,
                                 cache_strategy=strategy, page_size=page_size)


def test_continuous_estimate_that_wraps_is_refused():
    # 213005 * 20647621 * 4 MiB per token = 2^64 + 4 MiB: it used to report 4 MiB.
    params = bf16_params()
    with pytest.raises(kvcache.InvalidArgument, match="213005.*20647621.*64 bits"):
        kvcache.ContinuousBatchingKVCacheManager.estimated_memory_size(
            params, 213005, 20647621, 64, [0])
    with pytest.raises(kvcache.InvalidArgument, match="64 bits"):
        kvcache.ContinuousBatchingKVCacheManager(params, 213005, 20647621, 64, [0])


def test_paged_estimate_that_wraps_is_refused():
    params = bf16_params("paged", page_size=2**32 - 1)
    with pytest.raises(kvcache.InvalidArgument, match="64 bits"):
        kvcache.PagedKVCacheManager.estimated_memory_size(params, 4, 8, 64, [0],
                                                          total_num_pages=2**32 - 2)
    with pytest.raises(kvcache.InvalidArgument, match="64 bits"):
        kvcache.PagedKVCacheManager(params, 4, 8, 64, [0], total_num_pages=2**32 - 2)


def test_estimate_that_fits_is_exact():
    params = bf16_params()
    per_token = 2 * 64 * 64 * 256 * 2
    assert kvcache.ContinuousBatchingKVCacheManager.estimated_memory_size(
        params, 3, 1000, 64, [0]) == 3 * 1000 * per_token


def test_pool_arrangement_round_trips():
    p = kvcache.KVCacheParams(dtype="f16", n_kv_heads=2, head_dim=8, num_layers=3,
                              cache_strategy="paged", page_size=4, pool_arrangement="per_layer")
    assert p.pool_arrangement == "per_layer"
    assert "per_layer" in repr(p)
    with pytest.raises(kvcache.InvalidArgument, match="blocked"):
        kvcache.KVCacheParams(dtype="f16", n_kv_heads=2, head_dim=8, pool_arrangement="blocked")


def test_per_layer_blocks_are_layer_major():
    # ferrum / vLLM: blocks[layer][kv] is [num_pages, heads, page_size, head_dim] (HND).
    p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=2, head_dim=4, num_layers=3,
                              cache_strategy="paged", page_size=4, page_layout="hnd",
                              pool_arrangement="per_layer")
    m = kvcache.PagedKVCacheManager(p, 4, 32, total_num_pages=6)
    ids = m.claim(1)
    blocks, lengths, table, _ = m.fetch(ids, [6])[0]
    assert blocks.shape == (3, 2, 6, 2, 4, 4)
    assert list(m.block_shape(6)) == [3, 2, 6, 2, 4, 4]
    import numpy as np
    k = np.arange(6 * 2 * 4, dtype=np.float32).reshape(6, 2, 4) + 1.0
    v = -k
    kvcache.store_kv(m.fetch(ids, [6]), 2, k, v, [0, 6])
    page1 = table[0, 1]
    # token 5 = page 1 of the table, row 1; head 1
    assert np.array_equal(blocks[2, 0, page1, 1, 1], k[5, 1])
    assert np.array_equal(blocks[2, 1, page1, 1, 1], v[5, 1])


def test_bookkeeping_is_counted_beside_the_pool():
    plain = kvcache.KVCacheParams(dtype="f16", n_kv_heads=2, head_dim=8, num_layers=2,
                                  cache_strategy="paged", page_size=16)
    assert kvcache.PagedKVCacheManager.estimated_bookkeeping_size(plain, 1 << 20) == 8 << 20
    cached = kvcache.KVCacheParams(dtype="f16", n_kv_heads=2, head_dim=8, num_layers=2,
                                   cache_strategy="paged", page_size=16,
                                   enable_prefix_caching=True)
    lru = kvcache.PagedKVCacheManager.estimated_bookkeeping_size(
        cached, 4096, eviction_policy="lru")
    s3 = kvcache.PagedKVCacheManager.estimated_bookkeeping_size(
        cached, 4096, eviction_policy="s3fifo", ghost_factor=16)
    default = kvcache.PagedKVCacheManager.estimated_bookkeeping_size(cached, 4096)
    assert lru > 4096 * (8 + 16 * 4)  # at least ref counts, free list and stored tokens
    assert s3 > lru                    # the ghost of evicted hashes
    assert default > s3                # adaptive: two shadows and two ghosts
    with pytest.raises(kvcache.InvalidArgument, match="ghost_factor"):
        kvcache.PagedKVCacheManager.estimated_bookkeeping_size(cached, 16, ghost_factor=100)
