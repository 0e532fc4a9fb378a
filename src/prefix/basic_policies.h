// The LRU and tiered eviction policies as classes (internal): make_policy
// hands them out, and the adaptive policy (adaptive_policy.h) runs them side
// by side and in its shadow simulations. Contracts as in eviction_policy.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "prefix/eviction_policy.h"
#include "prefix/page_index.h"

namespace kvcache::prefix {

// Least recently released first. The manager releases a sequence's pages
// tail first, so a sequence's tail is evicted before its head.
class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(std::uint32_t n) : lists_(n, 1) {}
  static std::uint64_t bytes(std::uint32_t n) { return PageLists::bytes_for(n, 1); }
  void on_publish(std::uint32_t, std::uint64_t, bool) override {}
  void on_hit(std::uint32_t) override {}
  void insert(std::uint32_t page, ReuseHint) override { lists_.push_back(0, page); }
  void erase(std::uint32_t page) override { lists_.remove(page); }
  std::uint32_t evict() override { return lists_.pop_front(0); }
  std::uint32_t size() const override { return lists_.size(0); }
  bool contains(std::uint32_t page) const override {
    return lists_.list_of(page) != PageLists::kNone;
  }

 private:
  PageLists lists_;
};

// Ghost FIFO: the hashes of the last `capacity` evicted pages, O(1), no
// allocation after construction.
class GhostFifo {
 public:
  explicit GhostFifo(std::uint32_t capacity)
      : ring_(std::max<std::uint32_t>(capacity, 1), 0),
        index_(std::max<std::uint32_t>(capacity, 1)) {}
  static std::uint64_t bytes(std::uint32_t capacity) {
    const std::uint32_t c = std::max<std::uint32_t>(capacity, 1);
    return std::uint64_t{c} * sizeof(std::uint64_t) + PageIndex::bytes_for(c);
  }
  bool contains(std::uint64_t hash) const { return index_.find(hash).has_value(); }
  void remember(std::uint64_t hash) {
    if (contains(hash)) return;
    if (size_ == ring_.size()) {
      index_.erase(ring_[head_]);
      head_ = (head_ + 1) % ring_.size();
      --size_;
    }
    const std::size_t slot = (head_ + size_) % ring_.size();
    ring_[slot] = hash;
    index_.insert(hash, static_cast<std::uint32_t>(slot));
    ++size_;
  }

 private:
  std::vector<std::uint64_t> ring_;
  std::size_t head_ = 0, size_ = 0;
  PageIndex index_;
};

// Tiered LRU (LRU-2 flavoured) with release hints. Three LRU lists, evicted
// in order, least recently released first within each:
//   0 `unlikely`: used by one request so far and released with
//     ReuseHint::unlikely (the caller expects no follow-up);
//   1 `once`: used by one request so far (published, never reused, not
//     remembered by the ghost), no hint;
//   2 `kept`: seen twice (reused, or re-published while the ghost FIFO still
//     remembers its hash) or released with ReuseHint::likely.
// Without hints list 0 stays empty and this is plain tiered LRU. A page keeps
// its last non-`unknown` hint until it leaves the index. The ghost keeps
// ghost_factor x pool-size hashes of evicted pages. O(1).
class TieredPolicy final : public EvictionPolicy {
 public:
  TieredPolicy(std::uint32_t n, std::uint32_t ghost)
      : lists_(n, 3), seen_(n, 0), hint_(n, ReuseHint::unknown), hash_(n, 0), ghost_(ghost) {}
  static std::uint64_t bytes(std::uint32_t n, std::uint32_t ghost) {
    return PageLists::bytes_for(n, 3) +
           std::uint64_t{n} * (1 + sizeof(ReuseHint) + sizeof(std::uint64_t)) +
           GhostFifo::bytes(ghost);
  }
  void on_publish(std::uint32_t page, std::uint64_t hash, bool) override {
    hash_[page] = hash;
    seen_[page] = ghost_.contains(hash) ? 1 : 0;
    hint_[page] = ReuseHint::unknown;
  }
  void on_hit(std::uint32_t page) override { seen_[page] = 1; }
  void insert(std::uint32_t page, ReuseHint hint) override {
    if (hint != ReuseHint::unknown) hint_[page] = hint;
    lists_.push_back(list_for(page), page);
  }
  void erase(std::uint32_t page) override { lists_.remove(page); }
  // Removes an evictable page another policy chose to evict, remembering its
  // hash in the ghost as evict() would.
  void forget(std::uint32_t page) {
    lists_.remove(page);
    ghost_.remember(hash_[page]);
  }
  std::uint32_t evict() override {
    std::uint8_t list = kUnlikely;
    while (lists_.size(list) == 0) ++list;
    const std::uint32_t page = lists_.pop_front(list);
    ghost_.remember(hash_[page]);
    return page;
  }
  std::uint32_t size() const override {
    return lists_.size(kUnlikely) + lists_.size(kOnce) + lists_.size(kKept);
  }
  bool contains(std::uint32_t page) const override {
    return lists_.list_of(page) != PageLists::kNone;
  }

 private:
  static constexpr std::uint8_t kUnlikely = 0, kOnce = 1, kKept = 2;

  std::uint8_t list_for(std::uint32_t page) const {
    if (seen_[page] || hint_[page] == ReuseHint::likely) return kKept;
    return hint_[page] == ReuseHint::unlikely ? kUnlikely : kOnce;
  }

  PageLists lists_;
  std::vector<std::uint8_t> seen_;
  std::vector<ReuseHint> hint_;
  std::vector<std::uint64_t> hash_;
  GhostFifo ghost_;
};

}  // namespace kvcache::prefix
