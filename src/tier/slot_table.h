// SlotTable: the bookkeeping both local tiers share — which key each slot
// holds, which slots are being written or read, the free slots and the
// eviction policy. Not thread-safe: the tier's mutex guards it, and the tier
// does its I/O outside that lock, between claim and publish / pin and unpin.
//
// Slot states: free -> writing (claim_for_write) -> held (publish), or back
// to free (abandon); a held slot is pinned while loads read it (pin / unpin)
// and is never chosen as a victim then; drop() frees a held slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kvcache/tier.h"
#include "kvcache/tier_policy.h"
#include "tier/page_codec.h"

namespace kvcache::tier {

class SlotTable {
 public:
  // At most max_slots slots, numbered in the order first used.
  SlotTable(std::uint64_t max_slots, std::shared_ptr<TierEvictionPolicy> policy);

  enum class Claim : std::uint8_t { slot, present, full };
  struct Claimed {
    Claim what = Claim::full;
    std::uint32_t slot = 0;
    std::optional<PageKey> evicted;  // the page the slot held before (evicted for room)
  };
  // A slot to write `key` into: present when the key is held or being
  // written; else a never-used slot, a freed one, or the policy's victim
  // (evicted); full when none is evictable.
  Claimed claim_for_write(PageKey key);
  void publish(std::uint32_t slot, std::uint64_t checksum);
  void abandon(std::uint32_t slot);

  // The slot holding key (pinned), or nothing.
  std::optional<std::uint32_t> pin(PageKey key);
  // Ends a read; `read` tells the policy of an access.
  void unpin(std::uint32_t slot, bool read);
  // Frees a held slot (its page is bad or removed); the caller's pin ends too.
  void drop(std::uint32_t slot);

  // Recovery: slot holds key with checksum (replaces what it held).
  void restore(std::uint32_t slot, PageKey key, std::uint64_t checksum);
  // Recovery: forget slot's page.
  void forget(std::uint32_t slot);
  // Recovery done: every slot used but not held becomes free.
  void finish_restore();

  bool held(PageKey key) const;
  PageKey key_of(std::uint32_t slot) const { return slots_[slot].key; }
  std::uint64_t checksum_of(std::uint32_t slot) const { return slots_[slot].checksum; }
  std::size_t pages_held() const { return held_; }
  std::uint64_t max_slots() const { return max_slots_; }
  // Slots ever used: [0, used()).
  std::size_t used() const { return slots_.size(); }
  // Every held (slot, key, checksum), in slot order.
  struct Entry {
    std::uint32_t slot;
    PageKey key;
    std::uint64_t checksum;
  };
  std::vector<Entry> held_entries() const;

 private:
  enum class State : std::uint8_t { free, writing, held, dropped };  // dropped: freed once unpinned
  struct Slot {
    PageKey key;
    std::uint64_t checksum = 0;
    std::uint32_t readers = 0;
    State state = State::free;
  };
  std::uint32_t new_slot();

  std::uint64_t max_slots_;
  std::shared_ptr<TierEvictionPolicy> policy_;
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_;
  std::unordered_map<PageKey, std::uint32_t, PageKeyHash> index_;  // held or writing
  std::size_t held_ = 0;
};

}  // namespace kvcache::tier
