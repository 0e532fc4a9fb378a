// kvcache/tier_policy.h — which page a tier drops when it needs room.
//
// A tier keeps its pages in numbered slots [0, num_slots) and tells its
// policy what happens to them; the policy answers victim(). The tier calls
// every method under its own lock, one call at a time, so a policy needs no
// locking of its own. The default is least-recently-used
// (make_lru_tier_policy); a better one plugs in through HostTierOptions /
// DiskTierOptions::policy.
//
// Protocol: resize(n) first (and again whenever the tier grows; n never
// shrinks); stored(s) when slot s receives a page; accessed(s) when its page
// is read (a load); removed(s) when its page leaves (dropped as corrupt,
// evicted after victim() chose it, or the tier cleared it). victim() names a
// slot holding a page for which evictable(slot) is true (the tier says no to
// slots being read or written), or nothing; it changes no state (the tier
// calls removed() on the slot it then evicts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

namespace kvcache {

class TierEvictionPolicy {
 public:
  virtual ~TierEvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  virtual void resize(std::size_t num_slots) = 0;
  virtual void stored(std::uint32_t slot) = 0;
  virtual void accessed(std::uint32_t slot) = 0;
  virtual void removed(std::uint32_t slot) = 0;
  virtual std::optional<std::uint32_t> victim(
      const std::function<bool(std::uint32_t)>& evictable) = 0;
};

// Least recently stored or loaded first: O(1) per event (an intrusive list
// over the slots), victim() walks past the slots that are not evictable.
std::unique_ptr<TierEvictionPolicy> make_lru_tier_policy();

}  // namespace kvcache
