"""C++ errors surface as typed kvcache exceptions with the C++ messages, and a
failing call changes nothing (strong guarantee)."""
import numpy as np
import pytest

import kvcache
from kv_helpers import make_manager


def test_hierarchy():
    assert issubclass(kvcache.InvalidArgument, kvcache.Error)
    assert issubclass(kvcache.InvalidArgument, ValueError)
    assert issubclass(kvcache.UnknownSequence, KeyError)
    assert issubclass(kvcache.OutOfPages, MemoryError)
    assert issubclass(kvcache.CapacityExceeded, ValueError)
    assert issubclass(kvcache.OutOfMemory, MemoryError)
    for name in ("InvalidArgument", "UnknownSequence", "OutOfPages", "CapacityExceeded",
                 "OutOfMemory"):
        assert issubclass(getattr(kvcache, name), kvcache.Error)
        assert getattr(kvcache, name).__module__ == "kvcache"


def test_unknown_sequence_message_is_not_quoted():
    m = make_manager("continuous")
    with pytest.raises(kvcache.UnknownSequence) as info:
        m.release(7)
    assert str(info.value) == "seq 7 is not claimed (never claimed, or already released)"
    with pytest.raises(KeyError):
        m.cache_length(7)


def test_release_twice():
    m = make_manager("paged")
    (s,) = m.claim(1)
    m.release(s)
    with pytest.raises(kvcache.UnknownSequence, match=f"seq {s} is not claimed"):
        m.release(s)


@pytest.mark.parametrize("strategy", ["continuous", "paged"])
def test_capacity_exceeded_names_the_limit_and_changes_nothing(strategy):
    m = make_manager(strategy, max_batch=2, max_seq_len=16)
    ids = m.claim(2)
    m.fetch(ids, [4, 4])
    before = m.snapshot()
    with pytest.raises(kvcache.CapacityExceeded, match="max_seq_len is 16"):
        m.fetch(ids, [4, 17])
    with pytest.raises(kvcache.CapacityExceeded, match="max_batch_size 2"):
        m.claim(1)
    room = 4 if strategy == "paged" else 16  # continuous: the whole slot is reserved
    with pytest.raises(kvcache.CapacityExceeded, match=f"fetch reserved room for {room}"):
        m.step(ids, [4, room + 1])
    assert m.snapshot() == before
    m.check_invariants()


def test_out_of_pages_is_all_or_nothing():
    m = make_manager("paged", page_size=4, max_batch=3, max_seq_len=64, total_num_pages=5)
    ids = m.claim(3)
    m.fetch([ids[0]], [8])  # 2 pages
    before = m.snapshot()
    with pytest.raises(kvcache.OutOfPages, match=r"need 4 pages .* 3 free \+ 0 evictable of 5") as info:
        m.fetch(ids[1:], [8, 8])
    assert isinstance(info.value, MemoryError)
    assert m.snapshot() == before
    assert m.free_blocks == 3


def test_invalid_arguments():
    m = make_manager("paged")
    ids = m.claim(2)
    with pytest.raises(kvcache.InvalidArgument, match="claim at least one"):
        m.claim(0)
    with pytest.raises(kvcache.InvalidArgument, match="appears more than once"):
        m.fetch([ids[0], ids[0]], 1)
    with pytest.raises(kvcache.InvalidArgument, match="num_new_tokens has 1 entries"):
        m.fetch(ids, [1])
    with pytest.raises(kvcache.InvalidArgument, match=r"num_new_tokens\[1\] is -3"):
        m.fetch(ids, [1, -3])
    with pytest.raises(kvcache.InvalidArgument, match="num_steps is 0"):
        m.fetch(ids, 1, num_steps=0)
    with pytest.raises(kvcache.InvalidArgument, match="batch is empty"):
        m.fetch([], [])
    with pytest.raises(kvcache.InvalidArgument, match="integer"):
        m.fetch(ids, [1.5, 2.0])
    with pytest.raises(kvcache.InvalidArgument, match="valid_lengths is missing"):
        m.step(ids)
    with pytest.raises(kvcache.InvalidArgument, match="n_kv_heads"):
        kvcache.KVCacheParams(dtype="float32", n_kv_heads=0, head_dim=4)
    with pytest.raises(kvcache.InvalidArgument, match="page_size"):
        kvcache.KVCacheParams(dtype="float32", n_kv_heads=1, head_dim=4,
                              cache_strategy="paged")
    with pytest.raises(kvcache.InvalidArgument, match="float64"):
        kvcache.KVCacheParams(dtype=np.float64, n_kv_heads=1, head_dim=4)
    with pytest.raises(kvcache.InvalidArgument, match="n_kv_heads is -1"):
        kvcache.KVCacheParams(dtype="float32", n_kv_heads=-1, head_dim=4)
    p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=1, head_dim=4, num_layers=1,
                              cache_strategy="paged", page_size=4)
    with pytest.raises(kvcache.InvalidArgument, match="continuous"):
        kvcache.ContinuousBatchingKVCacheManager(p, 1, 4)


def test_kernel_argument_errors():
    m = make_manager("paged", n_kv_heads=2, head_dim=8, num_layers=2)
    inputs = m.fetch(m.claim(1), [3])
    k = np.ones((3, 2, 8), np.float32)
    with pytest.raises(kvcache.InvalidArgument, match="out of range: the cache has 2 layers"):
        kvcache.store_kv(inputs, 2, k, k, [0, 3])
    with pytest.raises(kvcache.InvalidArgument, match=r"k_new has shape \(3, 1, 8\)"):
        kvcache.store_kv(inputs, 0, np.ones((3, 1, 8), np.float32), k, [0, 3])
    with pytest.raises(kvcache.InvalidArgument, match="row_offsets has 3 entries"):
        kvcache.store_kv(inputs, 0, k, k, [0, 1, 3])
    with pytest.raises(kvcache.InvalidArgument, match="k_new has 48 elements, expected 32"):
        kvcache.store_kv(inputs, 0, k, k, [0, 2])
    with pytest.raises(kvcache.InvalidArgument, match="positive multiple of n_kv_heads 2"):
        kvcache.attention(inputs, 0, np.ones((3, 3, 8), np.float32), [0, 3])
    with pytest.raises(kvcache.InvalidArgument, match="out must be"):
        kvcache.attention(inputs, 0, np.ones((3, 4, 8), np.float32), [0, 3],
                          out=np.zeros((3, 4, 8), np.float64))
