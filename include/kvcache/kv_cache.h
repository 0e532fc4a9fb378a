// kvcache/kv_cache.h — per-layer cache views: what kernels take.
//
// `PagedKVCache<T>` and `ContinuousBatchingKVCache<T>` are the C++ forms of
// MAX's `PagedKVCache` / `ContinuousBatchingKVCache`: a non-owning,
// trivially copyable window on ONE layer's K (or V) for one batch. Get them
// from a collection (`get_key_cache(layer)` / `get_value_cache(layer)`).
//
// Memory (DESIGN.md §2; interleaved arrangement and NHD order inside a block
// shown; HND swaps the two middle dimensions of a block:
// [n_kv_heads][page_size][head_dim]; PoolArrangement::per_layer puts
// [num_layers][2] before the blocks, params.h):
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

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "kvcache/cache_desc.h"
#include "kvcache/dtype.h"
#include "kvcache/error.h"
#include "kvcache/params.h"

namespace kvcache {

// A page size known only at run time (the default of the views' template
// parameter); any other value fixes it at compile time.
inline constexpr std::uint32_t dynamic_page_size = 0;

// Behaviour common to both views; the derived types only add naming.
// kPageSize != dynamic_page_size fixes the block's tokens at compile time
// (the descriptor's page_size must equal it), so token -> block
// arithmetic divides by a constant.
template <CacheElement T, std::uint32_t kPageSize = dynamic_page_size>
class LayerCacheBase {
 public:
  using element_type = T;

  LayerCacheBase() = default;
  // A per-layer descriptor (CacheDesc::layer()). Throws InvalidArgument when
  // its dtype is not T's; nothing else is checked (the collection or the
  // kernel validates the descriptor).
  explicit LayerCacheBase(const CacheDesc& d) : d_(d) {
    if (d.dtype != dtype_of_v<T>) {
      throw InvalidArgument("a view of " + std::string(dtype_name(dtype_of_v<T>)) +
                            " was given a cache of dtype " + std::string(dtype_name(d.dtype)));
    }
  }

  std::uint32_t batch_size() const { return d_.batch_size; }
  std::uint32_t n_kv_heads() const { return d_.n_kv_heads; }
  std::uint32_t head_dim() const { return d_.head_dim; }
  // Tokens stored contiguously in one block (page_size, or max_seq_len).
  std::uint32_t page_size() const {
    if constexpr (kPageSize != dynamic_page_size) {
      return kPageSize;
    } else {
      return d_.page_size;
    }
  }
  PageLayout layout() const { return d_.layout; }
  // Elements between consecutive tokens of one head in a block: n_kv_heads *
  // head_dim (NHD) or head_dim (HND).
  std::size_t token_stride() const { return d_.token_stride; }
  // Elements between consecutive heads of one token in a block: head_dim
  // (NHD) or page_size * head_dim (HND).
  std::size_t head_stride() const { return d_.head_stride; }

  // Tokens already committed for batch entry b (excludes this step's new ones).
  std::uint32_t cache_length(std::uint32_t b) const { return d_.cache_lengths[b]; }
  const std::uint32_t* cache_lengths() const { return d_.cache_lengths; }
  // MAX's cache_lengths_nd(): the batch's committed lengths as a 1-D span.
  std::span<const std::uint32_t> cache_lengths_nd() const {
    return {d_.cache_lengths, d_.batch_size};
  }
  // True when every cache_length is 0 (pure context encoding).
  bool empty_cache() const {
    for (std::uint32_t b = 0; b < d_.batch_size; ++b)
      if (d_.cache_lengths[b] != 0) return false;
    return true;
  }
  // Tokens the fetch reserved room for, entry b: the kernels' limit (see
  // CacheDesc::reserved_lengths; without them, the blocks the entry's
  // table row holds).
  std::uint32_t reserved_length(std::uint32_t b) const {
    if (d_.reserved_lengths != nullptr) return d_.reserved_lengths[b];
    std::uint32_t j = 0;
    while (j < d_.lookup_stride && block_id(b, j) < d_.num_blocks) ++j;
    return static_cast<std::uint32_t>(
        std::min<std::uint64_t>(std::uint64_t{j} * page_size(), UINT32_MAX));
  }
  // "the maximum sequence length across all batches of the current request":
  // max new tokens of any entry this step (MAX: max_seq_length).
  std::uint32_t max_prompt_length() const { return d_.max_seq_length; }
  // "the maximum cache length used across all batches of the current
  // request": max cache_length (history, before this step's new tokens) over
  // the batch, as MAX computes it (max_cache_length); in multistep it
  // advances by the first step's max_seq_length, then by 1 a step, so it may
  // exceed the true maximum there, never fall below it.
  std::uint32_t max_context_length() const { return d_.max_cache_length; }
  // Max cache_length + new tokens over the batch (MAX's tests:
  // max_full_context_length): the longest context a query of this step sees.
  std::uint32_t max_full_context_length() const { return d_.max_full_context_length; }
  // Largest tile of tokens that is contiguous in memory: one block.
  std::uint32_t max_tile_size() const { return page_size(); }

