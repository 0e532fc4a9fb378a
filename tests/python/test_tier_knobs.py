"""The write-back batching and tier lingering keywords through the Python binding:
PagedKVCacheManager(offload_batch=, offload_delay_us=) and HostTier / DiskTier
(linger_us=). Their defaults are the C++ ones, a value out of range raises
InvalidArgument naming it and its range, and the batching reaches the manager: a
batch of 1 (or a delay of 0) hands an evicting call's write-backs to the tier
before the call returns, a large batch with a long delay keeps them staged until
wait_tiers()."""
import re

import pytest

import kvcache

PAGE = 4


def params(prefix=True):
    return kvcache.KVCacheParams(dtype="float32", n_kv_heads=2, head_dim=4, num_layers=3,
                                 cache_strategy="paged", page_size=PAGE,
                                 enable_prefix_caching=prefix)


def host(p, **kwargs):
    return kvcache.HostTier(p, capacity_pages=64, model_id="model", synchronous=True, **kwargs)


def manager(p, tiers, **kwargs):
    return kvcache.PagedKVCacheManager(p, 4, 64, total_num_pages=4, tiers=tiers, **kwargs)


def default_of(cls, keyword):
    """The default pybind11's signature gives `keyword` of cls's constructor."""
    found = re.search(keyword + r": \w+ = (\w+)", cls.__init__.__doc__)
    assert found, (keyword, cls.__init__.__doc__)
    return found.group(1)


def test_defaults_are_the_cpp_ones():
    # HostTierOptions::linger and DiskTierOptions::linger: 1000 us.
    assert default_of(kvcache.HostTier, "linger_us") == "1000"
    assert default_of(kvcache.DiskTier, "linger_us") == "1000"
    # None: TierConfig's offload_batch (32) and offload_delay (1000 us).
    assert default_of(kvcache.PagedKVCacheManager, "offload_batch") == "None"
    assert default_of(kvcache.PagedKVCacheManager, "offload_delay_us") == "None"


def test_out_of_range_values_are_refused_by_name(tmp_path):
    p = params()
    tier = host(p)
    cases = [
        (dict(offload_batch=0), "offload_batch is 0: it must be in [1, 65536]"),
        (dict(offload_batch=65537), "offload_batch is 65537: it must be in [1, 65536]"),
        (dict(offload_batch=-1), "offload_batch is -1"),
        (dict(offload_batch="8"), "offload_batch"),
        (dict(offload_delay_us=1_000_001), "offload_delay is 1000001 us: it must be in [0, 1000000]"),
        (dict(offload_delay_us=-1), "offload_delay_us is -1"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(kvcache.InvalidArgument) as info:
            manager(p, [tier], **kwargs)
        assert needle in str(info.value), (needle, str(info.value))
    with pytest.raises(kvcache.InvalidArgument, match="offload_batch .*enable_prefix_caching"):
        kvcache.PagedKVCacheManager(params(prefix=False), 4, 64, total_num_pages=4,
                                    offload_batch=4)
    manager(p, [tier], offload_batch=65536, offload_delay_us=1_000_000)  # both limits in range

    tiers = [
        lambda us: host(p, linger_us=us),
        lambda us: kvcache.DiskTier(p, tmp_path / "tier", model_id="model", slab_bytes=1 << 20,
                                    linger_us=us),
    ]
    for make in tiers:
        with pytest.raises(kvcache.InvalidArgument,
                           match=re.escape("linger is 1000001 us: it must be in [0, 1000000]")):
            make(1_000_001)
        with pytest.raises(kvcache.InvalidArgument, match="linger_us is -1"):
            make(-1)
        for us in (0, 1_000_000):
            t = make(us)
            del t


@pytest.mark.parametrize("batch, delay_us, at_once", [
    (1, 1_000_000, True),
    (65536, 0, True),
    (65536, 1_000_000, False),
])
def test_write_backs_reach_the_tier_as_configured(batch, delay_us, at_once):
    """A 13-token prompt leaves 3 published pages in the 4-page pool; a 16-token fetch
    evicts them. The host tier is synchronous: a store handed over is held at once."""
    p = params()
    tier = host(p)
    m = manager(p, [tier], offload_batch=batch, offload_delay_us=delay_us)
    s, = m.claim(1)
    m.fetch([s], [13])
    m.step([s], [13], token_ids=list(range(7, 20)))
    m.release(s)
    assert tier.stats()["pages_held"] == 0
    other, = m.claim(1)
    m.fetch([other], [16])  # evicts the prompt's 3 pages
    assert tier.stats()["pages_held"] == (3 if at_once else 0)
    m.wait_tiers()
    assert tier.stats()["pages_held"] == 3, "wait_tiers hands over what is staged"
    m.check_invariants()
