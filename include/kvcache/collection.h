// kvcache/collection.h — a batch's view of the whole cache (all layers).
//
// `PagedKVCacheCollection<T>` and `ContinuousBatchingKVCacheCollection<T>`
// are MAX's KVCollectionT types: non-owning, trivially copyable, they borrow
// the manager's blocks and a KVCacheBatch's cache_lengths / lookup_table, and
// hand out per-layer views with get_key_cache(layer) / get_value_cache(layer).
//
// Build them from a KVCacheBatch (`batch.paged<T>()`, `batch.continuous<T>()`)
// or, for memory you manage yourself, from a `CollectionDesc` — that
// constructor validates everything (non-null buffers, lookup entries within
// num_blocks or the sentinel, committed tokens backed by real blocks, lengths
// within the table) and throws InvalidArgument naming the bad value.
// get_key_cache / get_value_cache throw InvalidArgument for layer >= num_layers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kvcache/error.h"
#include "kvcache/kv_cache.h"

namespace kvcache {

// Everything a collection needs, as plain data.
//   blocks:           start of the whole buffer (one device), arranged as
//                     `arrangement` says (params.h): interleaved
//                     [num_blocks][2][num_layers][block] or per_layer
//                     [num_layers][2][num_blocks][block], a block being
//                     [block_tokens][n_kv_heads][head_dim] (NHD) or
//                     [n_kv_heads][block_tokens][head_dim] (HND)
//   lookup_table:     [batch_size][lookup_stride] block ids; unused entries hold
//                     the sentinel value num_blocks (paged). Continuous: stride 1.
//   reserved_lengths: [batch_size] rows the kernels may touch per entry
//                     (what fetch reserved), or nullptr: what the entry's
//                     table row holds before its first sentinel.
template <CacheElement T>
struct CollectionDesc {
  T* blocks = nullptr;
  const std::uint32_t* cache_lengths = nullptr;
  const std::uint32_t* lookup_table = nullptr;
  const std::uint32_t* reserved_lengths = nullptr;
  std::uint32_t lookup_stride = 0;
  std::uint32_t batch_size = 0;
  std::uint32_t max_seq_length = 0;           // max new tokens (MAX max_seq_length)
  std::uint32_t max_cache_length = 0;         // max history, MAX's max_cache_length
  std::uint32_t max_full_context_length = 0;  // max history + new tokens
  std::uint32_t num_layers = 0;
  std::uint32_t block_tokens = 0;  // page_size (paged) / max_seq_len (continuous)
  std::uint32_t n_kv_heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t num_blocks = 0;         // pages in the pool / slots
  PageLayout layout = PageLayout::nhd;  // order of tokens and heads inside a block
  PoolArrangement arrangement = PoolArrangement::interleaved;
};

namespace detail {
// Throws InvalidArgument naming the first bad field (see the file comment).
void validate_collection_desc(const CollectionDesc<float>& d);

template <CacheElement U, CacheElement T>
CollectionDesc<U> retype(const CollectionDesc<T>& d) {
  CollectionDesc<U> u{};
  u.blocks = reinterpret_cast<U*>(d.blocks);
  u.cache_lengths = d.cache_lengths;
  u.lookup_table = d.lookup_table;
  u.reserved_lengths = d.reserved_lengths;
  u.lookup_stride = d.lookup_stride;
  u.batch_size = d.batch_size;
  u.max_seq_length = d.max_seq_length;
  u.max_cache_length = d.max_cache_length;
  u.max_full_context_length = d.max_full_context_length;
  u.num_layers = d.num_layers;
  u.block_tokens = d.block_tokens;
  u.n_kv_heads = d.n_kv_heads;
  u.head_dim = d.head_dim;
  u.num_blocks = d.num_blocks;
  u.layout = d.layout;
  u.arrangement = d.arrangement;
  return u;
}
}  // namespace detail

// Elements of one layer's K (or V) of one block.
template <CacheElement T>
constexpr std::size_t layer_block_elements(const CollectionDesc<T>& d) {
  return std::size_t{d.block_tokens} * d.n_kv_heads * d.head_dim;
}

// Elements from the start of the pool to block 0 of layer `layer`'s K (kv 0)
// or V (kv 1), and between consecutive blocks of that layer.
template <CacheElement T>
constexpr std::size_t layer_base_offset(const CollectionDesc<T>& d, std::uint32_t layer,
                                        std::uint32_t kv) {
  const std::size_t e = layer_block_elements(d);
  return d.arrangement == PoolArrangement::per_layer
             ? (std::size_t{layer} * 2 + kv) * d.num_blocks * e
             : (std::size_t{kv} * d.num_layers + layer) * e;
}
template <CacheElement T>
constexpr std::size_t layer_block_stride(const CollectionDesc<T>& d) {
  const std::size_t e = layer_block_elements(d);
  return d.arrangement == PoolArrangement::per_layer ? e : 2 * std::size_t{d.num_layers} * e;
}

// One layer's K (kv 0) or V (kv 1) of a collection: what get_key_cache /
// get_value_cache view, by pointer arithmetic only (the pointers may be
// device memory: kvcache/cuda/device_collection.h uses it too). Throws
// InvalidArgument for layer >= d.num_layers.
template <CacheElement T>
LayerCacheDesc<T> layer_cache_desc(const CollectionDesc<T>& d, std::uint32_t layer,
                                   std::uint32_t kv) {
  if (layer >= d.num_layers) {
    throw InvalidArgument("layer " + std::to_string(layer) + " is out of range: the cache has " +
                          std::to_string(d.num_layers) + " layers");
  }
  LayerCacheDesc<T> l;
  l.blocks = d.blocks + layer_base_offset(d, layer, kv);
  l.cache_lengths = d.cache_lengths;
  l.reserved_lengths = d.reserved_lengths;
  l.lookup_table = d.lookup_table;
  l.lookup_stride = d.lookup_stride;
  l.batch_size = d.batch_size;
  l.max_seq_length = d.max_seq_length;
  l.max_cache_length = d.max_cache_length;
  l.max_full_context_length = d.max_full_context_length;
  l.block_tokens = d.block_tokens;
  l.n_kv_heads = d.n_kv_heads;
  l.head_dim = d.head_dim;
  l.num_blocks = d.num_blocks;
  l.block_stride = layer_block_stride(d);
  l.layout = d.layout;
  return l;
}

template <CacheElement T, class CacheType>
class KVCacheCollectionBase {
 public:
  using element_type = T;
  using CacheT = CacheType;

