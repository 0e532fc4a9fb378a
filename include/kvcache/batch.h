// kvcache/batch.h — what `fetch` returns: one batch's cache inputs.
//
// A KVCacheBatch owns the small per-batch arrays (cache_lengths, lookup_table,
// reserved lengths) and points at the manager's blocks; it is MAX's
// `(blocks, cache_lengths, lookup_table, is_cache_empty)` tuple. Typed
// collections for kernels come from `paged<T>()` / `continuous<T>()`, which
// throw InvalidArgument if T or the strategy does not match the manager.
//
// Lifetime: the batch must not outlive its manager; views taken from it are
// valid while the batch lives and until the next step/release of its
// sequences. `increment_cache_lengths` changes cache_lengths in place: take
// the collection again afterwards (views copy max_* values).
// Thread-safety: a batch is a plain value; don't share one across threads
// while one of them mutates it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcache/cache_desc.h"
#include "kvcache/collection.h"
#include "kvcache/error.h"
#include "kvcache/params.h"

namespace kvcache {

using SeqId = std::uint64_t;

// One copy-on-write copy a fetch made: block `dst` now holds what block `src`
// held (every layer, K and V, on every device). See KVCacheBatch::block_copies.
struct BlockCopy {
  std::uint32_t src = 0;
  std::uint32_t dst = 0;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

// One write-back a manager whose pool is kept apart (TierConfig::pool_apart)
// asks of the caller: copy page `page` of device `device`'s pool into
// `bytes` (that device's part of a staging slot of the manager, one page of
// one device long), packed [2][num_layers][block] whatever the pool's
// arrangement (the tiers' form, kvcache/tier.h). A manager of several
// devices lists a page once per device. See KVCacheBatch::block_offloads.
struct BlockOffload {
  std::uint32_t page = 0;
  std::span<std::byte> bytes;
  std::uint32_t device = 0;
};

class KVCacheBatch {
 public:
  KVCacheBatch() = default;

  std::uint32_t batch_size() const { return static_cast<std::uint32_t>(seq_ids_.size()); }
  std::span<const SeqId> seq_ids() const { return seq_ids_; }
  // Committed tokens per entry; this step's new tokens go at cache_lengths[b] + i.
  std::span<const std::uint32_t> cache_lengths() const { return cache_lengths_; }
  // Tokens the fetch guaranteed room for, per entry: paged cache_length + new +
  // num_steps - 1; continuous max_seq_len (the whole slot).
  std::span<const std::uint32_t> reserved_lengths() const { return reserved_lengths_; }
  // Row-major [batch_size][lookup_stride]; paged: page ids, sentinel = num_blocks();
  // continuous: stride 1, the slot of each entry.
  std::span<const std::uint32_t> lookup_table() const { return lookup_table_; }
  std::uint32_t lookup_stride() const { return lookup_stride_; }
  // Max new tokens of an entry this step (MAX max_seq_length).
  std::uint32_t max_seq_length() const { return max_seq_length_; }
  // Max cache_length (history, before this step's new tokens) of an entry, as
  // MAX computes max_cache_length; increment_cache_lengths advances it by the
  // previous step's max_seq_length.
  std::uint32_t max_cache_length() const { return max_cache_length_; }
  // Max cache_length + new tokens of an entry (exact).
  std::uint32_t max_full_context_length() const { return max_full_context_length_; }
  bool is_cache_empty() const { return is_cache_empty_; }
  // The copy-on-write copies the fetch that filled this batch made in the
  // manager's blocks, in the order made (paged: the first write into a page
  // shared after fork, or cut by truncate, goes to a private copy). Kernels on
  // the manager's own blocks need do nothing. A pool kept elsewhere with the
  // same block ids (a GPU pool: kvcache/cuda/device_collection.h) must make
  // the same copies, in order, before this step writes into it
  // (kvcache::cuda::copy_blocks); vLLM calls this list blocks_to_copy. Empty
  // for continuous batches and for fetches that shared nothing.
  std::span<const BlockCopy> block_copies() const { return block_copies_; }
  // Tiers below a pool kept apart from the manager's (TierConfig::pool_apart,
  // docs/tiers.md "A pool apart"); empty otherwise. The caller applies a
  // batch's transfers to its pool in this order, before the batch's kernels:
  //   1. block_offloads: each page's bytes, from its pool into `bytes`
  //      (published pages the manager evicted since the last fetch: their
  //      pages may be written by this batch, or be the destination of 2.);
  //   2. block_loads: each page, from this batch's host pool (desc().blocks,
  //      same arrangement and page ids) into its pool (pages a tier loaded;
  //      with several devices, on every device: each from blocks(d));
  //   3. block_copies, in order (a copy may read a loaded page, or write a
  //      page whose old bytes 1. saves);
  //   4. the kernels.
  // Once the copies of 1. have completed, PagedKVCacheManager::
  // complete_offloads(batch) hands the slots to the first tier (until then
  // they stay reserved; their `bytes` live until then or the manager's end).
  // The host pages of 2. must have been read before the manager's next
  // fetch or match_prefix (a later load may write them again).
  std::span<const BlockOffload> block_offloads() const { return block_offloads_; }
  std::span<const std::uint32_t> block_loads() const { return block_loads_; }

