#include "memory/block_pool.h"

namespace kvcache::memory {

BlockPool::BlockPool(std::uint32_t num_blocks) : ref_counts_(num_blocks, 0) {
  free_.reserve(num_blocks);
  // Hand out low ids first: push in reverse.
  for (std::uint32_t i = num_blocks; i-- > 0;) free_.push_back(i);
}

std::uint32_t BlockPool::allocate() {
  const std::uint32_t id = free_.back();
  free_.pop_back();
  ref_counts_[id] = 1;
  return id;
}

bool BlockPool::release(std::uint32_t id) {
  if (--ref_counts_[id] != 0) return false;
  free_.push_back(id);
  return true;
}

}  // namespace kvcache::memory
