// kvcache/cache_desc.h — CacheDesc: the one plain description of a batch's
// cache that every kernel takes.
//
// A CacheDesc says where a batch's K and V live and how to find a token in
// them: the block buffer, the batch's per-entry lengths and page table, the
// geometry, and the strides in elements, resolved once from the geometry
// (FlashInfer's paged_kv_t is the model). The CPU kernels, the CUDA kernels
// (kvcache/cuda/), the C API (kvc_cache_desc, field for field) and the seed
// views take it; the views (PagedKVCacheCollection<T>, PagedKVCache<T>, ...:
// collection.h, kv_cache.h) are thin typed wrappers over one.
//
// What `blocks` points at:
//  - a whole-cache descriptor (KVCacheBatch::desc(), a collection's desc()):
//    the start of the pool, arranged as `arrangement` says (params.h):
//      interleaved [num_blocks][2][num_layers][block]
//      per_layer   [num_layers][2][num_blocks][block]
//    a block being [page_size][n_kv_heads][head_dim] (NHD) or
//    [n_kv_heads][page_size][head_dim] (HND);
//  - a per-layer descriptor (layer(l, kv), what kernels take): block 0 of
//    layer l's K (kv 0) or V (kv 1). Everything else is the same, so
//    element (block, row, head, d) of that layer is at
//    blocks + elem_offset(block, row, head) + d.
// 8-bit types (dtype.h, docs/quantization.md): elements are bytes.
//  - fp8: `head_scales` points at the static dequantisation scales (number =
//    fp8 value * scale): a whole-cache descriptor's at
//    [num_layers][2][n_kv_heads] floats (layer, K or V, this device's heads),
//    a per-layer descriptor's at that layer's K or V [n_kv_heads] (layer()
//    advances it with blocks). Required (non-null) for fp8, ignored otherwise.
//  - int8: each block (one layer's K or V of one page or slot) holds its
//    values, then one float scale per (row, head) beside them:
//      [block_values() int8 values, in the page layout]
//      [page_size * n_kv_heads floats]  scale of (row, head) at index
//                                        (row * token_stride + head * head_stride) / head_dim
//    (NHD: [page_size][n_kv_heads], HND: [n_kv_heads][page_size], the same
//    order as the rows), so block_elements() counts both (in bytes) and
//    copy-on-write, prefix caching, tiers and a device pool that move or copy
//    whole blocks move the scales with them. head_dim must be a multiple of 4
//    (the scales stay 4-byte aligned).
// Token t of entry b lies in block lookup_table[b * lookup_stride +
// t / page_size] at row t % page_size. With the continuous strategy a block
// is a sequence's slot and page_size is max_seq_len (one page per entry).
//
// Invariants a valid descriptor keeps (validate() checks them; the typed
// collections and every kernel call it):
//  - blocks non-null; num_layers, page_size, n_kv_heads, head_dim,
//    num_blocks non-zero; the pool's element count fits 64 bits;
//  - the strides are those with_strides() derives from the geometry;
//  - for every entry b: cache_lengths[b] <= max_cache_length,
//    cache_lengths[b] <= reserved_lengths[b] (when given), the blocks that
//    hold the entry's room are real block ids (< num_blocks) and every other
//    table entry is a block id or the sentinel num_blocks.
// reserved_lengths may be null: the room is then what the entry's table row
// holds before its first sentinel.
//
// Ownership: borrows everything it points at (the manager's pool, the
// batch's arrays); valid while the KVCacheBatch it came from lives and until
// the next step/release of its sequences. Plain data, trivially copyable:
// copy freely, share across threads read-only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcache/dtype.h"
#include "kvcache/params.h"

namespace kvcache {

struct CacheDesc {
  // Memory: see the file comment for what blocks points at.
  void* blocks = nullptr;
  DType dtype = DType::f32;
  // fp8 only: the static scales (see the file comment); null otherwise.
  const float* head_scales = nullptr;

  // The batch.
  const std::uint32_t* cache_lengths = nullptr;     // [batch_size] committed tokens
  const std::uint32_t* reserved_lengths = nullptr;  // [batch_size] rows a kernel may touch, or null
  const std::uint32_t* lookup_table = nullptr;      // [batch_size][lookup_stride] block ids
  std::uint32_t lookup_stride = 0;                  // table entries per batch entry
  std::uint32_t batch_size = 0;
  std::uint32_t max_seq_length = 0;           // max new tokens of an entry this step (MAX)
  std::uint32_t max_cache_length = 0;         // max history (cache_length) of an entry (MAX)
  std::uint32_t max_full_context_length = 0;  // max history + new tokens of an entry

