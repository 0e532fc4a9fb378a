"""kvcache.store_kv / kvcache.attention from Python against a NumPy float64
oracle (and torch's scaled-dot-product attention where Debian's python3-torch
is installed): ragged batches with history, GQA, odd sizes, page boundaries and
interleaved (shuffled) page tables, all three dtypes, both strategies."""
import threading

import numpy as np
import pytest

import kvcache
from kv_helpers import attention_oracle, gather_kv, make_manager, offsets_of, random_rows

N_KV, N_Q, DIM, LAYERS = 2, 6, 12, 2


def grow(m, ids, lengths, rng):
    """Commits lengths[i] random tokens to ids[i] in small interleaved rounds so
    that paged sequences get interleaved, non-monotonic page tables."""
    remaining = dict(zip(ids, lengths))
    while any(remaining.values()):
        batch = [s for s in ids if remaining[s] > 0]
        rng.shuffle(batch)
        counts = [int(min(remaining[s], rng.integers(1, 4))) for s in batch]
        inputs = m.fetch(batch, counts)
        total = sum(counts)
        for layer in range(LAYERS):
            kvcache.store_kv(inputs, layer, random_rows(rng, total, N_KV, DIM),
                             random_rows(rng, total, N_KV, DIM), offsets_of(counts))
        m.step(batch, counts)
        for s, c in zip(batch, counts):
            remaining[s] -= c


def scenario(strategy, dtype, seed, page_layout="nhd"):
    """A ragged mixed batch (prefill + decode + nothing new) with history.
    Returns (inputs, q, row_offsets) with this step's K/V already stored."""
    rng = np.random.default_rng(seed)
    m = make_manager(strategy, dtype=dtype, n_kv_heads=N_KV, head_dim=DIM,
                     num_layers=LAYERS, page_size=3, max_batch=4, max_seq_len=40,
                     page_layout=page_layout)
    ids = m.claim(4)
    grow(m, ids, [7, 0, 13, 3], rng)
    counts = [1, 6, 0, 4]
    inputs = m.fetch(ids, counts)
    offsets = offsets_of(counts)
    total = int(offsets[-1])
    for layer in range(LAYERS):
        kvcache.store_kv(inputs, layer, random_rows(rng, total, N_KV, DIM),
                         random_rows(rng, total, N_KV, DIM), offsets)
    q = rng.standard_normal((total, N_Q, DIM)).astype(np.float32)
    return inputs, q, offsets


