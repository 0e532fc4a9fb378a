"""kvcache.store_kv / kvcache.attention from Python against a NumPy float64
oracle (and torch's scaled-dot-product attention where Debian's python3-torch
is installed): ragged batches with history, GQA, odd sizes, page boundaries and
interleaved (shuffled) page tables, all three dtypes, both strategies."""
import threading

import numpy as np
import pytest

import kvcache
from kv_helpers import attention_oracle, make_manager, offsets_of, random_rows

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
