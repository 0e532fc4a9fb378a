// manager/tier_link.h — the paged manager's side of its tiers (internal).
//
// TierLink owns what the manager keeps for the tiers below its device pool
// (PrefixCacheConfig::tiers): the tiers themselves, the staging slots of the
// write-back, the store tickets in flight, the load jobs in flight (one per
// match_prefix that found pages in a tier) and the manager's per-tier
// counters. The manager calls it under its lock; nothing here does I/O:
// Tier::contains is an in-memory lookup, store and load only enqueue.
//
// Write-back: stage() copies an evicted page (packed [2][num_layers][block],
// PageBytes) and its tokens into a free staging slot (a page that was
// attached again, which may have come back from the tier, is first asked
// about in a contains() and skipped when the tier holds it); flush() hands
// the staged pages to the first tier in one store() once they are due
// (TierConfig::offload_batch staged, the oldest staged offload_delay ago, or
// forced) and finishes the store tickets that are done (freeing their slots,
// emitting the tier's stored events). The tier itself skips a page it holds
// already (StoreResult::present). A page that finds no free slot is dropped
// (counted), never waited for.
//
// Tier evictions: flush() also drains each tier's take_evicted() (the tier
// records under a leaf lock of its own; nothing here waits for a tier
// thread) and emits a `removed` event per key with the tier's name.
//
// Onboard: attachable() finds a key a job in flight is loading already (a
// sorted index of every job's keys); locate() tells, for the other keys of a
// run, which tier holds each (one contains() per tier); the manager makes a
// LoadJob for the pages nobody loads yet, commits it, and issue() enqueues
// one load() per tier into the device pages (interleaved pool) or into the
// job's staging (per_layer: unpacked when the manager settles the job). A
// job holds one reference on each of its pages, so they stay out of the free
// list while a tier may write them; its waiters are the sequences holding
// some of its pages (its own and those that attached them), and it lives
// until it is settled and none waits, even if every sequence is released.
//
// A pool apart (TierConfig::pool_apart): the K/V live in the caller's pool.
// stage() reserves a slot and fills everything but the bytes; the slot waits
// (awaiting) until hand_out() gives it to a fetch's batch (handed), and
// complete() submits the slots of that batch once the caller copied the
// bytes. A page a finished load filled in the host pool (loaded()) is
// host-fresh: its upload waits for hand_out(), and stage() packs it from the
// host pool as without a pool apart; taken() voids the upload of a page the
// manager hands out again.
//
// Several devices (manager/tier_shards.cpp): the tiers are levels x shards,
// level-major (TierConfig); keys chain with the shards' common digest and
// each shard's tier sees its own (shard_key). A staging slot holds every
// device's packed page; a write-back stores each shard to its tier of the
// first level; a level holds a page when all its shards do; a load reads
// each shard into its device's arena (or the job's staging) and a page is
// loaded when every shard is.
//
// Destruction waits for every ticket in flight (their buffers live here and
// in the pool). Not thread-safe: the manager locks.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvcache/batch.h"
#include "kvcache/manager.h"
#include "kvcache/prefix_cache.h"
#include "kvcache/tier.h"

namespace kvcache::prefix {
class PrefixStore;
}

namespace kvcache::manager {

// Where a page's bytes lie in a one-device pool and the tiers' packed form
// [2][num_layers][block]: an interleaved pool holds a page packed already,
// a per_layer pool holds 2 x num_layers runs of it, a pool apart.
class PageBytes {
 public:
  PageBytes(const KVCacheParams& params, std::byte* arena, std::uint32_t num_pages);
  std::size_t page_bytes() const { return run_bytes_ * runs_; }
  bool packed_in_place() const { return runs_ == 1; }
  // The page's bytes in the pool (packed_in_place() only).
  std::span<std::byte> in_place(std::uint32_t page) const {
    return {arena_ + std::size_t{page} * run_bytes_, run_bytes_};
  }
  void pack(std::uint32_t page, std::span<std::byte> out) const noexcept;
  void unpack(std::span<const std::byte> in, std::uint32_t page) const noexcept;