@pytest.mark.parametrize("page_layout", ["nhd", "hnd"])
@pytest.mark.parametrize("strategy", ["continuous", "paged"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_attention_matches_float64_oracle(strategy, dtype, page_layout):
    inputs, q, offsets = scenario(strategy, dtype, seed=sum(map(ord, strategy + dtype)),
                                  page_layout=page_layout)
    assert inputs.params.page_layout == page_layout
    assert list(inputs.cache_lengths) == [7, 0, 13, 3]
    if strategy == "paged":  # interleaved growth => some page table is not sorted
        table = inputs.lookup_table
        assert any(np.any(np.diff(row[row < table.max()]) != 1) for row in table)
    for layer in range(LAYERS):
        out = kvcache.attention(inputs, layer, q, offsets)
        assert out.shape == q.shape and out.dtype == np.float32
        # The oracle reads K/V back through the NumPy views (already rounded to
        # the cache dtype), so the only difference is f32 vs f64 arithmetic.
        ref = attention_oracle(inputs, layer, q, offsets)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=2e-5)


def test_attention_scale_and_out_argument():
    inputs, q, offsets = scenario("paged", "float32", seed=3)
    out = np.empty_like(q)
    returned = kvcache.attention(inputs, 1, q, offsets, out=out, scale=0.3)
    assert returned is out
    np.testing.assert_allclose(out, attention_oracle(inputs, 1, q, offsets, scale=0.3),
                               rtol=1e-4, atol=2e-5)


def test_store_kv_rounds_to_the_cache_dtype():
    m = make_manager("paged", dtype="bfloat16", n_kv_heads=N_KV, head_dim=DIM, num_layers=1,
                     page_size=3)
    inputs = m.fetch(m.claim(1), [5])
    rng = np.random.default_rng(5)
    k, v = random_rows(rng, 5, N_KV, DIM), random_rows(rng, 5, N_KV, DIM)
    kvcache.store_kv(inputs, 0, k, v, [0, 5])
    page, row = inputs.lookup_table[0, 4 // 3], 4 % 3
    np.testing.assert_array_equal(inputs.blocks[page, 0, 0, row], kvcache.float32_to_bf16(k[4]))
    np.testing.assert_array_equal(inputs.blocks[page, 1, 0, row], kvcache.float32_to_bf16(v[4]))


def test_kernels_run_concurrently_from_threads():
    """The kernels release the GIL; concurrent calls on distinct layers stay correct."""
    inputs, q, offsets = scenario("paged", "float32", seed=11)
    expected = [kvcache.attention(inputs, layer, q, offsets) for layer in range(LAYERS)]
    results = {}

    def work(layer):
        for _ in range(20):
            results[layer] = kvcache.attention(inputs, layer, q, offsets)

    threads = [threading.Thread(target=work, args=(layer,)) for layer in range(LAYERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for layer in range(LAYERS):
        np.testing.assert_array_equal(results[layer], expected[layer])


def torch_sdpa():
    """torch's scaled-dot-product attention, or skip with the reason."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        pytest.skip("python3-torch is not installed (apt-get install python3-torch)")
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
        return torch, F.scaled_dot_product_attention
    if hasattr(F, "_scaled_dot_product_attention"):  # Debian 12's torch 1.13
        return torch, lambda q, k, v, attn_mask: F._scaled_dot_product_attention(
            q, k, v, attn_mask)[0]
    pytest.skip(f"torch {torch.__version__} has no scaled_dot_product_attention")


@pytest.mark.parametrize("strategy", ["continuous", "paged"])
def test_attention_matches_torch_sdpa(strategy):
    torch, sdpa = torch_sdpa()
    from kv_helpers import gather_kv

    inputs, q, offsets = scenario(strategy, "float32", seed=21)
    layer = 1
    out = kvcache.attention(inputs, layer, q, offsets)
    for b in range(len(offsets) - 1):
        start, end = int(offsets[b]), int(offsets[b + 1])
        if start == end:
            continue
        history = int(inputs.cache_lengths[b])
        k, v = gather_kv(inputs, layer, b, history + end - start)  # [ctx, N_KV, DIM]
        group = N_Q // N_KV
        kt = torch.from_numpy(np.repeat(k, group, axis=1).transpose(1, 0, 2)[None]).float()
        vt = torch.from_numpy(np.repeat(v, group, axis=1).transpose(1, 0, 2)[None]).float()
        qt = torch.from_numpy(q[start:end].transpose(1, 0, 2)[None].copy())
        rows = np.arange(end - start)[:, None] + history
        cols = np.arange(k.shape[0])[None, :]
        mask = torch.from_numpy(np.where(cols <= rows, 0.0, -np.inf).astype(np.float32))
        expected = sdpa(qt, kt, vt, attn_mask=mask)[0].numpy().transpose(1, 0, 2)
        np.testing.assert_allclose(out[start:end], expected, rtol=1e-4, atol=2e-5)


def rope_numpy(x, positions, theta, rotary_dim):
    """NeoX RoPE of rows x [tokens, heads, dim] in float64: pair (i, i + half)
    of the first rotary_dim elements rotated by pos * theta^(-2i/rotary_dim)."""
    x = np.asarray(x, dtype=np.float64).copy()
    half = rotary_dim // 2
    inv = theta ** (-2.0 * np.arange(half) / rotary_dim)
    for t, pos in enumerate(positions):
        c, s = np.cos(pos * inv), np.sin(pos * inv)
        x0, x1 = x[t, :, :half].copy(), x[t, :, half:rotary_dim].copy()
        x[t, :, :half] = x0 * c - x1 * s
        x[t, :, half:rotary_dim] = x0 * s + x1 * c
    return x


@pytest.mark.parametrize("strategy", ["continuous", "paged"])
def test_store_kv_rotates_k_with_rope(strategy):
    """K goes in rotated at its position (history + row), V as given; rows of
    the other entry and past the new ones are untouched."""
    rng = np.random.default_rng(11)
    m = make_manager(strategy, n_kv_heads=N_KV, head_dim=DIM, num_layers=LAYERS, page_size=3)
    ids = m.claim(2)
    grow(m, ids, [5, 2], rng)  # history: positions continue at 5 and 2
    inputs = m.fetch(ids, [4, 3])
    history0, _ = gather_kv(inputs, 0, 0, 5)
    k, v = random_rows(rng, 7, N_KV, DIM), random_rows(rng, 7, N_KV, DIM)
    kvcache.store_kv(inputs, 0, k, v, [0, 4, 7], rope_theta=500.0, rotary_dim=8)
    k0, v0 = gather_kv(inputs, 0, 0, 9)
    k1, v1 = gather_kv(inputs, 0, 1, 5)
    np.testing.assert_allclose(k0[5:9], rope_numpy(k[0:4], range(5, 9), 500.0, 8),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(k1[2:5], rope_numpy(k[4:7], range(2, 5), 500.0, 8),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(v0[5:9], v[0:4])
    np.testing.assert_array_equal(v1[2:5], v[4:7])
    np.testing.assert_array_equal(k0[:5], history0)  # the history rows are as they were


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_store_kv_rope_table_writes_the_same_bits(dtype):
    rng = np.random.default_rng(12)
    k, v = random_rows(rng, 6, N_KV, DIM), random_rows(rng, 6, N_KV, DIM)
    table = kvcache.RopeTable(DIM, 4, theta=800.0, rotary_dim=DIM)  # positions 4, 5 past its end
    assert (table.theta, table.rotary_dim, table.max_positions) == (800.0, DIM, 4)
    assert table.memory_bytes == 4 * DIM * 4
    results = []
    for use_table in (False, True):
        m = make_manager("paged", dtype=dtype, n_kv_heads=N_KV, head_dim=DIM, num_layers=1,
                         page_size=4)
        inputs = m.fetch(m.claim(1), [6])
        kvcache.store_kv(inputs, 0, k, v, [0, 6], rope_theta=800.0,
                         rope_table=table if use_table else None)
        results.append(inputs.blocks.copy())
    np.testing.assert_array_equal(results[0], results[1])


def test_rope_table_holds_the_angles():
    table = kvcache.RopeTable(16, 40, theta=10000.0, rotary_dim=8)
    cs = table.cos_sin(37)
    assert cs.dtype == np.float32 and cs.shape == (8,)
    inv = 10000.0 ** (-2.0 * np.arange(4) / 8)
    np.testing.assert_allclose(cs[:4], np.cos(37 * inv), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(cs[4:], np.sin(37 * inv), rtol=1e-6, atol=1e-7)
    with pytest.raises(kvcache.InvalidArgument):
        table.cos_sin(40)


def test_store_kv_rope_errors_leave_the_cache_unchanged():
    m = make_manager("paged", n_kv_heads=N_KV, head_dim=DIM, num_layers=1, page_size=4)
    inputs = m.fetch(m.claim(1), [3])
    rng = np.random.default_rng(13)
    k, v = random_rows(rng, 3, N_KV, DIM), random_rows(rng, 3, N_KV, DIM)
    before = inputs.blocks.copy()
    other = kvcache.RopeTable(DIM, 8, theta=10000.0)
    with pytest.raises(kvcache.InvalidArgument, match="theta"):
        kvcache.store_kv(inputs, 0, k, v, [0, 3], rope_theta=500.0, rope_table=other)
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.store_kv(inputs, 0, k, v, [0, 3], rope_table=other)  # RoPE off
    with pytest.raises(kvcache.InvalidArgument, match="rotary_dim"):
        kvcache.store_kv(inputs, 0, k, v, [0, 3], rope_theta=500.0, rotary_dim=7)
    with pytest.raises(kvcache.InvalidArgument, match="rotary_dim"):
        kvcache.store_kv(inputs, 0, k, v, [0, 3], rotary_dim=4)  # without rope_theta
    np.testing.assert_array_equal(inputs.blocks, before)


@pytest.mark.parametrize("page_layout", ["nhd", "hnd"])
def test_thread_pool_and_prefetch_keep_the_results(page_layout):
    """A long decode (its context split across the pool's threads and merged)
    beside a prefill: every prefetch strategy, on 1 and 2 threads, matches the
    oracle; store_kv through a pool writes the same bits as without."""
    rng = np.random.default_rng(21)
    m = make_manager("paged", dtype="bfloat16", n_kv_heads=2, head_dim=64, num_layers=1,
                     page_size=16, max_batch=2, max_seq_len=2100, page_layout=page_layout)
    ids = m.claim(2)
    history = m.fetch(ids, [1999, 5])
    kvcache.store_kv(history, 0, random_rows(rng, 2004, 2, 64), random_rows(rng, 2004, 2, 64),
                     offsets_of([1999, 5]))
    m.step(ids, [1999, 5])
    counts = [1, 9]
    inputs = m.fetch(ids, counts)
    offsets = offsets_of(counts)
    k, v = random_rows(rng, 10, 2, 64), random_rows(rng, 10, 2, 64)
    before = inputs.blocks.copy()
    kvcache.store_kv(inputs, 0, k, v, offsets)
    plain = inputs.blocks.copy()
    inputs.blocks[...] = before
    pool = kvcache.ThreadPool(2)
    assert pool.num_threads == 2 and repr(pool) == "kvcache.ThreadPool(threads=2)"
    for prefetch in ("auto", "row-l1", "none"):
        kvcache.store_kv(inputs, 0, k, v, offsets, pool=pool, prefetch=prefetch)
        np.testing.assert_array_equal(inputs.blocks, plain)
    q = rng.standard_normal((10, 8, 64)).astype(np.float32)  # GQA 4
    ref = attention_oracle(inputs, 0, q, offsets)
    for threads in (None, pool, kvcache.ThreadPool(1)):
        for prefetch in ("auto", "step-l1", "tile-l1", "tile-l2", "none"):
            out = kvcache.attention(inputs, 0, q, offsets, pool=threads, prefetch=prefetch)
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=2e-5)


def test_bf16_precision_rounds_query_and_probabilities():
    """precision='bf16' on a bfloat16 cache matches an oracle that rounds
    q * scale and the probabilities to bf16 (within 2^-8 of max |V|: the
    kernel rounds against its running maximum), and differs from the fp32
    result by more than that bound allows the fp32 result to differ from its
    own oracle; a float32 cache ignores it."""
    rng = np.random.default_rng(33)
    m = make_manager("paged", dtype="bfloat16", n_kv_heads=2, head_dim=64, num_layers=1,
                     page_size=16, max_batch=2, max_seq_len=700)
    ids = m.claim(2)
    inputs = m.fetch(ids, [600, 7])
    offsets = offsets_of([600, 7])
    k, v = random_rows(rng, 607, 2, 64), random_rows(rng, 607, 2, 64)
    kvcache.store_kv(inputs, 0, k, v, offsets)
    q = (3 * rng.standard_normal((607, 8, 64))).astype(np.float32)  # GQA 4
    v_max = float(np.abs(kvcache.bf16_to_float32(inputs.blocks)).max())
    ref_bf16 = attention_oracle(inputs, 0, q, offsets, bf16_inputs=True)
    ref_fp32 = attention_oracle(inputs, 0, q, offsets)
    out = kvcache.attention(inputs, 0, q, offsets, precision="bf16")
    np.testing.assert_allclose(out, ref_bf16, rtol=1e-4, atol=2e-5 + v_max / 256)
    exact = kvcache.attention(inputs, 0, q, offsets)
    np.testing.assert_allclose(exact, ref_fp32, rtol=1e-4, atol=2e-5)
    assert np.abs(out - exact).max() > 1e-3  # the rounding shows
    with pytest.raises(kvcache.InvalidArgument, match="'f16'.*fp32, bf16"):
        kvcache.attention(inputs, 0, q, offsets, precision="f16")
    f32, q32, offsets32 = scenario("paged", "float32", seed=9)
    np.testing.assert_array_equal(kvcache.attention(f32, 0, q32, offsets32, precision="bf16"),
                                  kvcache.attention(f32, 0, q32, offsets32))


def test_kernel_keyword_errors_name_the_value():
    inputs, q, offsets = scenario("paged", "float32", seed=8)
    total = int(offsets[-1])
    rng = np.random.default_rng(8)
    k, v = random_rows(rng, total, N_KV, DIM), random_rows(rng, total, N_KV, DIM)
    before = inputs.blocks.copy()
    with pytest.raises(kvcache.InvalidArgument, match="'l3'.*auto, step-l1, tile-l1, tile-l2, none"):
        kvcache.attention(inputs, 0, q, offsets, prefetch="l3")
    with pytest.raises(kvcache.InvalidArgument, match="'step-l1'.*auto, row-l1, none"):
        kvcache.store_kv(inputs, 0, k, v, offsets, prefetch="step-l1")
    with pytest.raises(kvcache.InvalidArgument, match="prefetch is 3"):
        kvcache.attention(inputs, 0, q, offsets, prefetch=3)
    with pytest.raises(kvcache.InvalidArgument, match="prefetch is None"):
        kvcache.store_kv(inputs, 0, k, v, offsets, prefetch=None)
    with pytest.raises(kvcache.InvalidArgument, match="pool is 2"):
        kvcache.attention(inputs, 0, q, offsets, pool=2)
    with pytest.raises(kvcache.InvalidArgument, match="pool is 'x'"):
        kvcache.store_kv(inputs, 0, k, v, offsets, pool="x")
    with pytest.raises(kvcache.InvalidArgument, match="rope_theta is 'big'"):
        kvcache.store_kv(inputs, 0, k, v, offsets, rope_theta="big")
    with pytest.raises(kvcache.InvalidArgument, match="rope_theta is True"):
        kvcache.store_kv(inputs, 0, k, v, offsets, rope_theta=True)
    with pytest.raises(kvcache.InvalidArgument, match="scale is None"):
        kvcache.attention(inputs, 0, q, offsets, scale=None)
    with pytest.raises(kvcache.InvalidArgument, match="threads is -2"):
        kvcache.ThreadPool(-2)
    np.testing.assert_array_equal(inputs.blocks, before)
    # NumPy scalars are numbers.
    out = kvcache.attention(inputs, 0, q, offsets, scale=np.float32(0.25))
    np.testing.assert_allclose(out, attention_oracle(inputs, 0, q, offsets, scale=0.25),
                               rtol=1e-4, atol=2e-5)
