// kvcache/continuous_manager.h — MAX's ContinuousBatchingKVCacheManager.
//
// Every sequence owns one slot of max_seq_len tokens:
//   blocks[max_batch_size][2][num_layers][max_seq_len][n_kv_heads_per_device][head_dim]
// (the interleaved arrangement; per_layer: [num_layers][2][blocks][...], params.h)
// claim() takes free slots (CapacityExceeded when none), fetch() only checks
// that cache_length + new + num_steps - 1 <= max_seq_len and reserves the
// whole slot (reserved_length = max_seq_len), so after a fetch `step` may
// commit any count that fits the slot, whatever num_new_tokens said;
// release() frees the slot. lookup_table[b] is the slot of batch entry b.
// Seq ids follow the SeqIdPolicy (manager.h): by default never reused, so a
// stale id is always reported as unknown.
// Thread-safe (see manager.h). The manager owns the block memory (page-aligned,
// zero-initialised) and frees it on destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvcache/manager.h"

namespace kvcache {

class ContinuousBatchingKVCacheManager final : public KVCacheManager {
 public:
  // params.cache_strategy must be continuous. Throws InvalidArgument (bad
  // params, zero sizes, a policy outside SeqIdPolicy) or OutOfMemory.
  ContinuousBatchingKVCacheManager(const KVCacheParams& params, std::uint32_t max_batch_size,
                                   std::uint32_t max_seq_len,
                                   SeqIdPolicy seq_id_policy = SeqIdPolicy::never_reuse);
  ~ContinuousBatchingKVCacheManager() override;

  // Bytes the blocks occupy over all devices (seed's classmethod).
  static std::size_t estimated_memory_size(const KVCacheParams& params,
                                           std::uint32_t max_batch_size, std::uint32_t max_seq_len);

  std::vector<SeqId> claim(std::uint32_t n) override;
  using KVCacheManager::fetch;
  void fetch_into(KVCacheBatch& out, std::span<const SeqId> seqs,
                  std::span<const std::uint32_t> num_new_tokens,
                  std::uint32_t num_steps = 1) override;
  using KVCacheManager::step;  // the seed's step(valid_lengths, inflight_batch)
  void step(std::span<const SeqId> seqs, std::span<const std::uint32_t> valid_lengths) override;
  void release(SeqId seq) override;
  std::uint32_t cache_length(SeqId seq) const override;
  bool contains(SeqId seq) const override;
  std::uint32_t num_active_sequences() const override;
  std::uint32_t total_blocks() const override;
  std::uint32_t free_blocks() const override;
  std::vector<std::size_t> block_shape(std::uint32_t n) const override;
  ManagerStats stats() const override;
  ManagerSnapshot snapshot() const override;
  void check_invariants() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache
