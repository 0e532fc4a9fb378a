// The page side of prefix caching (internal): what the paged manager asks of
// its prefix cache, as one class (vLLM's BlockPool owns the same things).
//
// For a pool of pages it owns each page's prefix metadata (chain hash,
// parent page and generation, extra key, pin priority), the token ids a
// published page holds, the hash -> page index, the eviction policy over
// cached pages (published, ref count 0), the pinned set, the page events and
// the prefix counters. The manager keeps the page tables, the pool (the ref
// counts and the free list this class borrows) and the lifecycle; it asks the
// store to publish a full page, to find the longest cached chain of a prompt,
// to hand out a page (free list first, then an eviction), to drop a
// reference, to attach a cached page, to pin and to reset.
//
// Invariants (check()): a published page is indexed under its hash, its
// stored tokens hash to it, and when its ref count is 0 it is evictable
// exactly once (in the policy, or in the pinned set if pinned); a page in use
// is never evictable.
// Not thread-safe: the manager locks. No allocation after construction,
// except the pinned set (one node per pinned evictable page).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "kvcache/manager.h"
#include "kvcache/prefix_cache.h"
#include "memory/block_pool.h"
#include "prefix/eviction_policy.h"
#include "prefix/page_index.h"

namespace kvcache::prefix {

class PrefixStore {
 public:
  struct Match {
    std::uint32_t page;
    std::uint64_t hash;
  };

  // Pages of `pool` (borrowed; must outlive the store) of page_size tokens.
  // Throws InvalidArgument for a bad config.
  PrefixStore(memory::BlockPool& pool, std::uint32_t page_size, PrefixCacheConfig config);

  // Host bytes a store of num_pages allocates (metadata, stored tokens,
  // index, policy and ghost); the pinned set is not included.
  static std::uint64_t bytes_for(std::uint32_t num_pages, std::uint32_t page_size,
                                 const PrefixCacheConfig& config);

  // The chain hash of a page: config.hash (default: XXH3-64).
  std::uint64_t hash(std::uint64_t parent_hash, std::span<const std::uint32_t> tokens,
                     std::uint64_t extra_key) const {
    return config_.hash(parent_hash, tokens, extra_key);
  }

  bool published(std::uint32_t page) const { return meta_[page].published; }
  std::uint64_t hash_of(std::uint32_t page) const { return meta_[page].hash; }
  std::uint32_t pin_of(std::uint32_t page) const { return meta_[page].pin; }
  std::uint32_t num_evictable() const {
    return policy_->size() + static_cast<std::uint32_t>(pinned_.size());
  }
  std::uint32_t num_pinned() const { return num_pinned_; }

  // The longest chain of published pages holding the first full pages of
  // `tokens` under extra_key (at most max_pages), each verified against its
  // stored tokens, extra key and parent (id and generation): a colliding
  // hash never matches. Appends to out (reserve it first).
  void walk(std::span<const std::uint32_t> tokens, std::uint64_t extra_key, std::uint32_t max_pages,
            std::vector<Match>& out) const;

  // Publishes full page `page` holding `tokens` under `hash`, the next page
  // of `parent` (num_pages for a sequence's first page) whose hash is
  // parent_hash. Does nothing when the index already holds the hash
  // (duplicate content or a collision: the page stays private). extension:
  // published by a sequence that started from a cached prefix.
  void publish(std::uint32_t page, std::uint32_t parent, std::uint64_t hash,
               std::uint64_t parent_hash, std::uint64_t extra_key,
               std::span<const std::uint32_t> tokens, bool extension);
  // Removes a page from the index (it stays wherever its references are).
  void unpublish(std::uint32_t page);

  // A page with ref count 1: from the free list, else an evicted cached page
  // (unpublished first). Precondition: pool free + num_evictable() > 0.
  std::uint32_t take_page();
  // Drops one reference; a published page at ref 0 becomes evictable (with
  // the releasing caller's hint), an unpublished one goes back to the pool.
  void drop_ref(std::uint32_t page, ReuseHint hint = ReuseHint::unknown);
  // A matched page gains a reference (leaving the evictable set at ref 0)
  // and counts as a hit for the policy.
  void attach(std::uint32_t page);
  // Sets a published page's pin priority (0 unpins), keeping it evictable
  // exactly once if its ref count is 0.
  void set_pin(std::uint32_t page, std::uint32_t priority);
  // Drops every entry: evictable pages go to the free list, pages in use stay
  // with their sequences but leave the index.
  void reset();

  // Counters the store keeps (pages_published, evictions).
  const PrefixCacheMetrics& counters() const { return counters_; }
  void reset_counters() { counters_ = PrefixCacheMetrics{}; }

  // Published pages (ascending) and their pins, for ManagerSnapshot.
  void snapshot(ManagerSnapshot& snap) const;
  // Throws kvcache::Error naming the first broken invariant; refs[p] is
  // page p's page-table references, on_free_list[p] whether it is free.
  void check(std::span<const std::uint32_t> refs, std::span<const std::uint8_t> on_free_list) const;
  // The tokens page holds (its first `page_size`; meaningful when published).
  std::span<const std::uint32_t> stored_tokens(std::uint32_t page) const {
    return {page_tokens_.data() + std::size_t{page} * page_size_, page_size_};
  }

 private:
  struct PageMeta {
    std::uint64_t hash = 0;
    std::uint64_t parent_hash = 0;
    std::uint64_t extra_key = 0;
    std::uint32_t parent = 0;      // parent page id, or num_pages for a first page
    std::uint32_t parent_gen = 0;  // parent's generation when this page was published
    std::uint32_t gen = 0;         // bumped whenever the page leaves the index
    std::uint32_t pin = 0;         // pin priority, 0 = unpinned
    bool published = false;
  };

  std::uint32_t num_pages() const { return pool_.num_blocks(); }
  void emit(PageEvent::Kind kind, std::uint32_t page) const noexcept;
  void make_evictable(std::uint32_t page, ReuseHint hint = ReuseHint::unknown);
  void make_unevictable(std::uint32_t page);

  memory::BlockPool& pool_;
  std::uint32_t page_size_;
  PrefixCacheConfig config_;
  PageIndex index_;
  std::vector<PageMeta> meta_;
  std::vector<std::uint32_t> page_tokens_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::set<std::pair<std::uint32_t, std::uint32_t>> pinned_;  // evictable pinned (pin, page)
  std::uint32_t num_pinned_ = 0;                              // published pages with pin > 0
  PrefixCacheMetrics counters_;
};

}  // namespace kvcache::prefix
