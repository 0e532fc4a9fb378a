// An index-based pool of fixed-size blocks (pages or slots) with ref counts.
//
// allocate() and release() are O(1) and never touch the heap after
// construction: free ids live in a preallocated stack. Ref counts support
// sharing (prefix caching, fork). Not thread-safe: the owning manager locks.
#pragma once

#include <cstdint>
#include <vector>

namespace kvcache::memory {

class BlockPool {
 public:
  explicit BlockPool(std::uint32_t num_blocks);

  std::uint32_t num_blocks() const { return static_cast<std::uint32_t>(ref_counts_.size()); }
  std::uint32_t num_free() const { return static_cast<std::uint32_t>(free_.size()); }

  // Pops a free block with ref count 1. Precondition: num_free() > 0.
  std::uint32_t allocate();
  // Adds a reference to a block that is in use.
  void retain(std::uint32_t id) { ++ref_counts_[id]; }
  // Drops a reference; returns true when it reached zero and the block went
  // back to the free list.
  bool release(std::uint32_t id);
  // Drops a reference without freeing at zero (the caller keeps the block,
  // e.g. as an evictable cache entry). Returns the new count.
  std::uint32_t unref(std::uint32_t id) { return --ref_counts_[id]; }
  // Puts a block with ref count 0 on the free list.
  void free_unreferenced(std::uint32_t id) { free_.push_back(id); }

  std::uint32_t ref_count(std::uint32_t id) const { return ref_counts_[id]; }
  const std::vector<std::uint32_t>& free_list() const { return free_; }
  const std::vector<std::uint32_t>& ref_counts() const { return ref_counts_; }

 private:
  std::vector<std::uint32_t> ref_counts_;
  std::vector<std::uint32_t> free_;  // stack; back() is handed out next
};

}  // namespace kvcache::memory
