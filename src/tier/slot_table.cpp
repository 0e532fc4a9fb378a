#include "tier/slot_table.h"

#include <utility>

namespace kvcache::tier {

SlotTable::SlotTable(std::uint64_t max_slots, std::shared_ptr<TierEvictionPolicy> policy)
    : max_slots_(max_slots),
      policy_(policy != nullptr ? std::move(policy) : make_lru_tier_policy()) {}

std::uint32_t SlotTable::new_slot() {
  const auto s = static_cast<std::uint32_t>(slots_.size());
  slots_.emplace_back();
  policy_->resize(slots_.size());
  return s;
}

SlotTable::Claimed SlotTable::claim_for_write(PageKey key) {
  Claimed c;
  if (index_.contains(key)) {
    c.what = Claim::present;
    return c;
  }
  if (!free_.empty()) {
    c.slot = free_.back();
    free_.pop_back();
  } else if (slots_.size() < max_slots_) {
    c.slot = new_slot();
  } else {
    const auto victim = policy_->victim([&](std::uint32_t s) {
      return s < slots_.size() && slots_[s].state == State::held && slots_[s].readers == 0;
    });
    if (!victim) return c;  // full
    c.slot = *victim;
    c.evicted = slots_[c.slot].key;
    policy_->removed(c.slot);
    index_.erase(slots_[c.slot].key);
    --held_;
  }
  Slot& s = slots_[c.slot];
  s = Slot{key, 0, 0, State::writing};
  index_.emplace(key, c.slot);
  c.what = Claim::slot;
  return c;
}

void SlotTable::publish(std::uint32_t slot, std::uint64_t checksum) {
  slots_[slot].state = State::held;
  slots_[slot].checksum = checksum;
  ++held_;
  policy_->stored(slot);
}

void SlotTable::abandon(std::uint32_t slot) {
  index_.erase(slots_[slot].key);
  slots_[slot] = Slot{};
  free_.push_back(slot);
}

std::optional<std::uint32_t> SlotTable::pin(PageKey key) {
  const auto it = index_.find(key);
  if (it == index_.end() || slots_[it->second].state != State::held) return std::nullopt;
  ++slots_[it->second].readers;
  return it->second;
}

void SlotTable::unpin(std::uint32_t slot, bool read) {
  Slot& s = slots_[slot];
  if (s.readers > 0) --s.readers;
  if (read && s.state == State::held) policy_->accessed(slot);
  if (s.state == State::dropped && s.readers == 0) {
    s = Slot{};
    free_.push_back(slot);
  }
}

void SlotTable::drop(std::uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.readers > 0) --s.readers;
  if (s.state != State::held) return;
  policy_->removed(slot);
  index_.erase(s.key);
  --held_;
  if (s.readers == 0) {
    s = Slot{};
    free_.push_back(slot);
  } else {
    s.state = State::dropped;  // another reader still holds a pin: freed by its unpin
    s.key = PageKey{};
  }
}

void SlotTable::restore(std::uint32_t slot, PageKey key, std::uint64_t checksum) {
  while (slots_.size() <= slot) new_slot();
  forget(slot);
  if (const auto it = index_.find(key); it != index_.end()) forget(it->second);
  slots_[slot] = Slot{key, checksum, 0, State::held};
  index_.emplace(key, slot);
  ++held_;
  policy_->stored(slot);
}

void SlotTable::forget(std::uint32_t slot) {
  if (slot >= slots_.size() || slots_[slot].state != State::held) return;
  policy_->removed(slot);
  index_.erase(slots_[slot].key);
  slots_[slot] = Slot{};
  --held_;
}

void SlotTable::finish_restore() {
  free_.clear();
  for (std::size_t s = slots_.size(); s-- > 0;) {
    if (slots_[s].state == State::free) free_.push_back(static_cast<std::uint32_t>(s));
  }
}

bool SlotTable::held(PageKey key) const {
  const auto it = index_.find(key);
  return it != index_.end() && slots_[it->second].state == State::held;
}

std::vector<SlotTable::Entry> SlotTable::held_entries() const {
  std::vector<Entry> out;
  out.reserve(held_);
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].state == State::held) {
      out.push_back({static_cast<std::uint32_t>(s), slots_[s].key, slots_[s].checksum});
    }
  }
  return out;
}

}  // namespace kvcache::tier
