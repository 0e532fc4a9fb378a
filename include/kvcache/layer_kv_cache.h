// kvcache/layer_kv_cache.h — ferrum-style per-layer, per-sequence facade.
//
// ferrum's `KvCache` describes ONE sequence's cache for ONE layer: buffers `k`
// and `v`, `len`, `capacity`, `num_kv_heads`, `head_dim`, and for the paged
// layout `block_size` (> 0) plus `block_table` (logical -> physical block)
// and `context_lens`. `LayerKvCache<T>` is that shape as a thin, trivially
// copyable view over a collection: no memory of its own, nothing copied.
//
//   block_size == 0  contiguous: the sequence's slot; token t of head h is at
//                    k + t * token_stride() + h * head_stride().
//   block_size  > 0  paged: token t lives in block block_table[t / block_size]
//                    at row t % block_size; blocks are block_stride apart.
// `layout` is the cache's PageLayout (NHD: heads inside a token; HND: tokens
// inside a head, per block). Use k_at / v_at rather than raw offsets, so code
// works for every strategy and layout.
//
// Lifetime and thread-safety are those of the collection it came from (see
// kv_cache.h). make_layer_kv_cache throws InvalidArgument for a bad layer or
// batch index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvcache/collection.h"
#include "kvcache/error.h"

namespace kvcache {

template <CacheElement T>
struct LayerKvCache {
  T* k = nullptr;              // block 0 (paged) or the slot (contiguous) of this layer's K
  T* v = nullptr;              // same for V
  std::uint32_t len = 0;       // committed tokens (cache_length)
  std::uint32_t capacity = 0;  // tokens the current blocks can hold
  std::uint32_t num_kv_heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t block_size = 0;                 // 0 => contiguous
  std::span<const std::uint32_t> block_table;   // paged: physical block per logical block
  std::span<const std::uint32_t> context_lens;  // [1]: the committed length, as the kernel reads it
  std::size_t block_stride = 0;                 // elements between physical blocks (paged)
  PageLayout layout = PageLayout::nhd;

  bool is_paged() const { return block_size != 0; }
  // Elements between consecutive tokens of one head inside a block / slot.
  std::size_t token_stride() const {
    return layout == PageLayout::hnd ? std::size_t{head_dim} : std::size_t{num_kv_heads} * head_dim;
  }
  // Elements between consecutive heads of one token inside a block / slot.
  std::size_t head_stride() const {
    if (layout == PageLayout::nhd) return head_dim;
    return std::size_t{is_paged() ? block_size : capacity} * head_dim;
  }

  // Start of (token pos, head) in K / V.
  T* k_at(std::uint32_t pos, std::uint32_t head) const { return at(k, pos, head); }
  T* v_at(std::uint32_t pos, std::uint32_t head) const { return at(v, pos, head); }

 private:
  T* at(T* base, std::uint32_t pos, std::uint32_t head) const {
    const std::size_t head_offset = std::size_t{head} * head_stride();
    if (!is_paged()) return base + pos * token_stride() + head_offset;
    return base + std::size_t{block_table[pos / block_size]} * block_stride +
           (pos % block_size) * token_stride() + head_offset;
  }
};

// The ferrum-style view of batch entry `b`, layer `layer` of a collection.
template <class Collection>
auto make_layer_kv_cache(const Collection& c, std::uint32_t layer, std::uint32_t b) {
  using T = typename Collection::element_type;
  if (b >= c.batch_size()) {
    throw InvalidArgument("batch index " + std::to_string(b) + " is out of range: the batch has " +
                          std::to_string(c.batch_size()) + " entries");
  }
  const auto kc = c.get_key_cache(layer);  // validates layer
  const auto vc = c.get_value_cache(layer);
  const auto& d = kc.desc();
  LayerKvCache<T> out;
  out.len = kc.cache_length(b);
  out.num_kv_heads = kc.n_kv_heads();
  out.head_dim = kc.head_dim();
  out.context_lens = std::span<const std::uint32_t>(d.cache_lengths + b, 1);
  out.layout = d.layout;
  if constexpr (Collection::CacheT::is_paged) {
    const std::uint32_t* row = d.lookup_table + std::size_t{b} * d.lookup_stride;
    std::uint32_t blocks = 0;
    while (blocks < d.lookup_stride && row[blocks] < c.desc().num_blocks) ++blocks;
    out.k = d.blocks;
    out.v = vc.desc().blocks;
    out.block_size = d.block_tokens;
    out.block_table = std::span<const std::uint32_t>(row, blocks);
    out.block_stride = d.block_stride;
    out.capacity = blocks * d.block_tokens;
  } else {
    out.k = kc.page_ptr(b, 0);
    out.v = vc.page_ptr(b, 0);
    out.capacity = d.block_tokens;
  }
  return out;
}

}  // namespace kvcache
