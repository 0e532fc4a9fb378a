"""Tiers below a manager of several devices through the Python binding
(docs/tiers.md "Several devices"): HostTier / DiskTier(device_index=d), the
manager's first_shard= / shard_count=, the figures' device. A 2-device
manager with a host tier per device writes every device's random K/V back and
loads it again byte for byte; a tier opened for the wrong device is refused
naming it; a rank manager (n_devices 1, shard 1 of 2) loads device 1's bytes
from the group's tier and from a disk directory the group wrote."""
import numpy as np
import pytest

import kvcache

PAGE = 4
LAYERS = 2
HEADS = 4  # over every device
DIM = 4
DEVICES = 2
A = list(range(7, 20))  # 13 tokens: 3 full pages


def params(n_devices=DEVICES, heads=HEADS):
    return kvcache.KVCacheParams(dtype="float32", n_kv_heads=heads, head_dim=DIM,
                                 num_layers=LAYERS, cache_strategy="paged", page_size=PAGE,
                                 enable_prefix_caching=True, n_devices=n_devices)


def rank_params():
    return params(n_devices=1, heads=HEADS // DEVICES)


def host(p, device_index=0, **kwargs):
    return kvcache.HostTier(p, capacity_pages=64, model_id="model", synchronous=True,
                            device_index=device_index, **kwargs)


def disk(p, path, device_index=0, **kwargs):
    return kvcache.DiskTier(p, path, model_id="model", slab_bytes=1 << 20, io="threads",
                            direct_io=False, durable=False, device_index=device_index, **kwargs)


def manager(p, tiers, **kwargs):
    return kvcache.PagedKVCacheManager(p, 4, 64, total_num_pages=4, tiers=tiers, **kwargs)


def prefill(m, seq, tokens, rng):
    """Stores random K/V for every token of a fresh seq on every device and commits them;
    returns [device][layer] -> (k, v), each [tokens, heads of a device, dim]."""
    n = len(tokens)
    inputs = m.fetch([seq], [n])
    rows = np.array([0, n], np.uint32)
    heads = m.params.n_kv_heads // m.params.n_devices
    written = []
    for d in range(m.params.n_devices):
        per_layer = []
        for layer in range(LAYERS):
            k = rng.standard_normal((n, heads, DIM), dtype=np.float32)
            v = rng.standard_normal((n, heads, DIM), dtype=np.float32)
            kvcache.store_kv(inputs, layer, k, v, rows, device=d)
            per_layer.append((k, v))
        written.append(per_layer)
    m.step([seq], [n], token_ids=list(tokens))
    return written


def write_and_evict(m, rng):
    """Writes A, releases it, fills the 4-page pool with another request so A's pages
    are evicted and written back to every device's tier."""
    s, = m.claim(1)
    written = prefill(m, s, A, rng)
    m.release(s)
    other, = m.claim(1)
    prefill(m, other, list(range(1000, 1016)), rng)
    m.release(other)
    m.wait_tiers()
    m.check_invariants()
    return written


def expect_loaded(m, written):
    """Matches A on a fresh seq (12 tokens from the tiers), waits for the loads, and
    expects every device to hold, bit for bit, what `written` says of it."""
    c, = m.claim(1)
    assert m.match_prefix(c, A) == 12
    m.wait_loads(c)
    inputs = m.fetch([c], [1])
    for d, per_layer in enumerate(written):
        blocks, _, lookup, _ = inputs.device(d)
        for layer, (k, v) in enumerate(per_layer):
            for t in range(12):
                page = int(lookup[0, t // PAGE])
                assert blocks[page, 0, layer, t % PAGE].tobytes() == k[t].tobytes(), (d, t)
                assert blocks[page, 1, layer, t % PAGE].tobytes() == v[t].tobytes(), (d, t)


def test_two_devices_write_back_and_reload_every_devices_bytes():
    p = params()
    tiers = [host(p, 0), host(p, 1)]
    assert [t.device_index for t in tiers] == [0, 1]
    assert [t.device_count for t in tiers] == [2, 2]
    m = manager(p, tiers)
    written = write_and_evict(m, np.random.default_rng(43))
    assert written[0][0][0].tobytes() != written[1][0][0].tobytes()
    expect_loaded(m, written)
    figures = m.stats()["tiers"]
    assert [f["device"] for f in figures] == [0, 1]
    assert [f["name"] for f in figures] == ["host", "host"]
    assert [f["pages_offloaded"] for f in figures] == [3, 3]
    assert [f["pages_onboarded"] for f in figures] == [3, 3]
    m.check_invariants()


def test_a_tier_of_the_wrong_device_is_refused_naming_it(tmp_path):
    p = params()
    h0, h1 = host(p, 0), host(p, 1)
    with pytest.raises(kvcache.InvalidArgument, match=r"tiers\[0\].*device 0.*device_index is 1"):
        manager(p, [h1, h0])
    with pytest.raises(kvcache.InvalidArgument, match="1 given for 2 devices"):
        manager(p, [h0])
    with pytest.raises(kvcache.InvalidArgument, match="device_index 2 .*2 devices"):
        host(p, 2)
    with pytest.raises(kvcache.InvalidArgument, match="device_index 5 .*2 devices"):
        disk(p, tmp_path, 5)
    with pytest.raises(kvcache.InvalidArgument, match="first_shard is 1 .*shard_count is 0"):
        host(p, 0, first_shard=1)
    with pytest.raises(kvcache.InvalidArgument, match=r"shards \[1, 3\) .*shard_count 2"):
        host(p, 0, first_shard=1, shard_count=2)
    with pytest.raises(kvcache.InvalidArgument, match=r"device_index is -1: must be in \[0, "):
        host(p, -1)
    no_prefix = kvcache.KVCacheParams(dtype="float32", n_kv_heads=HEADS, head_dim=DIM,
                                      num_layers=LAYERS, cache_strategy="paged", page_size=PAGE)
    with pytest.raises(kvcache.InvalidArgument, match="shard_count need"):
        kvcache.PagedKVCacheManager(no_prefix, 4, 64, total_num_pages=4, shard_count=2)


def test_a_rank_loads_device_ones_bytes_from_the_groups_tier():
    p = params()
    h0, h1 = host(p, 0), host(p, 1)
    group = manager(p, [h0, h1])
    written = write_and_evict(group, np.random.default_rng(7))
    del group
    r = rank_params()
    rank = manager(r, [h1], first_shard=1, shard_count=2)
    expect_loaded(rank, [written[1]])
    assert [f["device"] for f in rank.stats()["tiers"]] == [0]
    with pytest.raises(kvcache.InvalidArgument, match="device_index is 1 but this manager's is 0"):
        manager(r, [h1], shard_count=2)
    with pytest.raises(kvcache.InvalidArgument, match=r"shards \[2, 3\) .*shard_count 2"):
        manager(r, [h1], first_shard=2, shard_count=2)


def test_a_rank_opens_the_disk_directory_the_group_wrote_for_its_shard(tmp_path):
    p = params()
    d0, d1 = disk(p, tmp_path / "shard-0", 0), disk(p, tmp_path / "shard-1", 1)
    group = manager(p, [d0, d1])
    written = write_and_evict(group, np.random.default_rng(11))
    del group, d0, d1  # the group's tiers close
    r = rank_params()
    t = disk(r, tmp_path / "shard-1", 0, first_shard=1, shard_count=2)
    assert (t.device_index, t.device_count) == (1, 2)
    assert not t.recovery["fresh"]
    assert t.recovery["pages"] == 3
    expect_loaded(manager(r, [t], first_shard=1, shard_count=2), [written[1]])


def test_pool_apart_lists_each_evicted_page_once_per_device():
    p = params()
    m = manager(p, [host(p, 0), host(p, 1)], pool_apart=True)
    s, = m.claim(1)
    m.fetch([s], [13])
    m.step([s], [13], token_ids=A)  # 3 full pages published
    m.release(s)
    other, = m.claim(1)
    inputs = m.fetch([other], [16])  # the pool's 4 pages: A's 3 are evicted
    offloads = inputs.block_offloads
    pages = {page for page, _, _ in offloads}
    assert len(pages) == 3
    assert sorted((page, device) for page, _, device in offloads) == sorted(
        (page, d) for page in pages for d in range(DEVICES)), "each page once per device"
    assert len(offloads) == 3 * DEVICES
    for _, slot, _ in offloads:
        slot[...] = 7  # the caller's bytes (what a GPU copy would write)
    assert m.complete_offloads(inputs) == 3