  // Block id (page id or slot) holding tokens [j*page_size, (j+1)*page_size) of entry b.
  std::uint32_t block_id(std::uint32_t b, std::uint32_t j) const {
    return d_.lookup_table[std::size_t{b} * d_.lookup_stride + j];
  }
  // Start (head 0, dim 0) of the j-th block of entry b.
  T* page_ptr(std::uint32_t b, std::uint32_t j) const {
    return blocks() + std::size_t{block_id(b, j)} * d_.block_stride;
  }
  // Element (b, head, tok, d).
  T* ptr(std::uint32_t b, std::uint32_t head, std::uint32_t tok, std::uint32_t d = 0) const {
    return page_ptr(b, tok / page_size()) + (tok % page_size()) * token_stride() +
           std::size_t{head} * head_stride() + d;
  }

  // The memory seen as a matrix [rows, n_kv_heads * head_dim] that starts at
  // this layer's K (or V) base and runs through the whole pool (MAX's
  // row_idx / col_idx): the row of token tok of entry b is
  //   block_id * rows_per_block() + tok % page_size
  // where rows_per_block() is the number of rows between consecutive blocks
  // of this layer (2 * num_layers * page_size interleaved, page_size
  // per_layer), and the column of (head, d) is head * head_dim + d. With NHD
  // the matrix is the memory itself: element (row, col) is at
  // blocks + row * (n_kv_heads * head_dim) + col for every block, which is
  // what lets one 2-D descriptor (a TMA tile) cover the pool. With HND it is
  // a logical view and matrix_ptr does the mapping; so it is for int8 caches,
  // whose blocks hold their scales after the values (rows_per_block() then
  // rounds the block's bytes up to whole rows). row_idx is 64-bit (MAX:
  // UInt32) so a large pool cannot wrap it.
  std::uint64_t row_idx(std::uint32_t b, std::uint32_t tok) const {
    return std::uint64_t{block_id(b, tok / page_size())} * rows_per_block() + tok % page_size();
  }
  std::uint32_t col_idx(std::uint32_t head) const { return head * d_.head_dim; }
  std::size_t rows_per_block() const {
    const std::size_t row = std::size_t{d_.n_kv_heads} * d_.head_dim;
    return (d_.block_stride + row - 1) / row;
  }
  // Address of (row, col) of that matrix view.
  T* matrix_ptr(std::uint64_t row, std::uint32_t col) const {
    const std::size_t rows = rows_per_block();
    return blocks() + std::size_t{row / rows} * d_.block_stride +
           std::size_t{row % rows} * token_stride() +
           std::size_t{col / d_.head_dim} * head_stride() + col % d_.head_dim;
  }

  // `width` consecutive elements (stored codes) along head_dim starting at
  // d; load_float / store_row dequantise / quantise.
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

  // The dequantisation scale of (b, head, tok): the number is to_float(code)
  // * scale. 1 for f32 / f16 / bf16, the head's static scale for fp8
  // (CacheDesc::head_scales), the (token, head) scale stored in the page
  // for int8.
  float scale(std::uint32_t b, std::uint32_t head, std::uint32_t tok) const {
    if constexpr (std::is_same_v<T, Int8>) {
      return *scale_ptr(b, head, tok);
    } else if constexpr (std::is_same_v<T, Fp8E4M3> || std::is_same_v<T, Fp8E5M2>) {
      return d_.head_scales[head];
    } else {
      return 1.0f;
    }
  }
  // int8: where the page keeps the scale of (b, head, tok).
  float* scale_ptr(std::uint32_t b, std::uint32_t head,
                   std::uint32_t tok) const requires std::is_same_v<T, Int8> {
    const std::uint32_t row = tok % page_size();
    return reinterpret_cast<float*>(page_ptr(b, tok / page_size()) + d_.block_values()) +
           d_.scale_index(row, head);
  }
  // The number at (b, head, tok, d), dequantised.
  float load_float(std::uint32_t b, std::uint32_t head, std::uint32_t tok, std::uint32_t d) const {
    return to_float(*ptr(b, head, tok, d)) * scale(b, head, tok);
  }
  // Writes the head_dim numbers of (b, head, tok), quantised as the kernels
  // quantise them (int8: computes and stores the row's scale; fp8: divides
  // by the head's static scale, i.e. multiplies by 1 / scale, and rounds).
  // Throws InvalidArgument when row has another size.
  void store_row(std::uint32_t b, std::uint32_t head, std::uint32_t tok,
                 std::span<const float> row) const {
    if (row.size() != d_.head_dim) {
      throw InvalidArgument("store_row got " + std::to_string(row.size()) +
                            " values, expected head_dim = " + std::to_string(d_.head_dim));
    }
    T* p = ptr(b, head, tok, 0);
    float inverse = 1.0f;
    if constexpr (std::is_same_v<T, Int8>) {
      float absmax = 0.0f;
      for (float x : row) absmax = std::max(absmax, x < 0.0f ? -x : x);
      inverse = int8_inverse_scale(absmax);
      *scale_ptr(b, head, tok) = int8_scale(absmax);
    } else if constexpr (std::is_same_v<T, Fp8E4M3> || std::is_same_v<T, Fp8E5M2>) {
      inverse = 1.0f / d_.head_scales[head];
    }
    for (std::size_t i = 0; i < row.size(); ++i) p[i] = from_float<T>(row[i] * inverse);
  }

  // Pointer to token start_tok of entry b; the tile_size tokens from there
  // are contiguous (token_stride apart). Requires page_size % tile_size == 0
  // and start_tok % tile_size == 0 (not checked: hot path).
  template <std::uint32_t tile_size>
  T* block_paged_ptr(std::uint32_t b, std::uint32_t start_tok, std::uint32_t head,
                     std::uint32_t d = 0) const {
    return ptr(b, head, start_tok, d);
  }

  // Block 0 of this layer's K (or V).
  T* blocks() const { return static_cast<T*>(d_.blocks); }
  // The descriptor this view wraps (what the kernels take).
  const CacheDesc& desc() const { return d_; }

 private:
  CacheDesc d_{};
};

// One layer's K or V of a paged cache (MAX PagedKVCache). PagedKVCache<T>
// takes its page size from the descriptor; PagedKVCache<T, 16> is MAX's
// `PagedKVCache[dtype, kv_params, page_size]` with the page size a template
// parameter (static max_tile_size(), constant token -> page arithmetic).
template <CacheElement T, std::uint32_t kPageSize = dynamic_page_size>
class PagedKVCache : public LayerCacheBase<T, kPageSize> {
 public:
  static constexpr bool is_paged = true;
  static constexpr std::uint32_t page_size_ = kPageSize;

  PagedKVCache() = default;
  // Throws InvalidArgument when d.page_size is not kPageSize (or the dtype
  // is not T's).
  explicit PagedKVCache(const CacheDesc& d) : LayerCacheBase<T, kPageSize>(d) {
    if (d.page_size != kPageSize) {
      throw InvalidArgument("PagedKVCache<" + std::to_string(kPageSize) +
                            "> was given a cache of page_size " + std::to_string(d.page_size));
    }
  }
  // The same layer with the page size fixed at compile time; throws
  // InvalidArgument when the runtime page size differs.
  explicit PagedKVCache(const PagedKVCache<T>& runtime) : PagedKVCache(runtime.desc()) {}

  // "Returns the maximum tile size for the KVCache": one page.
  static constexpr std::uint32_t max_tile_size() { return kPageSize; }
  // MAX's get_type_name() / get_device_type_name().
  static std::string get_type_name() {
    return "PagedKVCache<" + std::string(dtype_name(dtype_of_v<T>)) + ", " +
           std::to_string(kPageSize) + ">";
  }
  static std::string get_device_type_name() { return get_type_name(); }
};

template <CacheElement T>
class PagedKVCache<T, dynamic_page_size> : public LayerCacheBase<T> {
 public:
  using LayerCacheBase<T>::LayerCacheBase;
  static constexpr bool is_paged = true;
  static constexpr std::uint32_t page_size_ = dynamic_page_size;
  static std::string get_type_name() {
    return "PagedKVCache<" + std::string(dtype_name(dtype_of_v<T>)) + ">";
  }
  static std::string get_device_type_name() { return get_type_name(); }
};

// One layer's K or V of a continuous-batching cache (MAX
// ContinuousBatchingKVCache); lookup_table[b] is the slot of entry b.
template <CacheElement T>
class ContinuousBatchingKVCache : public LayerCacheBase<T> {
 public:
  using LayerCacheBase<T>::LayerCacheBase;
  static constexpr bool is_paged = false;
  static std::string get_type_name() {
    return "ContinuousBatchingKVCache<" + std::string(dtype_name(dtype_of_v<T>)) + ">";
  }
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
  { c.row_idx(i, i) } -> std::convertible_to<std::uint64_t>;
  { c.col_idx(i) } -> std::convertible_to<std::uint32_t>;
  { c.empty_cache() } -> std::convertible_to<bool>;
  { c.max_prompt_length() } -> std::convertible_to<std::uint32_t>;
  { c.max_context_length() } -> std::convertible_to<std::uint32_t>;
  { c.max_tile_size() } -> std::convertible_to<std::uint32_t>;
};

static_assert(KVCacheT<PagedKVCache<float>>);
static_assert(KVCacheT<PagedKVCache<Half, 16>>);
static_assert(KVCacheT<ContinuousBatchingKVCache<BFloat16>>);

}  // namespace kvcache
