"""Conformance to the seed page 003 (MAX's Python continuous_batching_cache,
seed 003_3e85855e2a3a9da4.txt, docs/seeds.md), written from the page: each test
quotes the sentence it checks. The code is what MAX code would do, with only
the changes the language forces (NumPy arrays for max.driver Tensors, a list of
devices for List[Device], None for the InferenceSession)."""
import inspect

import numpy as np
import pytest

import kvcache

N_KV, HEAD_DIM, LAYERS, BATCH, SEQ = 4, 8, 3, 4, 32


def params(n_devices=1, dtype="float32"):
    return kvcache.KVCacheParams(dtype=dtype, n_kv_heads=N_KV, head_dim=HEAD_DIM,
                                 cache_strategy="continuous", n_devices=n_devices)


def manager(n_devices=1, dtype="float32"):
    devices = [f"cpu{d}" for d in range(n_devices)]
    return kvcache.ContinuousBatchingKVCacheManager(params(n_devices, dtype), BATCH, SEQ,
                                                    LAYERS, devices, None)


def test_constructor_takes_the_page_arguments():
    """ContinuousBatchingKVCacheManager(params: KVCacheParams, max_cache_batch_size: int,
    max_seq_len: int, num_layers: int, devices: List[Device], session: InferenceSession)"""
    session = object()  # stands for MAX's InferenceSession
    m = kvcache.ContinuousBatchingKVCacheManager(params(), BATCH, SEQ, LAYERS, ["cpu"], session)
    assert (m.max_cache_batch_size, m.max_seq_len, m.num_layers) == (BATCH, SEQ, LAYERS)
    m = kvcache.ContinuousBatchingKVCacheManager(
        params=params(), max_cache_batch_size=BATCH, max_seq_len=SEQ, num_layers=LAYERS,
        devices=["cpu"], session=session)
    assert m.params.num_layers == LAYERS


