// kvcache/manager.h — the lifecycle interface shared by both managers.
//
// Order of calls for a request (seeds, MAX ContinuousBatchingKVCacheManager):
//   claim -> fetch -> (kernels write K/V) -> step -> fetch -> step ... -> release
//
// Lengths (DESIGN.md §3), defined once:
//   cache_length(seq)  tokens committed by `step` so far.
//   fetch(seqs, new, num_steps) guarantees room for
//       cache_length + new + (num_steps - 1) tokens per sequence, all or
//       nothing across the batch; kernels write new token i at cache_length + i.
//       (The continuous manager reserves its whole max_seq_len slot.)
//   step(seqs, valid)  cache_length += valid, never past what fetch reserved.
//   release(seq)       gives the sequence's memory back; releasing twice throws.
//
// Sequence ids (SeqIdPolicy): by default claim() never hands out an id twice,
// so a stale id (used after release) is always reported as unknown. With
// SeqIdPolicy::lowest_free (MAX's rule: ids lie in [0, max_batch_size)) claim
// returns the lowest ids not in use, so released ids come back.
//
// Errors: every method validates and throws a kvcache::Error subtype whose
// message names the value and the limit; a throwing call changes nothing
// (strong guarantee), which `snapshot()` lets tests verify.
// Thread-safety: every method may be called concurrently from any thread
// (one internal mutex per manager). Views/batches are not protected: don't
// step or release a sequence while another thread still uses its batch.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcache/batch.h"
#include "kvcache/kv_scales.h"
#include "kvcache/params.h"

namespace kvcache {

// One sequence as the manager sees it (tests, debugging).
struct SequenceSnapshot {
  SeqId id = 0;
  std::uint32_t cache_length = 0;
  std::uint32_t reserved_length = 0;  // room guaranteed by the last fetch
  std::vector<std::uint32_t> blocks;  // page table (paged) or {slot} (continuous)
  friend bool operator==(const SequenceSnapshot&, const SequenceSnapshot&) = default;
};

// The whole bookkeeping state; two snapshots compare equal iff nothing changed.
struct ManagerSnapshot {
  std::vector<SequenceSnapshot> sequences;  // sorted by id
  std::vector<std::uint32_t> free_blocks;   // sorted
  std::vector<std::uint32_t> ref_counts;    // per block
  SeqId next_seq_id = 0;
  // Paged prefix cache: pages in the hash index (sorted) and their pin
  // priorities (same order); empty without prefix caching.
  std::vector<std::uint32_t> cached_blocks;
  std::vector<std::uint32_t> cached_priorities;
  friend bool operator==(const ManagerSnapshot&, const ManagerSnapshot&) = default;
};

// One tier below the paged manager's device pool (PrefixCacheConfig::tiers)
// in a ManagerStats reading: the tier's own figures (TierStats, read with
// the manager's) and what the manager did with it. Counters run from
// construction (reset_metrics leaves them). With several devices, one per
// device shard of each level (TierConfig's order), the page counts its own.
struct TierFigures {
  std::string name;          // Tier::name(): the metrics' and events' tier label
  std::uint32_t device = 0;  // the manager's device whose shard the tier holds
  bool enabled = true;
  // The tier's own (TierStats).
  std::uint64_t pages_held = 0;
  std::uint64_t bytes_held = 0;
  std::uint64_t capacity_bytes = 0;  // UINT64_MAX: unlimited
  std::uint64_t lookups = 0;         // keys asked of contains()
  std::uint64_t hits = 0;
  std::uint64_t pages_stored = 0;
  std::uint64_t bytes_stored = 0;
  std::uint64_t pages_loaded = 0;
  std::uint64_t bytes_loaded = 0;
  std::uint64_t evictions = 0;
  std::uint64_t corrupt = 0;
  std::uint64_t io_errors = 0;
  std::uint64_t load_nanoseconds = 0;  // summed over its loads
  // The manager's.
  std::uint64_t pages_offloaded = 0;  // evicted device pages the tier stored
  std::uint64_t offload_dropped = 0;  // evicted pages not written: staging full, refused, failed
  std::uint64_t pages_onboarded = 0;  // pages loaded back into the device pool
  std::uint64_t load_failures = 0;    // loads that came back missing, mismatch, corrupt or failed
  friend bool operator==(const TierFigures&, const TierFigures&) = default;
};

// One reading of a manager's figures, taken at one instant under its lock
// (stats(); kvcache/metrics.h formats it for Prometheus). Blocks are pages
// (paged) or slots (continuous); free + used + cached = total. The lifecycle
// counters run from construction; the paged manager's prefix-cache counters
// (prefix_*, blocks_published, evictions, cow_copies) are PrefixCacheMetrics'
// and go back to 0 with reset_metrics(). Zero where a strategy has no such
// thing (a continuous manager caches, forks and copies nothing).
struct ManagerStats {
  std::uint32_t blocks_total = 0;
  std::uint32_t blocks_free = 0;    // on the free list
  std::uint32_t blocks_used = 0;    // held by a sequence
  std::uint32_t blocks_cached = 0;  // prefix cache: held by none, evictable
  std::uint32_t blocks_pinned = 0;  // prefix cache: pinned (used or cached)
  std::uint32_t page_size = 0;      // tokens a block holds: page_size or max_seq_len
  std::uint32_t active_sequences = 0;
  std::uint64_t pool_bytes = 0;  // the blocks' memory over all devices (estimated_memory_size)
  // Lifecycle counters: calls that succeeded.
  std::uint64_t sequences_claimed = 0;   // ids claim handed out
  std::uint64_t sequences_forked = 0;    // children fork made
  std::uint64_t sequences_released = 0;  // release calls
  std::uint64_t fetches = 0;             // fetch / fetch_into calls
  std::uint64_t steps = 0;               // step calls (every overload)
  std::uint64_t committed_tokens = 0;    // tokens those steps committed
  // Prefix cache (PrefixCacheMetrics).
  std::uint64_t prefix_lookups = 0;        // match_prefix calls
  std::uint64_t prefix_prompt_tokens = 0;  // prompt tokens they were given
  std::uint64_t prefix_hit_tokens = 0;     // tokens they attached from the cache
  std::uint64_t blocks_published = 0;      // pages entered into the hash index
  std::uint64_t evictions = 0;             // cached pages evicted for reuse
  std::uint64_t cow_copies = 0;            // copy-on-write page copies
  // Tiers below the device pool, nearest first (paged with tiers only).
  std::uint32_t pending_loads = 0;  // pages being loaded from a tier now (gauge)
  std::vector<TierFigures> tiers;
  friend bool operator==(const ManagerStats&, const ManagerStats&) = default;
};

// How claim() (and fork()) choose new sequence ids.
enum class SeqIdPolicy : std::uint8_t {
  never_reuse,  // 0, 1, 2, ... never reused: a stale id is always unknown (default)
  lowest_free,  // the lowest ids not in use, all in [0, max_batch_size) (MAX)
};

class PagedKVCacheManager;

class KVCacheManager {
 public:
  virtual ~KVCacheManager() = default;
  KVCacheManager(const KVCacheManager&) = delete;
  KVCacheManager& operator=(const KVCacheManager&) = delete;

