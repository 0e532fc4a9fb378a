// kvcache/paged_manager.h — a paged KV cache manager (vLLM / MAX style).
//
// One pool of total_num_pages pages per device:
//   blocks[total_num_pages][2][num_layers][page_size][n_kv_heads_per_device][head_dim]
// (the interleaved arrangement; per_layer: [num_layers][2][blocks][...], params.h)
// One page id covers every layer's K and V for page_size tokens, so a sequence
// has ONE page table. fetch() allocates the pages a batch needs, all or
// nothing (OutOfPages names what was needed and what was free); pages are
// taken from an index-based free list in O(1) with no heap allocation per
// step in steady state. Unused lookup_table entries hold the sentinel
// total_num_pages. release() returns pages whose ref count drops to zero.
//
// Prefix caching (params.enable_prefix_caching, see prefix_cache.h): the
// manager keeps each sequence's committed token ids (step's token overload);
// every page that becomes full is hashed and published in the hash index.
// release() keeps published pages as evictable cache entries (ref count 0);
// match_prefix() attaches them to a fresh sequence. Pages with ref count > 0
// are never evicted. fetch() takes free pages first, then evicts; its
// all-or-nothing check counts evictable pages as available.
//
// Sharing: fork() shares every page with a child; the first write into a
// shared page (a partial page after fork, or a page cut by truncate) copies
// it inside fetch (copy-on-write: all layers, K and V, every device).
// truncate() rolls a sequence back (speculative decoding).
//
// Complexity: O(1) per page for fetch/step/release/evict (hashing a page is
// O(page_size)); no heap allocation per step in steady state except the
// growth of a sequence's token and page vectors.
// Thread-safe (see manager.h); the event callback runs under the lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvcache/manager.h"
#include "kvcache/prefix_cache.h"

namespace kvcache {

class PagedKVCacheManager final : public KVCacheManager {
 public:
  // params.cache_strategy must be paged. max_seq_len caps one sequence;
  // max_batch_size caps claimed sequences; seq_id_policy picks the ids claim
  // and fork hand out (manager.h). Throws InvalidArgument, or OutOfMemory
  // when the pool or its bookkeeping cannot be allocated.
  PagedKVCacheManager(const KVCacheParams& params, std::uint32_t total_num_pages,
                      std::uint32_t max_batch_size, std::uint32_t max_seq_len,
                      SeqIdPolicy seq_id_policy = SeqIdPolicy::never_reuse);
  // Same, with a prefix-cache configuration (policy, hash function, events).
  // Throws InvalidArgument for a bad config (e.g. s3fifo_small_fraction).
  PagedKVCacheManager(const KVCacheParams& params, std::uint32_t total_num_pages,
                      std::uint32_t max_batch_size, std::uint32_t max_seq_len,
                      PrefixCacheConfig config,
                      SeqIdPolicy seq_id_policy = SeqIdPolicy::never_reuse);
  ~PagedKVCacheManager() override;

  // Bytes of a pool of total_num_pages pages over all devices: the K/V
  // arena the manager maps (and a device pool of the same shape needs).
  // Throws InvalidArgument for bad params or a product past 2^64 (naming
  // the factors).
  static std::size_t estimated_memory_size(const KVCacheParams& params,
                                           std::uint32_t total_num_pages);
  // Host bytes of the manager's per-page bookkeeping beside that pool:
  // ref counts and the free list (8 per page); with prefix caching also the
  // page metadata, the stored token ids (4 x page_size per page), the hash
  // index and the eviction policy's arrays and ghost (policy and
  // ghost_factor from `config`). Per-sequence state (page tables, token
  // lists) and pinned entries grow with use and are not included. Counted
  // beside estimated_memory_size, not in it: with a device pool the two live
  // in different memories. Throws InvalidArgument (bad params or config).
  static std::size_t estimated_bookkeeping_size(const KVCacheParams& params,
                                                std::uint32_t total_num_pages,
                                                const PrefixCacheConfig& config = {});
  // Pages that fit in memory_bytes (over all devices).
  static std::uint32_t pages_for_memory(const KVCacheParams& params, std::size_t memory_bytes);

  std::uint32_t page_size() const { return params().page_size; }

