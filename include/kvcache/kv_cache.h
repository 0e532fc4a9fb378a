// kvcache/kv_cache.h — per-layer cache views: what kernels take.
//
// `PagedKVCache<T>` and `ContinuousBatchingKVCache<T>` are the C++ forms of
// MAX's `PagedKVCache` / `ContinuousBatchingKVCache`: a non-owning,
// trivially copyable window on ONE layer's K (or V) for one batch. Get them
// from a collection (`get_key_cache(layer)` / `get_value_cache(layer)`).
//
// Memory (DESIGN.md §2; NHD order inside a block shown, HND swaps the two
// middle dimensions of a block: [n_kv_heads][page_size][head_dim]):
//   paged       blocks[num_pages][2][num_layers][page_size][n_kv_heads][head_dim]
//   continuous  blocks[max_batch][2][num_layers][max_seq_len][n_kv_heads][head_dim]
// A continuous slot behaves exactly like one page of `max_seq_len` tokens, so
// both views expose the same block interface (`page_size`, `page_ptr`,
// `token_stride`) and one kernel serves both (concept `KVCacheT`).
//
// Token `tok` of batch entry `b` lives in block `tok / page_size()` of that
// entry at row `tok % page_size()`; tokens of one head inside a block are
// `token_stride()` elements apart, heads of one token `head_stride()` apart
// (NHD: n_kv_heads * head_dim and head_dim; HND: head_dim and
// page_size * head_dim). `ptr(b, head, tok, d)` applies both.
//
// Lifetime: a view borrows the cache memory and the batch's cache_lengths /
// lookup_table; it is valid while the KVCacheBatch it came from lives and
// until the next step/release of its sequences. No method validates indices
// (hot path); the collection validated the batch when it was built.
// Thread-safety: views are read-only descriptors; concurrent writes to
// distinct tokens are safe, to the same token are a data race.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvcache/dtype.h"
#include "kvcache/params.h"

namespace kvcache {

// Fields shared by both per-layer views. Plain data, trivially copyable.
template <CacheElement T>
struct LayerCacheDesc {
  T* blocks = nullptr;                           // block 0 of this layer's K or V
  const std::uint32_t* cache_lengths = nullptr;  // [batch_size] committed tokens
  const std::uint32_t* lookup_table = nullptr;   // [batch_size][lookup_stride]
  std::uint32_t lookup_stride = 0;               // entries per batch row
  std::uint32_t batch_size = 0;
  std::uint32_t max_seq_length = 0;    // max new tokens in the batch this step
  std::uint32_t max_cache_length = 0;  // max cache_length + new tokens
  std::uint32_t block_tokens = 0;      // page_size (paged) or max_seq_len (continuous)
  std::uint32_t n_kv_heads = 0;        // heads in this device's shard
  std::uint32_t head_dim = 0;
  std::size_t block_stride = 0;         // elements between consecutive blocks (pages / slots)
  PageLayout layout = PageLayout::nhd;  // order of tokens and heads inside a block
};

// Elements between consecutive tokens of one head in a block:
// n_kv_heads * head_dim (NHD) or head_dim (HND).
template <CacheElement T>
constexpr std::size_t token_stride(const LayerCacheDesc<T>& d) {
  return d.layout == PageLayout::hnd ? std::size_t{d.head_dim}
                                     : std::size_t{d.n_kv_heads} * d.head_dim;
}

// Elements between consecutive heads of one token in a block: head_dim (NHD)
// or page_size * head_dim (HND).
template <CacheElement T>
constexpr std::size_t head_stride(const LayerCacheDesc<T>& d) {
  return d.layout == PageLayout::hnd ? std::size_t{d.block_tokens} * d.head_dim
                                     : std::size_t{d.head_dim};
}

// Behaviour common to both views; the derived types only add naming.
template <CacheElement T>
class LayerCacheBase {
 public:
  using element_type = T;

  LayerCacheBase() = default;
  explicit LayerCacheBase(const LayerCacheDesc<T>& d) : d_(d) {}

  std::uint32_t batch_size() const { return d_.batch_size; }
  std::uint32_t n_kv_heads() const { return d_.n_kv_heads; }
  std::uint32_t head_dim() const { return d_.head_dim; }
  // Tokens stored contiguously in one block (page_size, or max_seq_len).
  std::uint32_t page_size() const { return d_.block_tokens; }
  PageLayout layout() const { return d_.layout; }
  // Elements between consecutive tokens of one head in a block (see the free
  // functions above).
  std::size_t token_stride() const { return kvcache::token_stride(d_); }
  // Elements between consecutive heads of one token in a block.
  std::size_t head_stride() const { return kvcache::head_stride(d_); }

  // Tokens already committed for batch entry b (excludes this step's new ones).
  std::uint32_t cache_length(std::uint32_t b) const { return d_.cache_lengths[b]; }
  const std::uint32_t* cache_lengths() const { return d_.cache_lengths; }
  // True when every cache_length is 0 (pure context encoding).
  bool empty_cache() const {
    for (std::uint32_t b = 0; b < d_.batch_size; ++b)
      if (d_.cache_lengths[b] != 0) return false;
    return true;
  }
  // Max new tokens of any entry this step (MAX: max_seq_length).
  std::uint32_t max_prompt_length() const { return d_.max_seq_length; }
  // Max cache_length + new tokens over the batch (MAX: max_cache_length).
  std::uint32_t max_context_length() const { return d_.max_cache_length; }
  // Largest tile of tokens that is contiguous in memory: one block.
  std::uint32_t max_tile_size() const { return d_.block_tokens; }

  // Block id (page id or slot) holding tokens [j*page_size, (j+1)*page_size) of entry b.
  std::uint32_t block_id(std::uint32_t b, std::uint32_t j) const {
    return d_.lookup_table[std::size_t{b} * d_.lookup_stride + j];
  }
  // Start (head 0, dim 0) of the j-th block of entry b.
  T* page_ptr(std::uint32_t b, std::uint32_t j) const {
    return d_.blocks + std::size_t{block_id(b, j)} * d_.block_stride;
  }
  // Element (b, head, tok, d).
  T* ptr(std::uint32_t b, std::uint32_t head, std::uint32_t tok, std::uint32_t d = 0) const {
    return page_ptr(b, tok / d_.block_tokens) + (tok % d_.block_tokens) * token_stride() +
           std::size_t{head} * head_stride() + d;
  }

  // The memory seen as a matrix [rows, n_kv_heads * head_dim] (MAX's
  // row_idx / col_idx): row of token tok of entry b is block_id * page_size
  // + tok % page_size, column of (head, d) is head * head_dim + d. With NHD
  // the matrix is the memory itself (rows token_stride apart); with HND it is
  // a logical view and matrix_ptr does the mapping.
  std::uint32_t row_idx(std::uint32_t b, std::uint32_t tok) const {
    return block_id(b, tok / d_.block_tokens) * d_.block_tokens + tok % d_.block_tokens;
  }
  std::uint32_t col_idx(std::uint32_t head) const { return head * d_.head_dim; }
  // Address of (row, col) of that matrix view.
  T* matrix_ptr(std::uint32_t row, std::uint32_t col) const {
    return d_.blocks + std::size_t{row / d_.block_tokens} * d_.block_stride +
           (row % d_.block_tokens) * token_stride() +
           std::size_t{col / d_.head_dim} * head_stride() + col % d_.head_dim;
  }

  // `width` consecutive elements along head_dim starting at d.
  template <std::size_t width>
  std::array<T, width> load(std::uint32_t b, std::uint32_t head, std::uint32_t tok,
                            std::uint32_t d) const {
    std::array<T, width> out;
    const T* p = ptr(b, head, tok, d);
    for (std::size_t i = 0; i < width; ++i) out[i] = p[i];
    return out;
  }
  template <std::size_t width>
  void store(std::uint32_t b, std::uint32_t head, std::uint32_t tok, std::uint32_t d,
             const std::array<T, width>& val) const {
    T* p = ptr(b, head, tok, d);
    for (std::size_t i = 0; i < width; ++i) p[i] = val[i];
  }

  // Pointer to token start_tok of entry b; the tile_size tokens from there
  // are contiguous (token_stride apart). Requires page_size % tile_size == 0
  // and start_tok % tile_size == 0 (not checked: hot path).
  template <std::uint32_t tile_size>
  T* block_paged_ptr(std::uint32_t b, std::uint32_t start_tok, std::uint32_t head,
                     std::uint32_t d = 0) const {
    return ptr(b, head, start_tok, d);
  }

  const LayerCacheDesc<T>& desc() const { return d_; }

 private:
  LayerCacheDesc<T> d_{};
};

// One layer's K or V of a paged cache (MAX PagedKVCache).
template <CacheElement T>
class PagedKVCache : public LayerCacheBase<T> {
 public:
  using LayerCacheBase<T>::LayerCacheBase;
  static constexpr bool is_paged = true;
};

// One layer's K or V of a continuous-batching cache (MAX
// ContinuousBatchingKVCache); lookup_table[b] is the slot of entry b.
template <CacheElement T>
class ContinuousBatchingKVCache : public LayerCacheBase<T> {
 public:
  using LayerCacheBase<T>::LayerCacheBase;
  static constexpr bool is_paged = false;
};

// The seeds' KVCacheT trait: what every kernel may use of a per-layer view.
template <class C>
concept KVCacheT = std::is_trivially_copyable_v<C> && CacheElement<typename C::element_type> &&
    requires(const C c, std::uint32_t i) {
  { c.batch_size() } -> std::convertible_to<std::uint32_t>;
  { c.n_kv_heads() } -> std::convertible_to<std::uint32_t>;
  { c.head_dim() } -> std::convertible_to<std::uint32_t>;
  { c.page_size() } -> std::convertible_to<std::uint32_t>;
  { c.token_stride() } -> std::convertible_to<std::size_t>;
  { c.head_stride() } -> std::convertible_to<std::size_t>;
  { c.cache_length(i) } -> std::convertible_to<std::uint32_t>;
  { c.page_ptr(i, i) } -> std::same_as<typename C::element_type*>;
  { c.ptr(i, i, i, i) } -> std::same_as<typename C::element_type*>;
  { c.row_idx(i, i) } -> std::convertible_to<std::uint32_t>;
  { c.col_idx(i) } -> std::convertible_to<std::uint32_t>;
  { c.empty_cache() } -> std::convertible_to<bool>;
  { c.max_prompt_length() } -> std::convertible_to<std::uint32_t>;
  { c.max_context_length() } -> std::convertible_to<std::uint32_t>;
  { c.max_tile_size() } -> std::convertible_to<std::uint32_t>;
};

static_assert(KVCacheT<PagedKVCache<float>>);
static_assert(KVCacheT<ContinuousBatchingKVCache<BFloat16>>);

}  // namespace kvcache
