"""Helpers shared by the kvcache Python tests: managers and a float64 oracle."""
import numpy as np

import kvcache


def make_manager(strategy, dtype="float32", n_kv_heads=2, head_dim=8, num_layers=2,
                 page_size=4, max_batch=4, max_seq_len=64, page_layout="nhd", **kwargs):
    """A small manager of either kind."""
    params = kvcache.KVCacheParams(dtype=dtype, n_kv_heads=n_kv_heads, head_dim=head_dim,
                                   cache_strategy=strategy,
                                   page_size=page_size if strategy == "paged" else None,
                                   page_layout=page_layout)
    if strategy == "paged":
        return kvcache.PagedKVCacheManager(params, max_batch, max_seq_len, num_layers, **kwargs)
    return kvcache.ContinuousBatchingKVCacheManager(params, max_batch, max_seq_len, num_layers)


def as_float64(blocks):
    """The cache blocks as float64 (bf16 caches hold uint16 bits)."""
    if blocks.dtype == np.uint16:
        return kvcache.bf16_to_float32(blocks).astype(np.float64)
    return blocks.astype(np.float64)


def gather_kv(inputs, layer, b, length):
    """K and V of tokens [0, length) of batch entry b, read through the NumPy views:
    two float64 arrays [length, n_kv_heads, head_dim]."""
    blocks = as_float64(inputs.blocks)
    hnd = inputs.params.page_layout == "hnd"  # blocks [.., heads, tokens, dim]
    page_tokens = blocks.shape[4] if hnd else blocks.shape[3]
    lookup = inputs.lookup_table
    rows_k, rows_v = [], []
    for t in range(length):
        block = lookup[b] if lookup.ndim == 1 else lookup[b, t // page_tokens]
        row = t % page_tokens if lookup.ndim == 2 else t
        if hnd:
            rows_k.append(blocks[block, 0, layer, :, row])
            rows_v.append(blocks[block, 1, layer, :, row])
        else:
            rows_k.append(blocks[block, 0, layer, row])
            rows_v.append(blocks[block, 1, layer, row])
    return np.array(rows_k), np.array(rows_v)


def round_to_bf16(x):
    """float32 values rounded to the nearest bf16 (ties to even), as float64."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def attention_oracle(inputs, layer, q, row_offsets, scale=None, bf16_inputs=False):
    """Causal GQA attention in float64 over what the views hold. bf16_inputs:
    AttentionPrecision::bf16 (q * scale and exp(score - max) rounded to bf16
    before they meet K and V; the denominator sums the unrounded ones)."""
    q = np.asarray(q, dtype=np.float64)
    n_q_heads, head_dim = q.shape[1], q.shape[2]
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    if bf16_inputs:
        q = round_to_bf16(np.float32(q) * np.float32(scale))
        scale = 1.0
    out = np.zeros_like(q)
    for b in range(len(row_offsets) - 1):
        start, end = row_offsets[b], row_offsets[b + 1]
        history = int(inputs.cache_lengths[b])
        k, v = gather_kv(inputs, layer, b, history + end - start)
        group = n_q_heads // k.shape[1]
        for r in range(start, end):
            context = history + (r - start) + 1
            for h in range(n_q_heads):
                scores = k[:context, h // group] @ q[r, h] * scale
                p = np.exp(scores - scores.max())
                weights = round_to_bf16(p) if bf16_inputs else p
                out[r, h] = (weights / p.sum()) @ v[:context, h // group]
    return out


def random_rows(rng, tokens, heads, head_dim):
    """Random float32 rows (never zeros)."""
    return rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)


def offsets_of(counts):
    """Row offsets of a ragged batch with counts[b] new tokens per entry."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