 private:
  std::byte* run(std::uint32_t page, std::uint32_t kv, std::uint32_t layer) const noexcept;
  std::byte* arena_;
  std::uint32_t num_layers_;
  std::size_t runs_;       // 1 (interleaved) or 2 x num_layers (per_layer)
  std::size_t run_bytes_;  // bytes of one run of one page
  std::size_t pitch_;      // bytes between a page's runs (per_layer)
};

// Throws InvalidArgument naming `tier` ("tier 'host'") and the first field
// of `have` that differs from `want`.
void check_fingerprint(const std::string& tier, const TierFingerprint& have,
                       const TierFingerprint& want);

// A page of a load job: which job (its id, never 0) and where in it.
struct LoadRef {
  std::uint64_t job = 0;  // 0: none
  std::uint32_t index = 0;
  bool valid() const { return job != 0; }
};

// The loads one match_prefix started: device pages the tiers fill, in chain
// order, and the sequences waiting for them.
struct LoadJob {
  std::uint32_t shards = 1;           // devices: tickets are levels x shards
  std::uint64_t id = 0;               // set by TierLink::add
  std::vector<SeqId> waiters;         // sequences holding pages of it, each once
  bool settled = false;               // done, and its staging unpacked (settle)
  bool used = false;                  // a sequence finished with its pages
  std::vector<std::uint8_t> kept;     // per page: a finished sequence kept it
  std::vector<std::uint32_t> pages;   // device pages, chain order
  std::vector<std::uint8_t> tier_of;  // which level holds each (every shard of it)
  std::vector<std::uint32_t> slot;    // its index in that level's load() calls
  std::vector<std::uint32_t> tokens;  // page_size per page (borrowed by the loads)
  std::vector<PageKey> keys;
  std::vector<std::byte> staging;         // per_layer pools: the packed pages [page][shard]
  std::vector<PageRead> reads;            // grouped by tier (level, then shard)
  std::vector<TierTicket> tickets;        // one per tier (default: none asked of it)
  std::vector<std::uint8_t> issue_threw;  // per tier: load() threw (its pages failed)

  std::size_t size() const { return pages.size(); }
  bool done() const;
  // Page i: loaded when every shard is, else the first shard's other result.
  LoadResult result(std::size_t i) const;
  // Page i's result from shard d's tier.
  LoadResult shard_result(std::size_t i, std::uint32_t d) const;
};

class TierLink {
 public:
  // Throws InvalidArgument when the tiers cannot serve this manager (no
  // prefix caching, a tier count not a multiple of n_devices, a shard range
  // past shard_count, a null tier, a level whose tiers differ in name, a
  // fingerprint field that differs, staging_pages out of range).
  static void check(const KVCacheParams& params, const TierConfig& config);
  // Throws InvalidArgument naming the field for staging_pages, offload_batch
  // or offload_delay out of range.
  static void check_ranges(const TierConfig& config);
  // Host bytes of the staging slots and of the eviction reports' buffer
  // (check_ranges first).
  static std::uint64_t staging_bytes(const KVCacheParams& params, const TierConfig& config);

  // arenas: one per device (params.n_devices).
  TierLink(const KVCacheParams& params, std::uint32_t num_pages, std::span<std::byte* const> arenas,
           const TierConfig& config, std::function<void(const PageEvent&)> on_event);
  ~TierLink();
  TierLink(const TierLink&) = delete;
  TierLink& operator=(const TierLink&) = delete;

  // Slots start kSlotAlign apart in one allocation aligned to kStagingAlign.
  static constexpr std::size_t kSlotAlign = 256, kStagingAlign = 4096;
  std::size_t num_tiers() const { return tiers_.size(); }
  // Every staging slot's bytes (one allocation, for the link's life).
  std::span<std::byte> staging() const noexcept { return {staging_.get(), staging_size_}; }
  const PageBytes& bytes() const { return bytes_.front(); }  // device 0's
  // Unpacks page q of a finished job from its staging into every device's
  // arena (a per_layer pool; an interleaved one was loaded in place).
  void unpack_loaded(const LoadJob& job, std::size_t q) const noexcept;
  std::uint32_t page_size() const { return page_size_; }
  // key_j from key_{j-1} and the page's tokens (kvcache/tier.h page_key,
  // computed without allocating); root(extra_key) is a chain's key_{-1}.
  PageKey key(PageKey parent, std::span<const std::uint32_t> tokens) const noexcept;
  // fp8: the keys from now on chain with the fingerprint's digest mixed with
  // these static scales' (KVScales::digest): pages written with other scales
  // are other keys. Keys already computed keep the scales they were made with.
  void set_kv_scales(const KVScales& scales) noexcept;
  static PageKey root(std::uint64_t extra_key) noexcept { return {0, extra_key}; }

  // ---- write-back
  // Stages a page `store` is evicting (still published) for the first tier.
  void stage(const prefix::PrefixStore& store, std::uint32_t page) noexcept;
  // Issues the staged pages' store() when they are due (or force), finishes
  // the stores that are done and reports the tiers' own evictions
  // (report_evictions).
  void flush(bool force = false) noexcept;

