"""The MAX-shaped API on both managers beyond what the seed page states (see
test_seed_max.py for that): paged constructor and classmethod, seq ids in
[0, max_cache_batch_size), the continuous slot, the forms of
increment_cache_lengths' prev_model_inputs, and the kernels on what fetch
returns."""
import inspect

import numpy as np
import pytest

import kvcache
from kv_helpers import make_manager, offsets_of, random_rows

STRATEGIES = ["continuous", "paged"]


def paged_params(**kw):
    return kvcache.KVCacheParams(dtype="float32", n_kv_heads=2, head_dim=4,
                                 cache_strategy="paged", page_size=4, **kw)


def test_paged_manager_takes_the_max_arguments_and_keeps_its_keywords():
    cls = kvcache.PagedKVCacheManager
    m = cls(paged_params(), 4, 32, 2, ["cpu"], object(), total_num_pages=10)
    assert (m.total_num_pages, m.num_layers) == (10, 2)
    assert isinstance(inspect.getattr_static(cls, "estimated_memory_size"), classmethod)
    assert cls.estimated_memory_size(paged_params(), 4, 32, 2, ["cpu"], total_num_pages=10) \
        == 10 * 4 * paged_params(num_layers=2).bytes_per_token()
    with pytest.raises(TypeError):  # the pool size stays keyword-only
        cls(paged_params(), 4, 32, 2, ["cpu"], None, 10)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_released_ids_are_reused_lowest_first(strategy):
    m = make_manager(strategy, max_batch=4)
    assert m.claim(3) == [0, 1, 2]
    m.release(1)
    m.release(0)
    assert m.claim(1) == [0]
    assert m.claim(2) == [1, 3]
    assert m.snapshot()["next_seq_id"] == 4
    with pytest.raises(kvcache.CapacityExceeded, match="max_batch_size 4"):
        m.claim(1)
    m.check_invariants()


def test_fork_takes_the_lowest_free_id():
    m = make_manager("paged", max_batch=4)
    a, b = m.claim(2)
    m.fetch([a], [5])
    m.step([a], [5])
    m.release(b)
    child = m.fork(a)
    assert child == b and m.cache_length(child) == 5
    m.check_invariants()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bad_ids_raise_value_error_naming_the_id(strategy):
    m = make_manager(strategy, max_batch=4)
    (a,) = m.claim(1)
    for bad in (4, 99, 2 ** 40):
        with pytest.raises(ValueError, match=f"seq {bad} is not claimed"):
            m.fetch([a, bad])
        with pytest.raises(kvcache.UnknownSequence):
            m.step([bad], [1])
    with pytest.raises(ValueError):  # not an id at all
        m.fetch([-1])
    assert issubclass(kvcache.UnknownSequence, ValueError)
    assert issubclass(kvcache.UnknownSequence, KeyError)  # as before


def test_continuous_fetch_without_counts_then_any_step_that_fits():
    m = make_manager("continuous", max_seq_len=16)
    a, b = m.claim(2)
    inputs = m.fetch([a, b])  # no token counts, as MAX's fetch(seq_ids)
    assert list(inputs.reserved_lengths) == [16, 16]
    m.step([a, b], [9, 16])
    assert (m.cache_length(a), m.cache_length(b)) == (9, 16)
    m.fetch([a])
    with pytest.raises(kvcache.CapacityExceeded, match="reserved room for 16"):
        m.step([a], [8])
    m.step({a: 7})
    assert m.cache_length(a) == 16
    with pytest.raises(kvcache.CapacityExceeded, match="max_seq_len is 16"):
        m.fetch([a], [1])  # counts still bound the fetch


def test_paged_fetch_without_counts_reserves_one_token():
    m = make_manager("paged", max_seq_len=16)
    (a,) = m.claim(1)
    m.fetch([a])
    with pytest.raises(kvcache.CapacityExceeded, match="reserved room for 1"):
        m.step([a], [2])


class ModelInputs:
    """Stands for a later MAX's ModelInputs with an input_row_offsets field."""

    def __init__(self, offsets):
        self.input_row_offsets = offsets


