// The `adaptive` eviction policy (internal; make_policy hands it out): the
// tiered policy's predictions where they pay, LRU's recency where they do not.
//
// Two policies order the same evictable pages side by side: LRU and tiered
// (with its release hints and ghost). Two shadow caches of the pool's size
// replay every page use (publish or prefix hit, keyed by content hash) and
// every release, one evicting as LRU, one as tiered, each counting the uses
// it would have served; the counts are halved every kWindowPools x pool uses,
// so they weigh recent traffic. evict() asks tiered when its shadow's count
// exceeds LRU's by more than one standard deviation of the difference
// (sqrt of the sum, as for Poisson counts), LRU otherwise, and removes the
// victim from the other. Mixing the two costs hits (each evicts what the
// other kept), so noise must not switch them: LRU is the default, tiered
// must show it is winning. A shadow
// holds hashes only (no K/V): a slot per pool page, its own hash index and its
// own copy of the policy (the tiered shadow's ghost included), all allocated
// at construction and counted by bytes(). Every operation is O(1) (the
// shadows' hash lookups and list moves). Not thread-safe: the manager locks.
#pragma once

#include <cstdint>
#include <vector>

#include "prefix/basic_policies.h"
#include "prefix/eviction_policy.h"
#include "prefix/page_index.h"

namespace kvcache::prefix {

// A cache of `n` content hashes run by policy P (LruPolicy or TieredPolicy)
// over slots 0..n-1, fed the real cache's page uses and releases: what P
// would have held with the pool to itself. A slot is open from a use until
// its release (not evictable, as a page in use is).
template <class P>
class ShadowCache {
 public:
  ShadowCache(std::uint32_t n, P policy)
      : policy_(std::move(policy)), index_(n), hash_(n, 0), open_(n, 0) {
    free_.reserve(n);
    for (std::uint32_t slot = n; slot-- > 0;) free_.push_back(slot);
  }
  // Bytes a ShadowCache of n slots allocates besides its policy's.
  static std::uint64_t bytes(std::uint32_t n) {
    return PageIndex::bytes_for(n) +
           std::uint64_t{n} * (sizeof(std::uint64_t) + 1 + sizeof(std::uint32_t));
  }

  // A request uses content `hash`; returns whether the shadow held it. When
  // every slot is open (in use), the use is not simulated (a miss).
  bool access(std::uint64_t hash, bool extension) {
    if (const auto slot = index_.find(hash)) {
      if (!open_[*slot]) policy_.erase(*slot);
      open_[*slot] = 1;
      policy_.on_hit(*slot);
      return true;
    }
    std::uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else if (policy_.size() > 0) {
      slot = policy_.evict();
      index_.erase(hash_[slot]);
    } else {
      return false;
    }
    hash_[slot] = hash;
    open_[slot] = 1;
    index_.insert(hash, slot);
    policy_.on_publish(slot, hash, extension);
    return false;
  }
  // The real cache released (or dropped) content `hash`: its slot, if open,
  // becomes evictable.
  void release(std::uint64_t hash, ReuseHint hint) {
    const auto slot = index_.find(hash);
    if (!slot || !open_[*slot]) return;
    open_[*slot] = 0;
    policy_.insert(*slot, hint);
  }

 private:
  P policy_;
  PageIndex index_;
  std::vector<std::uint64_t> hash_;
  std::vector<std::uint8_t> open_;
  std::vector<std::uint32_t> free_;
};

class AdaptivePolicy final : public EvictionPolicy {
 public:
  // Hit counts are halved every kWindowPools x pool-size page uses (measured
  // on the traces of docs/PERFORMANCE.md: windows of 32 pools or fewer
  // switch on noise and lose to both LRU and tiered on the Mooncake trace
  // at 250K tokens).
  static constexpr std::uint32_t kWindowPools = 64;

  AdaptivePolicy(std::uint32_t n, std::uint32_t ghost);
  static std::uint64_t bytes(std::uint32_t n, std::uint32_t ghost);

  void on_publish(std::uint32_t page, std::uint64_t hash, bool extension) override;
  void on_hit(std::uint32_t page) override;
  void insert(std::uint32_t page, ReuseHint hint) override;
  void erase(std::uint32_t page) override;
  std::uint32_t evict() override;
  std::uint32_t size() const override { return lru_.size(); }
  bool contains(std::uint32_t page) const override { return lru_.contains(page); }
  void on_unpublish(std::uint32_t page) override;

  // Whether evict() follows tiered now (else LRU), and the shadows' decayed
  // hit counts: for tests and diagnostics.
  bool following_tiered() const;
  std::uint64_t shadow_lru_hits() const { return lru_hits_; }
  std::uint64_t shadow_tiered_hits() const { return tiered_hits_; }

 private:
  void observe(std::uint64_t hash, bool extension);

  LruPolicy lru_;
  TieredPolicy tiered_;
  std::vector<std::uint64_t> hash_;
  ShadowCache<LruPolicy> shadow_lru_;
  ShadowCache<TieredPolicy> shadow_tiered_;
  std::uint64_t lru_hits_ = 0, tiered_hits_ = 0;
  std::uint64_t uses_ = 0, window_;
};

}  // namespace kvcache::prefix