  const KVCacheParams& params() const { return params_; }
  std::uint32_t max_batch_size() const { return max_batch_size_; }
  std::uint32_t max_seq_len() const { return max_seq_len_; }
  SeqIdPolicy seq_id_policy() const { return seq_id_policy_; }

  // n new sequence ids with cache length 0, all or nothing, chosen by
  // seq_id_policy() (ascending). Throws InvalidArgument for n == 0,
  // CapacityExceeded past max_batch_size (or free slots).
  virtual std::vector<SeqId> claim(std::uint32_t n) = 0;

  // Room for this step; see the header comment. num_new_tokens[b] belongs to
  // seqs[b]. Throws InvalidArgument (size mismatch, duplicate ids,
  // num_steps == 0, empty batch), UnknownSequence, CapacityExceeded
  // (max_seq_len), OutOfPages (paged pool exhausted).
  KVCacheBatch fetch(std::span<const SeqId> seqs, std::span<const std::uint32_t> num_new_tokens,
                     std::uint32_t num_steps = 1);
  // The seeds' fetch(seq_ids): no new tokens named. A continuous slot is
  // reserved whole (any step that fits the slot commits); a paged sequence
  // gets room for what it holds, so name the tokens to write new ones.
  KVCacheBatch fetch(std::span<const SeqId> seqs);
  // Same, reusing `out`'s buffers (no allocation once they are large enough).
  // On throw `out` is unchanged.
  virtual void fetch_into(KVCacheBatch& out, std::span<const SeqId> seqs,
                          std::span<const std::uint32_t> num_new_tokens,
                          std::uint32_t num_steps = 1) = 0;

