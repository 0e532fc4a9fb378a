// kvcache/paged_manager.h — a paged KV cache manager (vLLM / MAX style).
//
// One pool of total_num_pages pages per device:
//   blocks[total_num_pages][2][num_layers][page_size][n_kv_heads_per_device][head_dim]
// One page id covers every layer's K and V for page_size tokens, so a sequence
// has ONE page table. fetch() allocates the pages a batch needs, all or
// nothing (OutOfPages names what was needed and what was free); pages are
// taken from an index-based free list in O(1) with no heap allocation per
// step in steady state. Unused lookup_table entries hold the sentinel
// total_num_pages. release() returns pages whose ref count drops to zero.
// Thread-safe (see manager.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvcache/manager.h"

namespace kvcache {

class PagedKVCacheManager final : public KVCacheManager {
 public:
  // params.cache_strategy must be paged. max_seq_len caps one sequence;
  // max_batch_size caps claimed sequences. Throws InvalidArgument or OutOfMemory.
  PagedKVCacheManager(const KVCacheParams& params, std::uint32_t total_num_pages,
                      std::uint32_t max_batch_size, std::uint32_t max_seq_len);
  ~PagedKVCacheManager() override;

  // Bytes of a pool of total_num_pages pages over all devices.
  static std::size_t estimated_memory_size(const KVCacheParams& params,
                                           std::uint32_t total_num_pages);
  // Pages that fit in memory_bytes (over all devices).
  static std::uint32_t pages_for_memory(const KVCacheParams& params, std::size_t memory_bytes);

  std::uint32_t page_size() const { return params().page_size; }

  std::vector<SeqId> claim(std::uint32_t n) override;
  using KVCacheManager::fetch;
  void fetch_into(KVCacheBatch& out, std::span<const SeqId> seqs,
                  std::span<const std::uint32_t> num_new_tokens,
                  std::uint32_t num_steps = 1) override;
  void step(std::span<const SeqId> seqs, std::span<const std::uint32_t> valid_lengths) override;
  void release(SeqId seq) override;
  std::uint32_t cache_length(SeqId seq) const override;
  bool contains(SeqId seq) const override;
  std::uint32_t num_active_sequences() const override;
  std::uint32_t total_blocks() const override;
  std::uint32_t free_blocks() const override;
  std::vector<std::size_t> block_shape(std::uint32_t n) const override;
  ManagerSnapshot snapshot() const override;
  void check_invariants() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache
