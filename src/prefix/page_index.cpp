#include "prefix/page_index.h"

#include <bit>

namespace kvcache::prefix {

namespace {
std::size_t capacity_for(std::uint32_t max_entries) {
  return std::bit_ceil(std::max<std::size_t>(16, std::size_t{max_entries} * 2));
}
}  // namespace

std::uint64_t PageIndex::bytes_for(std::uint32_t max_entries) {
  return capacity_for(max_entries) * sizeof(Slot);
}

PageIndex::PageIndex(std::uint32_t max_entries) {
  const std::size_t cap = capacity_for(max_entries);
  slots_.resize(cap);
  mask_ = cap - 1;
}

std::size_t PageIndex::home(std::uint64_t key) const {
  // splitmix64 finalizer: spreads keys from weak hashes across the table.
  key ^= key >> 30;
  key *= 0xbf58476d1ce4e5b9ULL;
  key ^= key >> 27;
  key *= 0x94d049bb133111ebULL;
  key ^= key >> 31;
  return static_cast<std::size_t>(key) & mask_;
}

std::optional<std::uint32_t> PageIndex::find(std::uint64_t key) const {
  for (std::size_t i = home(key);; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.value == kEmpty) return std::nullopt;
    if (s.key == key) return s.value;
  }
}

bool PageIndex::insert(std::uint64_t key, std::uint32_t value) {
  for (std::size_t i = home(key);; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.value == kEmpty) {
      s = {key, value};
      ++size_;
      return true;
    }
    if (s.key == key) return false;
  }
}

bool PageIndex::erase(std::uint64_t key) {
  std::size_t i = home(key);
  for (;; i = (i + 1) & mask_) {
    if (slots_[i].value == kEmpty) return false;
    if (slots_[i].key == key) break;
  }
  // Backward shift: pull later entries of the probe run into the hole.
  std::size_t hole = i;
  for (std::size_t j = (i + 1) & mask_; slots_[j].value != kEmpty; j = (j + 1) & mask_) {
    const std::size_t h = home(slots_[j].key);
    // Move j into the hole unless its home lies cyclically in (hole, j].
    const bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
    if (!stays) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole] = Slot{};
  --size_;
  return true;
}

void PageIndex::clear() {
  for (Slot& s : slots_) s = Slot{};
  size_ = 0;
}

}  // namespace kvcache::prefix