  const KVCacheParams& params() const { return params_; }
  CacheStrategy strategy() const { return params_.cache_strategy; }
  std::uint32_t num_blocks() const { return num_blocks_; }  // pages or slots
  std::uint32_t page_size() const { return page_size_; }  // page_size, or max_seq_len (continuous)
  // Raw start of device `device`'s block buffer.
  void* blocks(std::uint32_t device = 0) const;

  // Typed views. Throw InvalidArgument if T is not the cache dtype, the
  // strategy differs, or device >= n_devices.
  template <CacheElement T>
  PagedKVCacheCollection<T> paged(std::uint32_t device = 0) const {
    check_view(dtype_of_v<T>, CacheStrategy::paged, device);
    return PagedKVCacheCollection<T>(desc(device));
  }
  template <CacheElement T>
  ContinuousBatchingKVCacheCollection<T> continuous(std::uint32_t device = 0) const {
    check_view(dtype_of_v<T>, CacheStrategy::continuous, device);
    return ContinuousBatchingKVCacheCollection<T>(desc(device));
  }

  // The whole-cache descriptor behind both views (strides resolved), for
  // device `device`; what the kernels, the C API and the CUDA path take.
  // Throws InvalidArgument for device >= n_devices.
  CacheDesc desc(std::uint32_t device = 0) const;

  // Multistep decoding (MAX increment_cache_lengths): advance every entry's
  // cache_length by the tokens it processed in the previous step, given as
  // that step's row offsets (batch_size + 1 non-decreasing values starting at
  // 0), and prepare for a decode step of one token per entry:
  // max_cache_length += the previous max_seq_length (MAX), max_seq_length = 1,
  // max_full_context_length = max cache_length + 1. Touches no
  // manager state and allocates nothing. Throws InvalidArgument on malformed
  // offsets and CapacityExceeded if an entry would pass its reserved room;
  // on throw the batch is unchanged.
  void increment_cache_lengths(std::span<const std::uint32_t> prev_row_offsets);

 private:
  friend class ContinuousBatchingKVCacheManager;
  friend class PagedKVCacheManager;
  void check_view(DType want, CacheStrategy strategy, std::uint32_t device) const;
  void recompute_maxima(std::span<const std::uint32_t> new_tokens);
  // Grows capacity so a fill of this size allocates nothing (strong guarantee
  // for fetch_into: if this throws, contents are unchanged).
  void reserve(std::size_t batch, std::size_t lookup_entries, std::size_t devices,
               std::size_t block_copies = 0, std::size_t block_offloads = 0,
               std::size_t block_loads = 0);

  KVCacheParams params_{};
  std::vector<SeqId> seq_ids_;
  std::vector<std::uint32_t> cache_lengths_;
  std::vector<std::uint32_t> reserved_lengths_;
  std::vector<std::uint32_t> lookup_table_;
  std::uint32_t lookup_stride_ = 0;
  std::uint32_t max_seq_length_ = 0;
  std::uint32_t max_cache_length_ = 0;
  std::uint32_t max_full_context_length_ = 0;
  bool is_cache_empty_ = true;
  std::uint32_t num_blocks_ = 0;
  std::uint32_t page_size_ = 0;
  std::vector<void*> device_blocks_;
  std::vector<BlockCopy> block_copies_;
  std::vector<BlockOffload> block_offloads_;
  std::vector<std::uint32_t> block_loads_;
  std::uint64_t offload_serial_ = 0;  // which fetch handed block_offloads_ out
  // fp8: the manager's scales, [n_devices][num_layers][2][heads per device].
  const float* head_scales_ = nullptr;
};

}  // namespace kvcache