  // ---- onboard
  // tier_of values beside a tier's index: no tier holds the key, a job in
  // flight loads it already.
  static constexpr std::uint8_t kNoTier = 0xff;
  static constexpr std::uint8_t kInFlight = 0xfe;
  // For keys in chain order and tier_of (one entry a key): the keys whose
  // tier_of is kNoTier get the first tier holding them (one contains() per
  // tier, for those keys only); the returned run is the count of leading
  // keys whose tier_of is not kNoTier.
  std::size_t locate(std::span<const PageKey> keys, std::vector<std::uint8_t>& tier_of);
  // Whether some enabled tier holds key (one contains() per tier, up to the
  // first that does).
  bool any_holds(const PageKey& key);
  // A page a job not yet finished with loads under key, or loaded (a page
  // whose load came back otherwise is none); `hint` is tried first (the
  // next page of the previous key's job). O(log pages in flight).
  LoadRef attachable(const PageKey& key, LoadRef hint = {}) const noexcept;
  // Room for one more job of n pages (call before committing one: add() is
  // noexcept).
  void reserve_job(std::size_t n);
  // Sizes a job's buffers for n pages (throws bad_alloc before any commit).
  void prepare(LoadJob& job, std::size_t n) const;
  // The id add() gives the next job.
  std::uint64_t next_job_id() const noexcept { return next_job_id_; }
  // Adds a committed job and enqueues its loads (a load() that throws fails
  // its pages). Precondition: reserve_job().
  void add(LoadJob&& job) noexcept;
  // The job of that id, or nullptr.
  LoadJob* job(std::uint64_t id) noexcept;
  const LoadJob* job(std::uint64_t id) const noexcept;
  std::span<LoadJob> jobs() noexcept { return jobs_; }
  std::span<const LoadJob> jobs() const noexcept { return jobs_; }
  // Marks a done job settled: unpacks its loaded pages from the staging
  // (per_layer pools). Precondition: job.done().
  void settle(LoadJob& job) noexcept;
  // Counts a settled job's results per tier (once, when it goes: pages a
  // sequence kept are onboarded, pages that did not load failures) and emits
  // the tiers' removed events for pages a tier no longer holds.
  void count_results(const LoadJob& job) noexcept;
  // Removes job i (settled, no waiter left; the manager dropped its refs).
  void erase_job(std::size_t i) noexcept;
  // The index of attachable() sorted and covering every job's pages once,
  // waiters distinct, kept only where settled. Throws Error.
  void check_jobs() const;

  // ---- a pool apart (no-ops otherwise)
  bool pool_apart() const noexcept { return pool_apart_; }
  // Host bytes of the per-page upload state for num_pages pages.
  static std::uint64_t apart_bytes(std::uint32_t num_pages, const TierConfig& config);
  // A page a finished load filled in the host pool: its upload is pending.
  void loaded(std::uint32_t page) noexcept;
  // A page handed out again (take_page): a pending upload of it is void.
  void taken(std::uint32_t page) noexcept;
  // Capacities a fetch that evicts at most `evictions` pages needs for hand_out.
  std::size_t offload_bound(std::uint64_t evictions) const noexcept;
  std::size_t upload_bound() const noexcept { return uploads_.size(); }
  // Moves the waiting slots and the pending uploads into a batch's lists
  // (cleared first; capacities from the bounds) under a new serial.
  std::uint64_t hand_out(std::vector<BlockOffload>& offloads,
                         std::vector<std::uint32_t>& loads) noexcept;
  // Submits the slots handed out under `serial` to the first tier; returns
  // how many (0 when already completed).
  std::size_t complete(std::uint64_t serial) noexcept;
  // Every slot in exactly one state, the uploads listed once each. Throws Error.
  void check_slots() const;

  // Every store and load ticket not finished by the manager yet.
  std::vector<TierTicket> tickets_in_flight() const;
  std::uint32_t pending_pages() const noexcept;
  void fill(ManagerStats& stats) const;