def test_block_shape_is_the_documented_list():
    """block_shape(n_sequences: int) -> list[int]. Returns the shape of the KV cache blocks
    for the given number of sequences. ... [n_sequences, 2, num_layers, max_seq_len,
    n_kv_heads_per_device, head_dim]"""
    m = manager()
    shape = m.block_shape(3)
    assert isinstance(shape, list) and all(isinstance(d, int) for d in shape)
    assert shape == [3, 2, LAYERS, SEQ, N_KV, HEAD_DIM]
    assert manager(n_devices=2).block_shape(5) == [5, 2, LAYERS, SEQ, N_KV // 2, HEAD_DIM]


def test_block_shape_two_is_keys_then_values():
    """where 2 represents separate storage for keys and values."""
    m = manager()
    kv_cache_inputs = m.fetch(m.claim(1), [1])
    blocks, _, lookup_table, _ = kv_cache_inputs[0]
    k = np.full((1, N_KV, HEAD_DIM), 1.5, np.float32)
    v = np.full((1, N_KV, HEAD_DIM), -2.5, np.float32)
    kvcache.store_kv(kv_cache_inputs, 1, k, v, [0, 1])
    slot = lookup_table[0]
    np.testing.assert_array_equal(blocks[slot, 0, 1, 0], k[0])
    np.testing.assert_array_equal(blocks[slot, 1, 1, 0], v[0])


def test_estimated_memory_size_is_a_classmethod_with_the_page_signature():
    """classmethod estimated_memory_size(params: KVCacheParams, max_cache_batch_size: int,
    max_seq_len: int, num_layers: int, devices: List[Device]) -> int"""
    cls = kvcache.ContinuousBatchingKVCacheManager
    assert isinstance(inspect.getattr_static(cls, "estimated_memory_size"), classmethod)
    size = cls.estimated_memory_size(params(), BATCH, SEQ, LAYERS, ["cpu"])
    assert isinstance(size, int)
    assert size == manager().estimated_memory_size(params(), BATCH, SEQ, LAYERS, ["cpu"])


@pytest.mark.parametrize("n_devices", [1, 2])
def test_estimated_memory_size_is_the_total_memory(n_devices):
    """Returns the estimated total memory usage of the kv cache."""
    size = kvcache.ContinuousBatchingKVCacheManager.estimated_memory_size(
        params(n_devices, "float16"), BATCH, SEQ, LAYERS, [f"cpu{d}" for d in range(n_devices)])
    m = manager(n_devices, "float16")
    kv_cache_inputs = m.fetch(m.claim(1))
    assert size == sum(device[0].nbytes for device in kv_cache_inputs)
    assert size == BATCH * 2 * LAYERS * SEQ * N_KV * HEAD_DIM * 2


def test_fetch_returns_a_list_of_four_tuples():
    """fetch(seq_ids: List[int]) -> List[tuple[max.driver.tensor.Tensor,
    max.driver.tensor.Tensor, max.driver.tensor.Tensor, max.driver.tensor.Tensor]]"""
    m = manager()
    kv_cache_inputs = m.fetch(m.claim(2))
    assert isinstance(kv_cache_inputs, list) and len(kv_cache_inputs) == 1
    device = kv_cache_inputs[0]
    assert isinstance(device, tuple) and len(device) == 4
    assert all(isinstance(t, np.ndarray) for t in device)
    blocks, cache_lengths, lookup_table, is_cache_empty = kv_cache_inputs[0]
    assert blocks is not None and lookup_table.shape == (2,)


@pytest.mark.parametrize("n_devices", [1, 2])
def test_fetch_returns_one_tuple_per_device(n_devices):
    """Return type: List of tuples for each device containing"""
    m = manager(n_devices)
    kv_cache_inputs = m.fetch(m.claim(2))
    assert len(kv_cache_inputs) == n_devices
    for blocks, cache_lengths, lookup_table, is_cache_empty in kv_cache_inputs:
        assert list(blocks.shape) == m.block_shape(BATCH)  # heads per device
        assert list(cache_lengths) == [0, 0]
    if n_devices == 2:
        assert not np.shares_memory(kv_cache_inputs[0][0], kv_cache_inputs[1][0])


def test_fetch_returns_the_current_cache_lengths():
    """This method retrieves the current cache state for a batch of sequences, including
    their cache lengths and lookup information."""
    m = manager()
    a, b = m.claim(2)
    m.fetch([a, b])
    m.step([a, b], [5, 2])
    _, cache_lengths, lookup_table, _ = m.fetch([b, a])[0]
    assert list(cache_lengths) == [2, 5]
    assert lookup_table[0] != lookup_table[1]


def test_fetch_gives_access_to_previously_cached_key_values():
    """It's used during token generation to access previously cached key/value pairs."""
    m = manager()
    (seq,) = m.claim(1)
    rng = np.random.default_rng(3)
    k = rng.standard_normal((4, N_KV, HEAD_DIM)).astype(np.float32)
    kvcache.store_kv(m.fetch([seq], [4]), 0, k, -k, [0, 4])  # the prompt's K/V
    m.step([seq], [4])
    blocks, cache_lengths, lookup_table, _ = m.fetch([seq])[0]  # the next step
    assert cache_lengths[0] == 4
    np.testing.assert_array_equal(blocks[lookup_table[0], 0, 0, :4], k)
    np.testing.assert_array_equal(blocks[lookup_table[0], 1, 0, :4], -k)


def test_claimed_ids_lie_within_max_cache_batch_size():
    """Each ID must be within the max_cache_batch_size and must exist in the current
    cache."""
    m = manager()
    for _ in range(3):  # released ids come back: ids stay in range
        ids = m.claim(BATCH)
        assert sorted(ids) == list(range(BATCH))
        m.fetch(ids)
        for s in ids:
            m.release(s)


@pytest.mark.parametrize("bad", ["too_large", "never_claimed", "released"])
def test_fetch_raises_value_error_for_a_bad_id(bad):
    """ValueError - If any seq_id exceeds max_cache_batch_size or doesn't exist in cache"""
    m = manager()
    a, b = m.claim(2)
    seq = {"too_large": BATCH, "never_claimed": 3, "released": b}[bad]
    if bad == "released":
        m.release(b)
    with pytest.raises(ValueError):
        m.fetch([a, seq])
    with pytest.raises(ValueError):
        m.fetch([BATCH + 100])
    assert list(m.fetch([a])[0][1]) == [0]  # nothing changed


def test_blocks_tensor_contains_the_kv_cache_blocks():
    """blocks: Tensor containing the KV cache blocks"""
    m = manager(dtype="float16")
    blocks = m.fetch(m.claim(1))[0][0]
    assert list(blocks.shape) == m.block_shape(BATCH)
    assert blocks.dtype == np.float16 and blocks.flags.writeable


def test_cache_lengths_has_one_length_per_sequence():
    """cache_lengths: Tensor of current cache lengths for each sequence"""
    m = manager()
    ids = m.claim(3)
    m.fetch(ids)
    m.step(ids, [1, 7, 3])
    cache_lengths = m.fetch(ids)[0][1]
    assert cache_lengths.shape == (3,) and np.issubdtype(cache_lengths.dtype, np.integer)
    assert list(cache_lengths) == [1, 7, 3]


def test_lookup_table_maps_sequence_ids_to_cache_positions():
    """lookup_table: Tensor mapping sequence IDs to cache positions"""
    m = manager()
    ids = m.claim(3)
    kv_cache_inputs = m.fetch(ids)
    k = np.stack([np.full((N_KV, HEAD_DIM), float(s + 1), np.float32) for s in ids])
    kvcache.store_kv(kv_cache_inputs, 0, k, k, [0, 1, 2, 3])  # one token per sequence
    m.step(ids, [1, 1, 1])
    reordered = [ids[2], ids[0]]
    blocks, _, lookup_table, _ = m.fetch(reordered)[0]
    assert lookup_table.shape == (2,) and all(p < BATCH for p in lookup_table)
    for b, s in enumerate(reordered):
        assert blocks[lookup_table[b], 0, 0, 0, 0, 0] == s + 1


def test_is_cache_empty_tells_whether_every_cache_is_empty():
    """is_cache_empty: Boolean tensor indicating if all sequences have empty caches"""
    m = manager()
    a, b = m.claim(2)
    empty = m.fetch([a, b])[0][3]
    assert empty.dtype == np.bool_ and bool(empty) is True
    m.step([a], [1])
    assert bool(m.fetch([a, b])[0][3]) is False
    assert bool(m.fetch([b])[0][3]) is True


def test_increment_cache_lengths_signature_and_result():
    """increment_cache_lengths(kv_cache_inputs: List[tuple[...]], prev_model_inputs:
    tuple[max.driver.tensor.Tensor, ...]) -> List[tuple[...]]"""
    m = manager()
    ids = m.claim(2)
    kv_cache_inputs = m.fetch(ids)
    prev_model_inputs = (np.zeros(2, np.int64), np.array([0, 1, 2], np.uint32))
    out = m.increment_cache_lengths(kv_cache_inputs, prev_model_inputs)
    assert isinstance(out, list) and len(out) == 1
    assert isinstance(out[0], tuple) and len(out[0]) == 4


def test_increment_cache_lengths_prepares_the_next_step():
    """Prepares cache inputs for the next token in multistep execution."""
    m = manager()
    ids = m.claim(2)
    kv_cache_inputs = m.fetch(ids)
    tokens, row_offsets = np.zeros(8, np.int64), np.array([0, 5, 8])  # prompts of 5 and 3
    kv_cache_inputs = m.increment_cache_lengths(kv_cache_inputs, (tokens, row_offsets))
    _, cache_lengths, _, _ = kv_cache_inputs[0]
    assert list(cache_lengths) == [5, 3]  # the next token goes after the prompt
    kv_cache_inputs = m.increment_cache_lengths(kv_cache_inputs, (tokens[:2], [0, 1, 2]))
    assert list(kv_cache_inputs[0][1]) == [6, 4]
    assert [m.cache_length(s) for s in ids] == [0, 0]  # in progress: the manager waits
    m.step(ids, [7, 5])  # the whole multistep run, committed at the end
    assert [m.cache_length(s) for s in ids] == [7, 5]


def test_increment_cache_lengths_copies_no_memory():
    """Updates the cache lengths for the next inference step without requiring device
    synchronization or memory copies."""
    m = manager(n_devices=2)
    kv_cache_inputs = m.fetch(m.claim(2))
    out = m.increment_cache_lengths(kv_cache_inputs, (None, np.array([0, 1, 1])))
    for before, after in zip(kv_cache_inputs, out):  # the same cache memory, per device
        assert after[0].__array_interface__["data"] == before[0].__array_interface__["data"]
    assert list(out[0][1]) == list(out[1][1]) == [1, 0]


def test_increment_cache_lengths_takes_row_offsets_from_prev_model_inputs():
    """prev_model_inputs - Previous model inputs including row offsets"""
    m = manager()
    ids = m.claim(3)
    kv_cache_inputs = m.fetch(ids)
    prev_model_inputs = (np.arange(6), np.array([0, 1, 4, 6], np.uint32))
    out = m.increment_cache_lengths(kv_cache_inputs, prev_model_inputs)
    assert list(out[0][1]) == [1, 3, 2]


def test_increment_cache_lengths_returns_non_empty_caches():
    """Returns: Updated cache input tuples with incremented lengths and
    is_cache_empty=False since only the first step can be context encoding"""
    m = manager()
    ids = m.claim(2)
    kv_cache_inputs = m.fetch(ids)
    assert bool(kv_cache_inputs[0][3]) is True
    out = m.increment_cache_lengths(kv_cache_inputs, (None, [0, 2, 3]))
    blocks, cache_lengths, lookup_table, is_cache_empty = out[0]
    assert list(cache_lengths) == [2, 1] and bool(is_cache_empty) is False
    assert list(lookup_table) == list(kv_cache_inputs[0][2])
    # The inputs passed in are the current state tuples: unchanged.
    assert list(kv_cache_inputs[0][1]) == [0, 0] and bool(kv_cache_inputs[0][3]) is True


def test_increment_cache_lengths_takes_the_current_state_tuples():
    """kv_cache_inputs - Current cache state tuples (blocks, lengths, lookup, empty flag)"""
    m = manager()
    ids = m.claim(2)
    tuples = list(m.fetch(ids))  # a plain list of the tuples works as well
    out = m.increment_cache_lengths(tuples, (None, [0, 1, 2]))
    assert list(out[0][1]) == [1, 1]


@pytest.mark.parametrize("n_devices", [1, 2])
def test_input_symbols_has_one_tuple_per_device(n_devices):
    """input_symbols() -> List[tuple[TensorType, TensorType, TensorType, TensorType]] ...
    Returns the expected input tensor types for fetch on each device."""
    m = manager(n_devices)
    symbols = m.input_symbols()
    assert isinstance(symbols, list) and len(symbols) == n_devices
    assert all(isinstance(s, tuple) and len(s) == 4 for s in symbols)


def test_input_symbols_describe_the_fetch_outputs():
    """Defines the tensor specifications needed by the cache implementation, including
    shapes and data types."""
    m = manager(dtype="float16")
    kv_cache_inputs = m.fetch(m.claim(3))
    for types, tensors in zip(m.input_symbols(), kv_cache_inputs):
        for t, tensor in zip(types, tensors):
            assert t.dtype == tensor.dtype
            assert len(t.shape) == tensor.ndim
            for dim, size in zip(t.shape, tensor.shape):
                assert isinstance(dim, str) or dim == size


def test_input_symbols_ranks_and_types():
    """KV cache blocks: 6D tensor for storing keys and values / Cache lengths: 1D tensor
    tracking sequence lengths / Lookup table: 1D tensor mapping sequence IDs to cache
    positions / Cache empty flag: Scalar boolean tensor"""
    blocks, cache_lengths, lookup_table, is_cache_empty = manager().input_symbols()[0]
    assert len(blocks.shape) == 6
    assert len(cache_lengths.shape) == 1
    assert len(lookup_table.shape) == 1
    assert len(is_cache_empty.shape) == 0 and is_cache_empty.dtype == np.bool_


def test_collection_borrows_the_manager_buffers():
    """This object does not own the underlying buffers in k_cache and v_cache, it's
    borrowing them from the BlockWrappers in our ContinuousKVCacheManager."""
    m = manager()
    a, b = m.claim(2)
    first, second = m.fetch([a])[0], m.fetch([b])[0]
    assert not first[0].flags.owndata
    assert first[0].__array_interface__["data"] == second[0].__array_interface__["data"]


def test_collection_owns_its_valid_lengths():
    """It does own the Pointer[NDBuffer[type, 3]] and valid_lengths buffer"""
    m = manager()
    a, b = m.claim(2)
    first = m.fetch([a, b])[0]
    m.step([a], [3])
    second = m.fetch([a, b])[0]
    assert not np.shares_memory(first[1], second[1])
    assert list(first[1]) == [0, 0] and list(second[1]) == [3, 0]
