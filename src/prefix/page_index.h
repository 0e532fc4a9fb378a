// A fixed-capacity open-addressing map from 64-bit block hash to page id.
//
// Linear probing with backward-shift deletion: find / insert / erase are O(1)
// expected and never allocate after construction (capacity is a power of two
// at least twice the number of entries it may hold), so the manager's commit
// phases cannot throw. Keys are whatever the (possibly injected, possibly
// weak) block hash returns; slots are chosen from a mixed copy of the key so
// clustered keys still spread. Not thread-safe: the owning manager locks.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kvcache::prefix {

class PageIndex {
 public:
  static constexpr std::uint32_t kEmpty = UINT32_MAX;

  // Room for at least max_entries keys.
  explicit PageIndex(std::uint32_t max_entries);
  // Bytes a PageIndex(max_entries) allocates.
  static std::uint64_t bytes_for(std::uint32_t max_entries);

  // The page stored under key, if any.
  std::optional<std::uint32_t> find(std::uint64_t key) const;
  // Inserts key -> value; returns false (and changes nothing) if key is present.
  // Precondition: size() < max_entries.
  bool insert(std::uint64_t key, std::uint32_t value);
  // Removes key if present; returns whether it was.
  bool erase(std::uint64_t key);
  void clear();

  std::uint32_t size() const { return size_; }

  // Calls f(key, value) for every entry (invariant checks).
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.value != kEmpty) f(s.key, s.value);
  }

 private:
  struct Slot {
    std::uint64_t key = 0;
    std::uint32_t value = kEmpty;
  };
  std::size_t home(std::uint64_t key) const;

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::uint32_t size_ = 0;
};

}  // namespace kvcache::prefix
