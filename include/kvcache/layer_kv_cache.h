// kvcache/layer_kv_cache.h — ferrum-style per-layer, per-sequence facade.
//
// ferrum's `KvCache` describes ONE sequence's cache for ONE layer: buffers `k`
// and `v`, `len`, `capacity`, `num_kv_heads`, `head_dim`, and for the paged
// layout `block_size` (> 0) plus `block_table` (logical -> physical block),
// `context_lens` and `paged_block_indices`. `LayerKvCache<T>` is that shape
// as a thin, trivially copyable view over a collection: no memory of its
// own, nothing copied.
//
//   block_size == 0  contiguous: the sequence's slot of `capacity` (=
//                    max_seq_len) tokens; token t of head h is at
//                    k + t * token_stride() + h * head_stride().
//                    context_lens and block_table are empty (ferrum: None).
//   block_size  > 0  paged: token t lives in block block_table[t / block_size]
//                    at row t % block_size; blocks are block_stride apart.
//                    capacity is the room the fetch reserved for the entry
//                    (what a kernel may write), at most the blocks it holds.
// ferrum's exact buffers come with PageLayout::hnd and
// PoolArrangement::per_layer (params.h): contiguous k / v are
// [num_kv_heads][capacity][head_dim], paged ones
// [num_blocks][num_kv_heads][block_size][head_dim] (block_stride =
// num_kv_heads * block_size * head_dim), so ferrum-style indexing
// `k + blk * H * bs * D + h * bs * D + t * D` reads the right element. With
// other layouts and arrangements the strides differ: use k_at / v_at, which
// work for every strategy, layout and arrangement.
//
// Lifetime and thread-safety are those of the collection it came from (see
// kv_cache.h). make_layer_kv_cache throws InvalidArgument for a bad layer or
// batch index.
#pragma once

#include <algorithm>
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
  std::uint32_t capacity = 0;  // contiguous: the slot's tokens; paged: the reserved room
  std::uint32_t num_kv_heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t block_size = 0;                // 0 => contiguous
  std::span<const std::uint32_t> block_table;  // paged: physical block per logical block
  std::span<const std::uint32_t>
      context_lens;  // paged: [1] the committed length; contiguous: empty
  // Paged: host-side mirror of the physical block ids this cache owns (the
  // same ids as block_table: our page tables live in host memory); empty
  // when contiguous.
  std::span<const std::uint32_t> paged_block_indices;
  std::size_t block_stride = 0;  // elements between physical blocks (paged)
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

// ferrum's name for it.
template <CacheElement T>
using KvCache = LayerKvCache<T>;

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
  out.layout = d.layout;
  if constexpr (Collection::CacheT::is_paged) {
    const std::uint32_t* row = d.lookup_table + std::size_t{b} * d.lookup_stride;
    std::uint32_t blocks = 0;
    while (blocks < d.lookup_stride && row[blocks] < c.desc().num_blocks) ++blocks;
    out.k = kc.blocks();
    out.v = vc.blocks();
    out.block_size = d.page_size;
    out.block_table = std::span<const std::uint32_t>(row, blocks);
    out.paged_block_indices = out.block_table;
    out.context_lens = std::span<const std::uint32_t>(d.cache_lengths + b, 1);
    out.block_stride = d.block_stride;
    out.capacity = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(std::uint64_t{blocks} * d.page_size, kc.reserved_length(b)));
  } else {
    out.k = kc.page_ptr(b, 0);
    out.v = vc.page_ptr(b, 0);
    out.capacity = d.page_size;
  }
  return out;
}

}  // namespace kvcache
