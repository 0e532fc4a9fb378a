// Test helpers: a self-owned cache (paged with a shuffled page table, or
// continuous with shuffled slots) filled with random values, two layers so
// the layer/K/V offsets are exercised.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <random>
#include <vector>

#include "kvcache/collection.h"
#include "kvcache/dtype.h"

namespace kvcache::test {

struct Entry {
  std::uint32_t cache_length;
  std::uint32_t new_tokens;
};

// 64-byte aligned storage, like the managers' arenas (store_kv's streaming
// path needs vector-aligned rows).
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, std::size_t) { ::operator delete (p, std::align_val_t{64}); }
  bool operator==(const CacheLineAllocator&) const { return true; }
};

template <CacheElement T>
struct OwnedCache {
  std::vector<T, CacheLineAllocator<T>> blocks;
  std::vector<std::uint32_t> cache_lengths;
  std::vector<std::uint32_t> lookup;
  std::vector<std::uint32_t> reserved;  // cache_length + new tokens per entry
  std::vector<std::uint32_t> row_offsets;
  CacheDesc desc;
  bool paged = true;

  static constexpr std::uint32_t kLayers = 2;
  static constexpr std::uint32_t kLayer = 1;  // the layer the tests use

  OwnedCache(const std::vector<Entry>& entries, bool is_paged, std::uint32_t page_size,
             std::uint32_t n_kv, std::uint32_t dim, std::mt19937& rng,
             PageLayout layout = PageLayout::nhd,
             PoolArrangement arrangement = PoolArrangement::interleaved)
      : paged(is_paged) {
    const auto batch = static_cast<std::uint32_t>(entries.size());
    std::uint32_t max_ctx = 0, max_new = 0;
    row_offsets.push_back(0);
    for (const Entry& e : entries) {
      cache_lengths.push_back(e.cache_length);
      reserved.push_back(e.cache_length + e.new_tokens);
      max_ctx = std::max(max_ctx, e.cache_length + e.new_tokens);
      max_new = std::max(max_new, e.new_tokens);
      row_offsets.push_back(row_offsets.back() + e.new_tokens);
    }
    std::uint32_t block_tokens = 0, stride = 0, num_blocks = 0;
    if (paged) {
      block_tokens = page_size;
      stride = (max_ctx + page_size - 1) / page_size + 1;  // one spare column
      num_blocks = 0;
      for (const Entry& e : entries)
        num_blocks += (e.cache_length + e.new_tokens + page_size - 1) / page_size;
      num_blocks += 3;  // unused pages in between
    } else {
      block_tokens = max_ctx + 5;
      stride = 1;
      num_blocks = batch + 2;
    }
    std::vector<std::uint32_t> ids(num_blocks);
    for (std::uint32_t i = 0; i < num_blocks; ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    lookup.assign(std::size_t{batch} * stride, num_blocks);  // sentinel
    std::size_t next = 0;
    for (std::uint32_t b = 0; b < batch; ++b) {
      const std::uint32_t need =
          paged ? (entries[b].cache_length + entries[b].new_tokens + page_size - 1) / page_size : 1;
      for (std::uint32_t j = 0; j < need; ++j) lookup[std::size_t{b} * stride + j] = ids[next++];
    }
    const std::size_t elems = std::size_t{num_blocks} * 2 * kLayers * block_tokens * n_kv * dim;
    blocks.resize(elems);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& x : blocks) x = from_float<T>(dist(rng));
    desc.blocks = blocks.data();
    desc.cache_lengths = cache_lengths.data();
    desc.lookup_table = lookup.data();
    desc.reserved_lengths = reserved.data();
    desc.lookup_stride = stride;
    desc.batch_size = batch;
    desc.max_seq_length = max_new;
    desc.max_cache_length =
        cache_lengths.empty() ? 0 : *std::max_element(cache_lengths.begin(), cache_lengths.end());
    desc.max_full_context_length = max_ctx;
    desc.num_layers = kLayers;
    desc.page_size = block_tokens;
    desc.n_kv_heads = n_kv;
    desc.head_dim = dim;
    desc.num_blocks = num_blocks;
    desc.layout = layout;
    desc.arrangement = arrangement;
    desc.dtype = dtype_of_v<T>;
    desc = desc.with_strides();
  }

  // Same table, another buffer with identical contents.
  OwnedCache(const OwnedCache& o)
      : blocks(o.blocks),
        cache_lengths(o.cache_lengths),
        lookup(o.lookup),
        reserved(o.reserved),
        row_offsets(o.row_offsets),
        desc(o.desc),
        paged(o.paged) {
    desc.blocks = blocks.data();
    desc.cache_lengths = cache_lengths.data();
    desc.lookup_table = lookup.data();
    desc.reserved_lengths = reserved.data();
  }

  PagedKVCacheCollection<T> paged_collection() const { return PagedKVCacheCollection<T>(desc); }
  ContinuousBatchingKVCacheCollection<T> continuous_collection() const {
    return ContinuousBatchingKVCacheCollection<T>(desc);
  }
  std::uint32_t total_rows() const { return row_offsets.back(); }
};

inline std::vector<float> random_floats(std::size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Visits the typed collection (paged or continuous) of an OwnedCache.
template <CacheElement T, class F>
void with_collection(const OwnedCache<T>& c, F&& f) {
  if (c.paged) {
    f(c.paged_collection());
  } else {
    f(c.continuous_collection());
  }
}

}  // namespace kvcache::test