 private:
  struct Slot {
    std::span<std::byte> bytes;  // in staging_
    std::vector<std::uint32_t> tokens;
    std::uint32_t page = 0;
    std::uint64_t hash = 0, parent_hash = 0, extra_key = 0;
    PageKey key;
    std::uint64_t serial = 0;  // pool apart: the hand_out that gave it to a batch
  };
  struct StoreBatch {
    std::vector<TierTicket> tickets;  // one per shard; fewer: a later shard's store() threw
    std::vector<std::uint32_t> slots;
    std::vector<PageWrite> writes;
  };
  struct Counters {
    std::uint64_t pages_offloaded = 0, offload_dropped = 0, pages_onboarded = 0, load_failures = 0;
  };
  void issue(LoadJob& job) noexcept;
  // check()'s part for the tiers' count, order, names and fingerprints.
  static void check_shards(const KVCacheParams& params, const TierConfig& config);
  // ---- several devices (tier_shards.cpp)
  Tier& tier(std::size_t level, std::uint32_t shard) const {
    return *tiers_[level * shards_ + shard];
  }
  bool level_enabled(std::size_t level) const;
  // held[k] = 1 when every shard of `level` holds chain key keys[k].
  std::vector<std::uint8_t> level_contains(std::size_t level, std::span<const PageKey> keys);
  // Packs page `page` of every device into a slot's bytes ([shard][page bytes]).
  void pack_shards(std::uint32_t page, std::span<std::byte> out) const noexcept;
  // Fills b.writes ([shard][slot], from b.slots) and issues one store() per
  // shard of the first level. Throws what allocating or the first shard's
  // store() throws (nothing in flight then); a later shard that throws is
  // logged and its pages fail (b.tickets stops short).
  void store_shards(StoreBatch& b, std::size_t n);
  // One evicted page not written: counted by every shard of the first level.
  void count_dropped(std::size_t pages) noexcept;
  // A finished batch's slot k: each shard's counters, the level's stored event.
  void count_stored(const StoreBatch& b, std::size_t k) noexcept;
  // Finishes the store batches that are done: from the oldest up to the
  // first in flight, or (all) every one.
  void reap(bool all) noexcept;
  bool held_by_first(const PageKey& key) noexcept;  // true too when the tier cannot answer
  // Whether the staged pages go to the tier now (see flush).
  bool due(bool force) const noexcept;
  // Hands every staged page to the first level in one store() per shard (a
  // refusal drops them, counted and logged).
  void issue_staged() noexcept;
  // With an event callback: a `removed` event (the tier's medium and the
  // page's key; page the sentinel num_pages, hashes 0, no tokens) for every
  // key each tier's take_evicted() reports.
  void report_evictions() noexcept;
  void emit(PageEvent::Kind kind, const Slot& info, std::size_t tier) const noexcept;

  std::vector<std::shared_ptr<Tier>> tiers_;  // levels x shards, level-major
  std::uint32_t shards_;                      // the manager's devices
  std::vector<PageKey> masks_;                // per shard: chain key -> its tier's key
  std::uint32_t num_pages_;  // the device pool's: the sentinel page of tier evictions
  std::vector<std::string> names_;
  std::uint64_t fingerprint_digest_;
  std::uint64_t digest_;  // what keys chain with: fingerprint_digest_, mixed with fp8 scales
  std::uint32_t page_size_;
  OffloadAdmission admission_;
  std::size_t batch_;                         // staged pages that make a store() due
  std::chrono::microseconds delay_;           // or the oldest staged this long ago
  std::chrono::nanoseconds staged_since_{0};  // coarse clock: when staged_ last became non-empty
  std::vector<PageBytes> bytes_;              // per device
  std::function<void(const PageEvent&)> on_event_;
  struct FreeStaging {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  using StagingMemory = std::unique_ptr<std::byte, FreeStaging>;
  StagingMemory staging_;         // every slot's bytes, kStagingAlign-aligned
  std::size_t staging_size_ = 0;  // slots x their stride
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_slots_;  // capacity: every slot
  std::vector<std::uint32_t> staged_;      // capacity: every slot
  std::vector<PageKey> evicted_;           // a tier's eviction reports; capacity: kEvictionReports
  std::vector<StoreBatch> stores_;
  std::vector<LoadJob> jobs_;
  // Every job's pages by key (sorted by key): attachable()'s index.
  struct InFlight {
    PageKey key;
    LoadRef ref;
  };
  std::vector<InFlight> in_flight_;  // capacity: reserve_job()
  std::uint64_t next_job_id_ = 1;
  std::vector<Counters> counters_;  // per tier
  // A pool apart.
  bool pool_apart_ = false;
  std::uint64_t serial_ = 0;
  std::vector<std::uint32_t> awaiting_;  // slots waiting for a fetch (capacity: every slot)
  std::vector<std::uint32_t> handed_;    // slots waiting for complete() (capacity: every slot)
  std::vector<std::uint8_t> fresh_;      // per page: its freshest bytes are in the host pool
  std::vector<std::uint32_t> uploads_;   // the fresh pages (capacity: every page)
};

}  // namespace kvcache::manager
