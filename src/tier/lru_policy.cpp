// make_lru_tier_policy: a doubly linked list over slot numbers, most recent
// at the head; victims come from the tail.
#include <limits>
#include <vector>

#include "kvcache/tier_policy.h"

namespace kvcache {
namespace {

constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

class LruTierPolicy final : public TierEvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }

  void resize(std::size_t num_slots) override {
    if (num_slots > prev_.size()) {
      prev_.resize(num_slots, kNone);
      next_.resize(num_slots, kNone);
      linked_.resize(num_slots, false);
    }
  }
  void stored(std::uint32_t slot) override { to_front(slot); }
  void accessed(std::uint32_t slot) override { to_front(slot); }
  void removed(std::uint32_t slot) override { unlink(slot); }

  std::optional<std::uint32_t> victim(
      const std::function<bool(std::uint32_t)>& evictable) override {
    for (std::uint32_t s = tail_; s != kNone; s = prev_[s]) {
      if (evictable(s)) return s;
    }
    return std::nullopt;
  }

 private:
  void unlink(std::uint32_t s) {
    if (s >= linked_.size() || !linked_[s]) return;
    (prev_[s] == kNone ? head_ : next_[prev_[s]]) = next_[s];
    (next_[s] == kNone ? tail_ : prev_[next_[s]]) = prev_[s];
    prev_[s] = next_[s] = kNone;
    linked_[s] = false;
  }
  void to_front(std::uint32_t s) {
    if (s >= linked_.size()) resize(std::size_t{s} + 1);
    unlink(s);
    next_[s] = head_;
    prev_[s] = kNone;
    if (head_ != kNone) prev_[head_] = s;
    head_ = s;
    if (tail_ == kNone) tail_ = s;
    linked_[s] = true;
  }

  std::vector<std::uint32_t> prev_, next_;
  std::vector<bool> linked_;
  std::uint32_t head_ = kNone, tail_ = kNone;
};

}  // namespace

std::unique_ptr<TierEvictionPolicy> make_lru_tier_policy() {
  return std::make_unique<LruTierPolicy>();
}

}  // namespace kvcache