  KVCacheCollectionBase() = default;
  // Validates `d` fully; throws InvalidArgument. Cost: one pass over
  // batch_size x lookup_stride table entries, no allocation unless it throws
  // (engines build one view per step).
  // A zero max_full_context_length (a MAX-style desc that sets only
  // max_seq_length and max_cache_length) is filled in as max cache_length +
  // max_seq_length.
  explicit KVCacheCollectionBase(const CollectionDesc<T>& d) : d_(d) {
    detail::validate_collection_desc(detail::retype<float>(d));
    if (d_.max_full_context_length == 0) {
      std::uint32_t history = 0;
      for (std::uint32_t b = 0; b < d_.batch_size; ++b)
        history = std::max(history, d_.cache_lengths[b]);
      d_.max_full_context_length = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(std::uint64_t{history} + d_.max_seq_length, UINT32_MAX));
    }
  }

  CacheType get_key_cache(std::uint32_t layer) const { return layer_cache(layer, 0); }
  CacheType get_value_cache(std::uint32_t layer) const { return layer_cache(layer, 1); }

  std::uint32_t cache_length(std::uint32_t b) const { return d_.cache_lengths[b]; }
  std::uint32_t batch_size() const { return d_.batch_size; }
  std::uint32_t num_layers() const { return d_.num_layers; }
  std::uint32_t max_seq_length() const { return d_.max_seq_length; }
  std::uint32_t max_cache_length() const { return d_.max_cache_length; }
  std::uint32_t max_full_context_length() const { return d_.max_full_context_length; }
  T* blocks() const { return d_.blocks; }
  const std::uint32_t* cache_lengths() const { return d_.cache_lengths; }
  const std::uint32_t* lookup_table() const { return d_.lookup_table; }
  const CollectionDesc<T>& desc() const { return d_; }
 private:
  CacheType layer_cache(std::uint32_t layer, std::uint32_t kv) const {
    return CacheType(layer_cache_desc(d_, layer, kv));
  }

  CollectionDesc<T> d_{};
};

template <CacheElement T>
class PagedKVCacheCollection : public KVCacheCollectionBase<T, PagedKVCache<T>> {
 public:
  using KVCacheCollectionBase<T, PagedKVCache<T>>::KVCacheCollectionBase;
  std::uint32_t page_size() const { return this->desc().block_tokens; }
  std::uint32_t num_pages() const { return this->desc().num_blocks; }
  // Per-layer views with the page size fixed at compile time
  // (`get_key_cache<16>(layer)`); throw InvalidArgument when the cache's page
  // size is not kPageSize, or for a bad layer.
  using KVCacheCollectionBase<T, PagedKVCache<T>>::get_key_cache;
  using KVCacheCollectionBase<T, PagedKVCache<T>>::get_value_cache;
  template <std::uint32_t kPageSize>
  PagedKVCache<T, kPageSize> get_key_cache(std::uint32_t layer) const {
    return PagedKVCache<T, kPageSize>(layer_cache_desc(this->desc(), layer, 0));
  }
  template <std::uint32_t kPageSize>
  PagedKVCache<T, kPageSize> get_value_cache(std::uint32_t layer) const {
    return PagedKVCache<T, kPageSize>(layer_cache_desc(this->desc(), layer, 1));
  }
  // Value of unused lookup_table entries.
  std::uint32_t sentinel() const { return this->desc().num_blocks; }
  // MAX's copy(): "Explicitly construct a copy of self" (a view: no cache
  // memory is copied).
  PagedKVCacheCollection copy() const { return *this; }
};

template <CacheElement T>
class ContinuousBatchingKVCacheCollection
    : public KVCacheCollectionBase<T, ContinuousBatchingKVCache<T>> {
 public:
  using KVCacheCollectionBase<T, ContinuousBatchingKVCache<T>>::KVCacheCollectionBase;
  std::uint32_t max_seq_len() const { return this->desc().block_tokens; }
  // MAX's copy(): "Explicitly construct a copy of self" (a view: no cache
  // memory is copied).
  ContinuousBatchingKVCacheCollection copy() const { return *this; }
};

// The seeds' KVCollectionT trait.
template <class C>
concept KVCollectionT = std::is_trivially_copyable_v<C> && requires(const C c, std::uint32_t i) {
  { c.get_key_cache(i) } -> KVCacheT;
  { c.get_value_cache(i) } -> KVCacheT;
  { c.cache_length(i) } -> std::convertible_to<std::uint32_t>;
  { c.batch_size() } -> std::convertible_to<std::uint32_t>;
  { c.num_layers() } -> std::convertible_to<std::uint32_t>;
};

static_assert(KVCollectionT<PagedKVCacheCollection<Half>>);
static_assert(KVCollectionT<ContinuousBatchingKVCacheCollection<float>>);

}  // namespace kvcache