  // Commit valid_lengths[b] tokens for seqs[b]. Throws InvalidArgument,
  // UnknownSequence, CapacityExceeded (more than fetch reserved).
  virtual void step(std::span<const SeqId> seqs, std::span<const std::uint32_t> valid_lengths) = 0;
  // The Mojo seed's step(valid_lengths, inflight_cache): commits
  // valid_lengths[b] tokens for the batch's entry b (its seq_ids()). A
  // template so that braced calls step({...}, {...}) still mean the overload
  // above.
  template <std::same_as<KVCacheBatch> Batch>
  void step(std::span<const std::uint32_t> valid_lengths, const Batch& inflight_cache) {
    step(inflight_cache.seq_ids(), valid_lengths);
  }

  // Throws UnknownSequence if seq is not claimed (never, or already released).
  virtual void release(SeqId seq) = 0;

  virtual std::uint32_t cache_length(SeqId seq) const = 0;  // throws UnknownSequence
  virtual bool contains(SeqId seq) const = 0;
  virtual std::uint32_t num_active_sequences() const = 0;

  // Blocks = pages (paged) or slots (continuous).
  virtual std::uint32_t total_blocks() const = 0;
  virtual std::uint32_t free_blocks() const = 0;
  std::uint32_t used_blocks() const { return total_blocks() - free_blocks(); }

  // Shape of the blocks tensor for n blocks (per device), e.g. continuous
  // [n_sequences, 2, num_layers, max_seq_len, n_kv_heads_per_device, head_dim]
  // (the last three as [heads, tokens, head_dim] with PageLayout::hnd); with
  // PoolArrangement::per_layer the first three are [num_layers, 2, n]. An
  // int8 block is its values and then its scales (cache_desc.h): the last
  // three are one dimension of page_size * heads * (head_dim + 4) bytes.
  virtual std::vector<std::size_t> block_shape(std::uint32_t n) const = 0;

  // MAX increment_cache_lengths: forwards to batch.increment_cache_lengths.
  void increment_cache_lengths(KVCacheBatch& batch,
                               std::span<const std::uint32_t> prev_row_offsets) const {
    batch.increment_cache_lengths(prev_row_offsets);
  }

  // The paged manager behind this interface, or nullptr for a continuous
  // one: the capability to fork, truncate, match and pin prefixes, and to
  // commit token ids (kvcache/paged_manager.h), without a downcast.
  virtual PagedKVCacheManager* paged() noexcept { return nullptr; }
  virtual const PagedKVCacheManager* paged() const noexcept { return nullptr; }

  // The figures above and the counters at one instant (ManagerStats).
  virtual ManagerStats stats() const = 0;

  virtual ManagerSnapshot snapshot() const = 0;
  // Audits ref counts, free list, tables and lengths; throws kvcache::Error
  // describing the first inconsistency. For tests and debugging.
  virtual void check_invariants() const = 0;

  // fp8 caches: the static K/V scales the kernels read (kv_scales.h);
  // every scale is 1 until set. `scales` must have params().num_layers
  // layers and params().n_kv_heads heads. Refused (InvalidArgument, nothing
  // changed) for a cache that is not fp8, another shape, or while any
  // sequence is active (its stored codes were written with the old scales).
  // Pages a prefix cache keeps were written with the scales of their time:
  // reset the prefix cache when changing them on a serving manager. A paged
  // manager's tier keys include the scales (KVScales::digest), so pages a
  // tier holds from other scales are never loaded (docs/tiers.md). Not
  // synchronised with other calls: set the scales before serving.
  void set_kv_scales(const KVScales& scales);
  // The scales set (all 1 by default); empty (0 layers) unless fp8.
  const KVScales& kv_scales() const { return kv_scales_; }

 protected:
  // Throws InvalidArgument for bad params, a zero size or a policy outside SeqIdPolicy.
  KVCacheManager(const KVCacheParams& params, std::uint32_t max_batch_size,
                 std::uint32_t max_seq_len, SeqIdPolicy seq_id_policy);

 private:
  KVCacheParams params_;
  std::uint32_t max_batch_size_;
  std::uint32_t max_seq_len_;
  SeqIdPolicy seq_id_policy_;
  KVScales kv_scales_;
  // kv_scales_ per device, [n_devices][num_layers][2][n_kv_heads_per_device]
  // (CacheDesc::head_scales of device d at d * num_layers * 2 * heads).
  std::vector<float> device_scales_;

 protected:
  // Fills kv_scales_ and device_scales_ (strong guarantee).
  void set_device_scales(const KVScales& scales);
  // Called by set_kv_scales once the new scales are in place (noexcept).
  virtual void kv_scales_changed() noexcept {}
  // What fetch puts in a batch (KVCacheBatch::head_scales_): null unless fp8.
  const float* device_scales() const {
    return device_scales_.empty() ? nullptr : device_scales_.data();
  }
};

}  // namespace kvcache