  // The geometry (one device's shard).
  std::uint32_t num_layers = 0;
  std::uint32_t page_size = 0;   // tokens per block: the page size, or max_seq_len (continuous)
  std::uint32_t n_kv_heads = 0;  // KV heads on this device
  std::uint32_t head_dim = 0;
  std::uint32_t num_blocks = 0;  // pages (or slots) in the pool; also the table's sentinel
  PageLayout layout = PageLayout::nhd;
  PoolArrangement arrangement = PoolArrangement::interleaved;

  // Strides in elements, resolved from the geometry (with_strides()).
  std::size_t block_stride = 0;  // block j to block j + 1 of one layer's K (or V)
  std::size_t layer_stride = 0;  // layer l to layer l + 1 (same block, same K or V)
  std::size_t kv_stride = 0;     // a layer's K to its V
  std::size_t token_stride = 0;  // row r to row r + 1 of one head in a block
  std::size_t head_stride = 0;   // head h to head h + 1 of one row

  // Value elements of one layer's K (or V) of one block.
  constexpr std::size_t block_values() const {
    return std::size_t{page_size} * n_kv_heads * head_dim;
  }
  // Elements of one layer's K (or V) of one block: the values, and for int8
  // the (row, head) scales after them (4 bytes each; elements are bytes).
  constexpr std::size_t block_elements() const {
    return block_values() +
           (has_page_scales(dtype) ? std::size_t{page_size} * n_kv_heads * sizeof(float) : 0);
  }
  // int8: from a block's first float scale to that of (row, head).
  constexpr std::size_t scale_index(std::uint32_t row, std::uint32_t head) const {
    return (std::size_t{row} * token_stride + std::size_t{head} * head_stride) / head_dim;
  }
  // Elements of the whole pool (every block, layer, K and V).
  constexpr std::size_t pool_elements() const {
    return std::size_t{num_blocks} * 2 * num_layers * block_elements();
  }
  // From a whole-cache `blocks` to block 0 of layer `layer`'s K (kv 0) or V (kv 1).
  constexpr std::size_t layer_offset(std::uint32_t layer, std::uint32_t kv) const {
    return std::size_t{layer} * layer_stride + std::size_t{kv} * kv_stride;
  }
  // From block 0 of a layer's K (or V) to (block, row, head), dim 0.
  constexpr std::size_t elem_offset(std::uint32_t block, std::uint32_t row,
                                    std::uint32_t head) const {
    return std::size_t{block} * block_stride + std::size_t{row} * token_stride +
           std::size_t{head} * head_stride;
  }

  // This descriptor with the strides its geometry implies.
  constexpr CacheDesc with_strides() const {
    CacheDesc d = *this;
    const std::size_t e = block_elements();
    const bool per_layer = arrangement == PoolArrangement::per_layer;
    d.block_stride = per_layer ? e : 2 * std::size_t{num_layers} * e;
    d.layer_stride = per_layer ? 2 * std::size_t{num_blocks} * e : e;
    d.kv_stride = per_layer ? std::size_t{num_blocks} * e : std::size_t{num_layers} * e;
    d.token_stride =
        layout == PageLayout::hnd ? std::size_t{head_dim} : std::size_t{n_kv_heads} * head_dim;
    d.head_stride =
        layout == PageLayout::hnd ? std::size_t{page_size} * head_dim : std::size_t{head_dim};
    return d;
  }

  // The per-layer descriptor of layer `layer`'s K (kv 0) or V (kv 1), taken
  // from a whole-cache descriptor: blocks advanced by layer_offset, the rest
  // unchanged (head_scales advanced to the layer's K or V scales). Throws
  // InvalidArgument for layer >= num_layers or kv > 1.
  CacheDesc layer(std::uint32_t layer, std::uint32_t kv) const;

  // Throws InvalidArgument naming the first field that breaks an invariant
  // above (and for fp8 a null head_scales, for int8 a head_dim that is not
  // a multiple of 4); reads batch_size x lookup_stride table entries, allocates nothing
  // unless it throws.
  void validate() const;
};

}  // namespace kvcache
