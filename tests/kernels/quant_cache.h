// Test helper: a self-owned 8-bit (or any dtype) cache with real history,
// and the references run on it; shared by the CPU 8-bit kernel tests
// (quant_attention_test.cpp) and the CUDA ones (tests/cuda/quantized_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kernel_test_util.h"
#include "kvcache/cache_desc.h"
#include "kvcache/collection.h"
#include "kvcache/kernels/reference.h"

namespace kvcache::test {

// A self-owned 2-layer cache of any dtype (layer 1 used), shuffled blocks,
// with the history (positions < cache_length) written by the view's
// store_row from random floats, so the codes (and int8 scales) are real.
// With `spread` > 0 each (token, head) row is scaled by 10^u, u uniform in
// [-spread, 0], and every 11th row is zero (int8 scale 0).
struct Cache {
  std::vector<std::uint8_t> bytes;
  std::vector<float> head_scales;  // fp8: [2 layers][2][n_kv]
  std::vector<std::uint32_t> cache_lengths, lookup, reserved, row_offsets{0};
  CacheDesc desc;

  Cache(DType dtype, const std::vector<Entry>& entries, bool paged, std::uint32_t page,
        std::uint32_t n_kv, std::uint32_t dim, PageLayout layout, PoolArrangement arrangement,
        std::mt19937& rng, float scale_base = 1.0f, float spread = 0.0f) {
    std::uint32_t max_ctx = 0, max_new = 0, num_blocks = 0;
    for (const Entry& e : entries) {
      cache_lengths.push_back(e.cache_length);
      reserved.push_back(e.cache_length + e.new_tokens);
      row_offsets.push_back(row_offsets.back() + e.new_tokens);
      max_ctx = std::max(max_ctx, e.cache_length + e.new_tokens);
      max_new = std::max(max_new, e.new_tokens);
      num_blocks += paged ? (e.cache_length + e.new_tokens + page - 1) / page : 1;
    }
    const std::uint32_t tokens = paged ? page : max_ctx + 3;
    const std::uint32_t stride = paged ? (max_ctx + page - 1) / page + 1 : 1;
    num_blocks += 3;
    std::vector<std::uint32_t> ids(num_blocks);
    for (std::uint32_t i = 0; i < num_blocks; ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    lookup.assign(entries.size() * stride, num_blocks);
    std::size_t next = 0;
    for (std::size_t b = 0; b < entries.size(); ++b) {
      const std::uint32_t need =
          paged ? (entries[b].cache_length + entries[b].new_tokens + page - 1) / page : 1;
      for (std::uint32_t j = 0; j < need; ++j) lookup[b * stride + j] = ids[next++];
    }
    desc.dtype = dtype;
    desc.cache_lengths = cache_lengths.data();
    desc.reserved_lengths = reserved.data();
    desc.lookup_table = lookup.data();
    desc.lookup_stride = stride;
    desc.batch_size = static_cast<std::uint32_t>(entries.size());
    desc.max_seq_length = max_new;
    desc.max_cache_length = *std::max_element(cache_lengths.begin(), cache_lengths.end());
    desc.max_full_context_length = max_ctx;
    desc.num_layers = 2;
    desc.page_size = tokens;
    desc.n_kv_heads = n_kv;
    desc.head_dim = dim;
    desc.num_blocks = num_blocks;
    desc.layout = layout;
    desc.arrangement = arrangement;
    desc = desc.with_strides();
    bytes.resize(desc.pool_elements() * dtype_size(dtype) + 64);
    // Garbage everywhere first: kernels must read only what is stored.
    for (auto& x : bytes) x = static_cast<std::uint8_t>(rng());
    desc.blocks = bytes.data();
    if (is_fp8(dtype)) {
      std::uniform_real_distribution<float> s(0.5f, 2.0f);
      head_scales.resize(4 * n_kv);
      for (auto& x : head_scales) x = scale_base * s(rng);
      desc.head_scales = head_scales.data();
    }
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::uniform_real_distribution<float> exponent(-spread, 0.0f);
    std::vector<float> row(dim);
    std::uint32_t row_count = 0;
    visit_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      const PagedKVCacheCollection<T> col(desc);
      for (std::uint32_t kv = 0; kv < 2; ++kv) {
        const auto view = kv == 0 ? col.get_key_cache(1) : col.get_value_cache(1);
        for (std::uint32_t b = 0; b < desc.batch_size; ++b)
          for (std::uint32_t t = 0; t < cache_lengths[b]; ++t)
            for (std::uint32_t h = 0; h < n_kv; ++h) {
              const float mag =
                  ++row_count % 11 == 0 && spread > 0.0f ? 0.0f : std::pow(10.0f, exponent(rng));
              for (auto& x : row) x = mag * dist(rng);
              view.store_row(b, h, t, row);
            }
      }
    });
  }
  Cache(const Cache& o)
      : bytes(o.bytes),
        head_scales(o.head_scales),
        cache_lengths(o.cache_lengths),
        lookup(o.lookup),
        reserved(o.reserved),
        row_offsets(o.row_offsets),
        desc(o.desc) {
    desc.blocks = bytes.data();
    desc.head_scales = head_scales.empty() ? nullptr : head_scales.data();
    desc.cache_lengths = cache_lengths.data();
    desc.reserved_lengths = reserved.data();
    desc.lookup_table = lookup.data();
  }
  CacheDesc k() const { return desc.layer(1, 0); }
  CacheDesc v() const { return desc.layer(1, 1); }
  std::uint32_t rows() const { return row_offsets.back(); }
};

inline void reference_store(const Cache& c, std::span<const float> k, std::span<const float> v) {
  visit_dtype(c.desc.dtype, [&](auto tag) {
    using T = decltype(tag);
    store_kv_reference(PagedKVCache<T>(c.k()), PagedKVCache<T>(c.v()), k, v,
                       std::span<const std::uint32_t>(c.row_offsets));
  });
}

inline void reference_attention(const Cache& c, std::span<const float> q, std::uint32_t n_q,
                                std::span<float> out) {
  visit_dtype(c.desc.dtype, [&](auto tag) {
    using T = decltype(tag);
    attention_reference(PagedKVCache<T>(c.k()), PagedKVCache<T>(c.v()), q, n_q,
                        std::span<const std::uint32_t>(c.row_offsets), out);
  });
}

}  // namespace kvcache::test