  std::vector<SeqId> claim(std::uint32_t n) override;
  using KVCacheManager::fetch;
  void fetch_into(KVCacheBatch& out, std::span<const SeqId> seqs,
                  std::span<const std::uint32_t> num_new_tokens,
                  std::uint32_t num_steps = 1) override;
  // Without prefix caching: commits valid_lengths[b] tokens for seqs[b].
  // With prefix caching it would leave the manager without the tokens' ids
  // (so it could never publish the sequence's later pages): it throws
  // InvalidArgument, changing nothing, when it would commit tokens to a
  // sequence whose ids the manager still knows; use the token_ids overload,
  // or step_without_token_ids to give that up on purpose.
  using KVCacheManager::step;  // the seed's step(valid_lengths, inflight_batch)
  void step(std::span<const SeqId> seqs, std::span<const std::uint32_t> valid_lengths) override;
  // step that also commits the tokens' ids (flat, sum(valid_lengths) long,
  // in batch order); with prefix caching, pages that became full are
  // published. Throws InvalidArgument on a size mismatch.
  void step(std::span<const SeqId> seqs, std::span<const std::uint32_t> valid_lengths,
            std::span<const std::uint32_t> token_ids);
  // step without the ids, on purpose: with prefix caching the sequences that
  // commit tokens stop publishing (their later pages stay private; pages
  // already published stay cached).
  void step_without_token_ids(std::span<const SeqId> seqs,
                              std::span<const std::uint32_t> valid_lengths);
  void release(SeqId seq) override;
  // release that tells the eviction policy whether a later request is
  // expected to start with this sequence's tokens (kvcache/prefix_cache.h;
  // only `tiered` acts on it). The hint applies to the pages this release
  // makes evictable. Throws UnknownSequence, InvalidArgument (a value
  // outside ReuseHint; nothing released).
  void release(SeqId seq, ReuseHint hint);

  // Attaches to a freshly claimed sequence (no pages, length 0) the cached
  // pages of the longest cached prefix of full pages of prompt_tokens under
  // extra_key, leaving at least one prompt token to compute; sets its cache
  // length (and reserved room) to the tokens reused and returns that count.
  // The sequence keeps extra_key for the pages it publishes later. With
  // tiers, the prefix goes on past the device index into the tiers (see
  // "Tiers" below): the count includes pages still loading. Throws
  // InvalidArgument (prefix caching disabled: enable_prefix_caching; seq not
  // fresh), UnknownSequence.
  std::uint32_t match_prefix(SeqId seq, std::span<const std::uint32_t> prompt_tokens,
                             std::uint64_t extra_key = 0);

