"""Zero-copy: fetch's arrays view the C++ memory, both directions."""
import gc

import numpy as np
import pytest

import kvcache
from kv_helpers import make_manager, offsets_of, random_rows

STRATEGIES = ["continuous", "paged"]


def fetch_two(m):
    """Room for 5 + 3 new tokens of two new sequences."""
    return m.fetch(m.claim(2), [5, 3])


def store_token_rows(inputs, strategy, seed):
    """Stores random K/V rows for fetch_two's tokens into layer 1 from C++ and
    returns (k, v, page, row): where token 4 of entry 0 lives (second page
    when paged, slot row 4 when continuous)."""
    rng = np.random.default_rng(seed)
    k, v = random_rows(rng, 8, 2, 8), random_rows(rng, 8, 2, 8)
    kvcache.store_kv(inputs, 1, k, v, offsets_of([5, 3]))
    if strategy == "paged":
        page, row = inputs.lookup_table[0, 1], 0
    else:
        page, row = inputs.lookup_table[0], 4
    return k, v, page, row


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cpp_store_kv_is_seen_by_numpy_blocks(strategy):
    m = make_manager(strategy, page_size=4)
    inputs = fetch_two(m)
    blocks = inputs.blocks  # taken BEFORE the C++ write
    before = blocks.copy()
    k, v, page, row = store_token_rows(inputs, strategy, seed=1)
    np.testing.assert_array_equal(blocks[page, 0, 1, row], k[4])
    np.testing.assert_array_equal(blocks[page, 1, 1, row], v[4])
    assert not np.array_equal(blocks, before)
    np.testing.assert_array_equal(blocks[:, :, 0], before[:, :, 0])  # layer 0 untouched


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_hnd_blocks_put_heads_before_tokens(strategy):
    m = make_manager(strategy, page_size=4, page_layout="hnd")
    assert m.params.page_layout == "hnd" and "hnd" in repr(m.params)
    tokens = 4 if strategy == "paged" else 64
    assert m.block_shape(3) == [3, 2, 2, 2, tokens, 8]  # [.., heads, tokens, head_dim]
    inputs = fetch_two(m)
    assert list(inputs.blocks.shape) == m.block_shape(m.total_blocks)
    k, v, page, row = store_token_rows(inputs, strategy, seed=3)
    for head in range(2):  # token 4 of entry 0, each head
        np.testing.assert_array_equal(inputs.blocks[page, 0, 1, head, row], k[4, head])
        np.testing.assert_array_equal(inputs.blocks[page, 1, 1, head, row], v[4, head])
    with pytest.raises(kvcache.InvalidArgument, match="nhwc"):
        kvcache.KVCacheParams(n_kv_heads=2, head_dim=8, page_layout="nhwc")


def test_numpy_writes_are_seen_by_cpp_attention():
    m = make_manager("continuous", n_kv_heads=1, head_dim=4, num_layers=1, max_seq_len=8)
    seq = m.claim(1)
    inputs = m.fetch(seq, 1)
    slot = inputs.lookup_table[0]
    inputs.blocks[slot, 1, 0, 0, 0] = [1.0, 2.0, 3.0, 4.0]  # V of token 0, written by NumPy
    out = kvcache.attention(inputs, 0, np.ones((1, 1, 4), np.float32), [0, 1])
    np.testing.assert_array_equal(out[0, 0], [1.0, 2.0, 3.0, 4.0])  # one token: out == V


def test_blocks_of_two_fetches_share_memory():
    m = make_manager("paged")
    a, b = m.claim(2)
    x, y = m.fetch([a], 1), m.fetch([b], 1)
    assert np.shares_memory(x.blocks, y.blocks)
    assert x.blocks.__array_interface__["data"][0] == y.blocks.__array_interface__["data"][0]
    assert x.blocks.flags.writeable and not x.blocks.flags.owndata


def test_batch_arrays_are_read_only_views_updated_in_place():
    m = make_manager("paged")
    ids = m.claim(2)
    inputs = m.fetch(ids, [2, 2], num_steps=2)
    lengths, empty = inputs.cache_lengths, inputs.is_cache_empty
    assert not lengths.flags.writeable and not inputs.lookup_table.flags.writeable
    with pytest.raises(ValueError):
        lengths[0] = 7
    inputs.increment_cache_lengths([0, 2, 4])  # C++ changes the batch in place
    assert list(lengths) == [2, 2]  # the old array sees it: same memory
    assert bool(empty) is False and empty.shape == ()
    assert list(inputs[0][1]) == [2, 2] and not inputs[0][3]  # so do the device tuples


def test_views_keep_the_manager_alive():
    m = make_manager("continuous")
    inputs = m.fetch(m.claim(1), 1)
    blocks = inputs.blocks
    del m, inputs
    gc.collect()
    blocks[...] = 3.0  # memory is still owned by the (kept alive) manager
    assert float(blocks.sum()) == 3.0 * blocks.size


def test_bf16_cache_is_uint16_with_helpers():
    m = make_manager("paged", dtype="bf16", n_kv_heads=1, head_dim=4, num_layers=1)
    inputs = m.fetch(m.claim(1), 1)
    assert inputs.blocks.dtype == np.uint16
    k = np.array([[[1.0, -2.5, 3.0078125, 1e-3]]], np.float32)
    kvcache.store_kv(inputs, 0, k, k, [0, 1])
    page = inputs.lookup_table[0, 0]
    bits = inputs.blocks[page, 0, 0, 0, 0]
    np.testing.assert_array_equal(bits, kvcache.float32_to_bf16(k[0, 0]))
    back = kvcache.bf16_to_float32(bits)
    assert back.dtype == np.float32 and back.shape == (4,)
    np.testing.assert_allclose(back, k[0, 0], rtol=2 ** -8)
    assert back[0] == 1.0 and back[1] == -2.5


def test_bf16_helpers_round_to_nearest_even_and_keep_nan():
    x = np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, np.nan, -np.inf], np.float32)
    bits = kvcache.float32_to_bf16(x)
    np.testing.assert_array_equal(bits[:2], [0x3F80, 0x3F82])  # ties to even
    back = kvcache.bf16_to_float32(bits)
    assert np.isnan(back[2]) and back[3] == -np.inf
    with pytest.raises(kvcache.InvalidArgument, match="uint16"):
        kvcache.bf16_to_float32(np.zeros(3, np.float32))


def test_f16_cache_is_numpy_float16():
    m = make_manager("continuous", dtype="float16", n_kv_heads=1, head_dim=4, num_layers=1)
    inputs = m.fetch(m.claim(1), 1)
    assert inputs.blocks.dtype == np.float16
    k = np.array([[[0.1, 0.2, 0.3, 70000.0]]], np.float32)
    kvcache.store_kv(inputs, 0, k, k, [0, 1])
    slot = inputs.lookup_table[0]
    with np.errstate(over="ignore"):  # 70000 -> inf, in NumPy as in C++
        expected = k[0, 0].astype(np.float16)
    np.testing.assert_array_equal(inputs.blocks[slot, 0, 0, 0, 0], expected)
    assert np.isinf(inputs.blocks[slot, 0, 0, 0, 0, 3])
