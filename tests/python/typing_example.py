"""Typical kvcache code, type-checked by mypy --strict against python/kvcache.pyi
(test_stubs.py); it also runs (test_stubs.py imports and calls main)."""
from typing import Any

import numpy as np
import numpy.typing as npt

import kvcache


def serve_two_layers() -> npt.NDArray[np.float32]:
    params = kvcache.KVCacheParams(dtype="float32", n_kv_heads=2, head_dim=8, num_layers=2,
                                   cache_strategy="paged", page_size=4,
                                   enable_prefix_caching=True)
    events: list[kvcache.PageEvent] = []
    manager = kvcache.PagedKVCacheManager(params, 4, 64, total_num_pages=32,
                                          eviction_policy="lru", on_event=events.append)
    seq_ids: list[int] = manager.claim(2)
    reused: int = manager.match_prefix(seq_ids[0], [1, 2, 3, 4, 5])
    inputs: kvcache.KVCacheInputs = manager.fetch(seq_ids, [5 - reused, 3])
    blocks, cache_lengths, lookup_table, is_cache_empty = inputs[0]
    offsets = np.array([0, 5 - reused, 8 - reused], np.uint32)
    rng = np.random.default_rng(0)
    out = np.empty((8 - reused, 4, 8), np.float32)
    pool = kvcache.ThreadPool(threads=1)
    for layer in range(manager.num_layers):
        k = rng.standard_normal((8 - reused, 2, 8), dtype=np.float32)
        kvcache.store_kv(inputs, layer, k, k, offsets, pool=pool, prefetch="row-l1")
        q = rng.standard_normal((8 - reused, 4, 8), dtype=np.float32)
        filled: npt.NDArray[np.float32] = kvcache.attention(inputs, layer, q, offsets, out=out,
                                                            prefetch="tile-l1")
        fresh: npt.NDArray[np.float32] = kvcache.attention(inputs, layer, q, offsets)
        assert np.array_equal(filled, fresh)
    manager.step(seq_ids, [5 - reused, 3], token_ids=[[1, 2, 3, 4, 5][reused:], [7, 8, 9]])
    metrics: kvcache.PrefixCacheMetrics = manager.metrics()
    rate: float = metrics.hit_rate
    snapshot: dict[str, Any] = manager.snapshot()
    empty: bool = bool(is_cache_empty)
    assert rate >= 0.0 and "sequences" in snapshot and empty
    assert cache_lengths.dtype == np.uint32 and lookup_table.ndim == 2 and blocks.ndim == 6
    manager.release(seq_ids[0], "likely")
    manager.release(seq_ids[1])
    return out


def bf16_view() -> kvcache.BF16Array:
    params = kvcache.KVCacheParams("bfloat16", 1, 8, 1)
    manager = kvcache.ContinuousBatchingKVCacheManager(params, 1, 16)
    inputs = manager.fetch(manager.claim(1))
    print(repr(manager), repr(inputs), repr(params))
    device: tuple[int, int] = kvcache.as_bf16(inputs.blocks).__dlpack_device__()
    assert device == (1, 0)
    return kvcache.as_bf16(inputs.blocks)


def pool_apart() -> int:
    params = kvcache.KVCacheParams(dtype="float32", n_kv_heads=1, head_dim=4, num_layers=1,
                                   cache_strategy="paged", page_size=4,
                                   enable_prefix_caching=True)
    tier = kvcache.HostTier(params, capacity_pages=8, synchronous=True)
    manager = kvcache.PagedKVCacheManager(params, 2, 32, total_num_pages=2, tiers=[tier],
                                          pool_apart=True)
    pool = np.zeros(manager.block_shape(2), np.float32)  # the caller's own pool
    seq = manager.claim(1)[0]
    manager.fetch([seq], [8])
    manager.step([seq], [8], token_ids=list(range(8)))
    manager.release(seq)
    inputs = manager.fetch(manager.claim(1), [8])  # evicts both pages
    offloads: list[tuple[int, npt.NDArray[np.uint8]]] = inputs.block_offloads
    for page, slot in offloads:
        slot[...] = pool[page].reshape(-1).view(np.uint8)
    loads: npt.NDArray[np.uint32] = inputs.block_loads
    for page in loads:
        pool[page] = inputs.blocks[page]
    done: int = manager.complete_offloads(inputs)
    size: int = kvcache.PagedKVCacheManager.estimated_bookkeeping_size(
        params, 2, tiers=1, staging_pages=4, pool_apart=True)
    assert done == 2 and size > 0
    return done


def dtypes() -> list[kvcache.KVCacheParams]:
    return [kvcache.KVCacheParams(np.float16, 1, 8), kvcache.KVCacheParams(kvcache.DType.bf16, 1, 8),
            kvcache.KVCacheParams(np.dtype(np.float32), 1, 8),
            kvcache.KVCacheParams(n_kv_heads=1, head_dim=8, cache_strategy="paged", page_size=4)]


def main() -> None:
    assert [p.numpy_dtype.itemsize for p in dtypes()] == [2, 2, 4, 4]
    serve_two_layers()
    assert pool_apart() == 2
    assert bf16_view().dtype == "bfloat16"


if __name__ == "__main__":
    main()
