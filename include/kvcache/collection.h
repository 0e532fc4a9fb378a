// kvcache/collection.h — a batch's view of the whole cache (all layers).
//
// `PagedKVCacheCollection<T>` and `ContinuousBatchingKVCacheCollection<T>`
// are MAX's KVCollectionT types: non-owning, trivially copyable, they borrow
// the manager's blocks and a KVCacheBatch's cache_lengths / lookup_table, and
// hand out per-layer views with get_key_cache(layer) / get_value_cache(layer).
//
// Build them from a KVCacheBatch (`batch.paged<T>()`, `batch.continuous<T>()`)
// or, for memory you manage yourself, from a whole-cache CacheDesc
// (cache_desc.h) — that constructor validates everything (non-null buffers,
// lookup entries within num_blocks or the sentinel, committed tokens backed
// by real blocks, lengths within the table) and throws InvalidArgument naming
// the bad value. A collection is a CacheDesc and a type: desc() is what the
// kernels take, get_key_cache / get_value_cache wrap desc().layer(l, kv).
// get_key_cache / get_value_cache throw InvalidArgument for layer >= num_layers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kvcache/cache_desc.h"
#include "kvcache/error.h"
#include "kvcache/kv_cache.h"

namespace kvcache {

template <CacheElement T, class CacheType>
class KVCacheCollectionBase {
 public:
  using element_type = T;
  using CacheT = CacheType;

  KVCacheCollectionBase() = default;
  // Validates `d` fully (CacheDesc::validate, and its dtype is T's); throws
  // InvalidArgument. Cost: one pass over batch_size x lookup_stride table
  // entries, no allocation unless it throws (engines build one view per
  // step). Strides left all zero are resolved from the geometry
  // (with_strides()); a zero max_full_context_length (a MAX-style desc that
  // sets only max_seq_length and max_cache_length) is filled in as max
  // cache_length + max_seq_length.
  explicit KVCacheCollectionBase(const CacheDesc& d) : d_(resolved(d)) {
    if (d_.dtype != dtype_of_v<T>) {
      throw InvalidArgument("a collection of " + std::string(dtype_name(dtype_of_v<T>)) +
                            " was given a cache of dtype " + std::string(dtype_name(d_.dtype)));
    }
    d_.validate();
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
  T* blocks() const { return static_cast<T*>(d_.blocks); }
  const std::uint32_t* cache_lengths() const { return d_.cache_lengths; }
  const std::uint32_t* lookup_table() const { return d_.lookup_table; }
  // The whole-cache descriptor (strides resolved).
  const CacheDesc& desc() const { return d_; }

 private:
  static CacheDesc resolved(const CacheDesc& d) {
    const bool unset = d.block_stride == 0 && d.layer_stride == 0 && d.kv_stride == 0 &&
                       d.token_stride == 0 && d.head_stride == 0;
    return unset ? d.with_strides() : d;
  }
  CacheType layer_cache(std::uint32_t layer, std::uint32_t kv) const {
    return CacheType(d_.layer(layer, kv));
  }

  CacheDesc d_{};
};

template <CacheElement T>
class PagedKVCacheCollection : public KVCacheCollectionBase<T, PagedKVCache<T>> {
 public:
  using KVCacheCollectionBase<T, PagedKVCache<T>>::KVCacheCollectionBase;
  std::uint32_t page_size() const { return this->desc().page_size; }
  std::uint32_t num_pages() const { return this->desc().num_blocks; }
  // Per-layer views with the page size fixed at compile time
  // (`get_key_cache<16>(layer)`); throw InvalidArgument when the cache's page
  // size is not kPageSize, or for a bad layer.
  using KVCacheCollectionBase<T, PagedKVCache<T>>::get_key_cache;
  using KVCacheCollectionBase<T, PagedKVCache<T>>::get_value_cache;
  template <std::uint32_t kPageSize>
  PagedKVCache<T, kPageSize> get_key_cache(std::uint32_t layer) const {
    return PagedKVCache<T, kPageSize>(this->desc().layer(layer, 0));
  }
  template <std::uint32_t kPageSize>
  PagedKVCache<T, kPageSize> get_value_cache(std::uint32_t layer) const {
    return PagedKVCache<T, kPageSize>(this->desc().layer(layer, 1));
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
  std::uint32_t max_seq_len() const { return this->desc().page_size; }
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