  // ---- Tiers (PrefixCacheConfig::tiers, kvcache/tier.h, docs/tiers.md) ----
  // Write-back: a published page the pool evicts is copied (packed
  // [2][num_layers][block], both arrangements) into a staging slot and
  // handed to the first tier's store(); the eviction never waits (no free
  // slot: the page is not written, TierFigures::offload_dropped).
  // Onboard: match_prefix hashes the prompt's remaining full pages into
  // 128-bit keys (chained from {0, extra_key}), asks each tier once which it
  // holds (contains(), first tier first, the next for what is still
  // missing), takes device pages for the leading run of hits (as many as
  // are free or evictable) and enqueues one load() per tier into them
  // (straight into an interleaved pool; a per_layer pool through staging,
  // scattered when the load finishes). Pages another sequence's loads are
  // filling already are not read again: the sequence attaches those device
  // pages (a reference each) and waits for those loads too. Those pages are
  // pending: the sequence's cache_length counts them, but fetch /
  // fetch_into, fork and truncate throw InvalidArgument naming it until
  // every load it waits for is finished by poll_loads, wait_loads or
  // wait_tiers. Finishing publishes the loaded pages in the device index; a
  // page that comes back missing, mismatch, corrupt or failed ends the hit
  // there for every sequence holding it: it and the pages after it are
  // released and cache_length drops to the pages before it (the prefix
  // computes the rest). release() of a loading sequence is allowed (the
  // pages go back to the free list when the loads end; sequences that
  // attached them keep them). No I/O runs under
  // the manager's lock (contains is in memory; store and load enqueue).
  // A pool kept apart from the manager's (TierConfig::pool_apart, a GPU
  // pool): the K/V are in the caller's pool and the manager's pool is a
  // host bounce buffer for loads. An evicted page waits in a staging slot
  // (no bytes copied) until the next fetch hands it out
  // (KVCacheBatch::block_offloads: the caller copies the page from its pool
  // into the slot before the batch's kernels, then calls
  // complete_offloads); a page whose freshest bytes are still the host
  // pool's (loaded, not yet handed out) is packed from there as above.
  // Finished loads are handed out by the next fetch
  // (KVCacheBatch::block_loads: host pool -> the caller's pool). The order
  // of a batch's transfers: kvcache/batch.h; a CUDA helper doing them:
  // kvcache/cuda/tier_transfers.h.
  bool has_tiers() const noexcept;
  // The write-back staging slots' memory (TierConfig::staging_pages slots,
  // one allocation aligned to 4 KiB, alive as long as the manager; empty
  // without tiers). Every BlockOffload::bytes lies in it: a pool apart on a
  // GPU registers it once (kvcache/cuda/host_registration.h) so the offload
  // copies are DMA into pinned memory. Write into it only through
  // block_offloads.
  std::span<std::byte> tier_staging() const noexcept;
  // A pool apart: hands the write-backs `batch` (a fetch of this manager)
  // handed out to the first tier, once the caller copied their bytes
  // (block_offloads). Returns how many; 0 for a batch without offloads or
  // one completed already. Slots never completed stay reserved: later
  // evictions that find no free slot skip their write-back (counted as
  // offload_dropped), never wait. Throws InvalidArgument, changing nothing,
  // for a batch with offloads from another manager.
  std::size_t complete_offloads(const KVCacheBatch& batch);
  // Whether seq has pages still loading from a tier (false without tiers);
  // a scheduler leaves it out of the batch until this turns false.
  // Throws UnknownSequence.
  bool has_pending_loads(SeqId seq) const;
  // Finishes the loads that are done (never waits) and the write-backs that
  // are done; returns the sequences whose loads it finished (ready for
  // fetch; some may have been truncated). Empty without tiers.
  std::vector<SeqId> poll_loads();
  // Waits (outside the lock) until seq's loads are done (its own and those
  // of other sequences it attached pages of), then finishes them (and every
  // other finished load). Throws UnknownSequence.
  void wait_loads(SeqId seq);
  // Waits until every load and write-back in flight is done and finishes
  // them (tests, replay, shutdown).
  void wait_tiers();

  // A new sequence sharing every page of seq that holds committed tokens
  // (ref count +1), with the same length, tokens and extra key; its id
  // follows seq_id_policy() like claim's. Throws
  // UnknownSequence, CapacityExceeded (max_batch_size).
  SeqId fork(SeqId seq);

  // Rolls seq back to new_length tokens (<= cache_length): pages past it are
  // released (published ones stay cached); a published page that the cut
  // makes partial is unpublished if only seq holds it (else copied on the
  // next write). Reserved room becomes new_length. Throws InvalidArgument,
  // UnknownSequence.
  void truncate(SeqId seq, std::uint32_t new_length);

  // Pins the cached full pages of this prefix with priority > 0 (evicted
  // only when no unpinned page is evictable, lowest priority first);
  // priority 0 unpins. Returns the tokens covered. Throws InvalidArgument
  // when prefix caching is disabled.
  std::uint32_t pin_prefix(std::span<const std::uint32_t> tokens, std::uint32_t priority,
                           std::uint64_t extra_key = 0);

  // Drops every cache entry: evictable pages go to the free list, pages in
  // use stay with their sequences but leave the index (removed events).
  void reset_prefix_cache();

  PrefixCacheMetrics metrics() const;
  void reset_metrics();
  std::uint32_t cache_length(SeqId seq) const override;
  bool contains(SeqId seq) const override;
  std::uint32_t num_active_sequences() const override;
  std::uint32_t total_blocks() const override;
  std::uint32_t free_blocks() const override;
  std::vector<std::size_t> block_shape(std::uint32_t n) const override;
  PagedKVCacheManager* paged() noexcept override { return this; }
  const PagedKVCacheManager* paged() const noexcept override { return this; }
  ManagerStats stats() const override;
  ManagerSnapshot snapshot() const override;
  void check_invariants() const override;

 private:
  void kv_scales_changed() noexcept override;
  void step_ids_unknown(std::span<const SeqId> seqs, std::span<const std::uint32_t> valid_lengths,
                        bool on_purpose);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache
