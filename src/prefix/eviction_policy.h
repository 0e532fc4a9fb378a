// Eviction policies for cached pages (ref count 0, still in the hash index).
//
// The manager tells a policy when a page enters the index (on_publish), when
// a request reuses it (on_hit), when it becomes evictable (insert: its ref
// count dropped to 0, with the releasing caller's hint, `unknown` when the
// page became evictable for another reason, e.g. unpinning) and when it stops being evictable
// (erase: reused again or unpublished). evict() picks a victim among the inserted pages and removes
// it; on_unpublish when it leaves the index. Every operation is O(1) (amortised for S3-FIFO's
// second chances) and allocates nothing after construction: per-page state lives in arrays sized to
// the pool. Not thread-safe: the owning manager locks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvcache/prefix_cache.h"

namespace kvcache::prefix {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // extension: published by a sequence that started from a cached prefix.
  virtual void on_publish(std::uint32_t page, std::uint64_t hash, bool extension) = 0;
  virtual void on_hit(std::uint32_t page) = 0;
  // precondition: !contains(page)
  virtual void insert(std::uint32_t page, ReuseHint hint) = 0;
  virtual void erase(std::uint32_t page) = 0;  // precondition: contains(page)
  virtual std::uint32_t evict() = 0;           // precondition: size() > 0
  // The page left the index (evicted, or dropped by a reset while in use).
  virtual void on_unpublish(std::uint32_t /*page*/) {}
  virtual std::uint32_t size() const = 0;
  virtual bool contains(std::uint32_t page) const = 0;
};

std::unique_ptr<EvictionPolicy> make_policy(const PrefixCacheConfig& config,
                                            std::uint32_t num_pages);

// Bytes the policy make_policy(config, num_pages) allocates (its per-page
// arrays and its ghost), for the manager's memory estimate. Validates config.
std::uint64_t policy_bytes(const PrefixCacheConfig& config, std::uint32_t num_pages);

// Ghost entries a policy keeps for num_pages: ghost_factor x num_pages, at
// most kMaxGhostEntries (so a large pool's ghost stays bounded: 2^24 hashes,
// about 0.7 GiB with their index).
inline constexpr std::uint32_t kMaxGhostEntries = 1u << 24;
std::uint32_t ghost_length(const PrefixCacheConfig& config, std::uint32_t num_pages);

// Doubly linked lists threaded through per-page arrays: a page is in at most
// one list at a time (list tag kNone otherwise).
class PageLists {
 public:
  static constexpr std::uint8_t kNone = 0xff;
  PageLists(std::uint32_t num_pages, std::uint8_t num_lists);
  // Bytes a PageLists(num_pages, num_lists) allocates.
  static std::uint64_t bytes_for(std::uint32_t num_pages, std::uint8_t num_lists) {
    return std::uint64_t{num_pages} * (2 * sizeof(std::uint32_t) + sizeof(std::uint8_t)) +
           std::uint64_t{num_lists} * sizeof(List);
  }

  void push_back(std::uint8_t list, std::uint32_t page);
  void remove(std::uint32_t page);
  std::uint32_t pop_front(std::uint8_t list);
  std::uint32_t front(std::uint8_t list) const { return lists_[list].head; }
  std::uint32_t size(std::uint8_t list) const { return lists_[list].size; }
  std::uint8_t list_of(std::uint32_t page) const { return tag_[page]; }

 private:
  struct List {
    std::uint32_t head, tail, size;
  };
  std::uint32_t nil_;
  std::vector<std::uint32_t> prev_, next_;
  std::vector<std::uint8_t> tag_;
  std::vector<List> lists_;
};

}  // namespace kvcache::prefix