@pytest.mark.parametrize("form", ["tuple", "list", "bare_array", "int_list", "attribute"])
def test_increment_cache_lengths_finds_the_row_offsets(form):
    m = make_manager("paged", max_seq_len=16)
    ids = m.claim(2)
    inputs = m.fetch(ids, [3, 2], num_steps=2)
    offsets = np.array([0, 3, 5], np.uint32)
    prev = {"tuple": (np.zeros(5), offsets), "list": [np.zeros(5), offsets],
            "bare_array": offsets, "int_list": [0, 3, 5],
            "attribute": ModelInputs(offsets)}[form]
    out = m.increment_cache_lengths(inputs, prev)
    assert list(out.cache_lengths) == [3, 2] and not out.is_cache_empty


def test_increment_cache_lengths_refuses_what_it_cannot_use():
    m, other = make_manager("paged"), make_manager("paged")
    inputs = m.fetch(m.claim(2), [1, 1])
    with pytest.raises(kvcache.InvalidArgument, match="another manager"):
        other.increment_cache_lengths(inputs, [0, 1, 2])
    with pytest.raises(kvcache.InvalidArgument, match="KVCacheInputs"):
        m.increment_cache_lengths([(1, 2, 3, 4)], [0, 1, 2])
    with pytest.raises(kvcache.InvalidArgument, match="batch_size \\+ 1 = 3"):
        m.increment_cache_lengths(inputs, (None, [0, 1]))
    with pytest.raises(kvcache.CapacityExceeded):
        m.increment_cache_lengths(inputs, [0, 1, 2])  # one step fetched: no room
    assert list(inputs.cache_lengths) == [0, 0] and inputs.is_cache_empty


def test_a_single_device_tuple_is_accepted_for_increment():
    m = make_manager("continuous")
    inputs = m.fetch(m.claim(1))
    out = m.increment_cache_lengths(inputs[0], [0, 4])
    assert list(out[0][1]) == [4]


def test_kvcache_inputs_is_a_list_with_the_batch_attributes():
    m = make_manager("paged")
    inputs = m.fetch(m.claim(2), [5, 3])
    assert isinstance(inputs, list) and isinstance(inputs, kvcache.KVCacheInputs)
    assert isinstance(inputs.batch, kvcache.KVCacheBatch)
    assert inputs.seq_ids == [0, 1] and inputs.batch_size == 2
    assert len(inputs.per_device()) == 1 and inputs.per_device()[0] is inputs[0]
    assert inputs.device(0)[0].shape == inputs.blocks.shape
    assert inputs.block_copies.shape == (0, 2)
    assert repr(inputs).startswith("KVCacheInputs(paged f32, seq_ids=[0, 1], cache_lengths=[0, 0]")
    with pytest.raises(kvcache.InvalidArgument):
        inputs.device(1)


def test_kernels_take_a_device_tuple_and_its_device():
    p = kvcache.KVCacheParams(dtype="float32", n_kv_heads=4, head_dim=4, num_layers=1,
                              n_devices=2)
    m = kvcache.ContinuousBatchingKVCacheManager(p, 2, 8, devices=2)
    inputs = m.fetch(m.claim(1), [2])
    rng = np.random.default_rng(5)
    k = random_rows(rng, 2, 2, 4)  # two heads per device
    kvcache.store_kv(inputs[1], 0, k, -k, offsets_of([2]))  # device 1's tuple
    blocks1, _, lookup, _ = inputs[1]
    np.testing.assert_array_equal(blocks1[lookup[0], 0, 0, :2], k)
    assert not inputs[0][0].any()  # device 0 untouched
    q = random_rows(rng, 2, 2, 4)
    np.testing.assert_array_equal(kvcache.attention(inputs[1], 0, q, [0, 2]),
                                  kvcache.attention(inputs, 0, q, [0, 2], device=1))
    with pytest.raises(kvcache.InvalidArgument, match="tuple of device 1"):
        kvcache.store_kv(inputs[1], 0, k, k, [0, 2], device=0)
    with pytest.raises(kvcache.InvalidArgument, match="KVCacheInputs"):
        kvcache.attention("not inputs", 0, q, [0, 2])
