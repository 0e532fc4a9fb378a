// AlignedBuffers: a free list of equal-sized 4 KiB-aligned buffers (the
// disk tier's O_DIRECT staging), so a page's I/O allocates nothing once the
// pool has warmed up. get() hands out a shared_ptr whose last owner gives
// the buffer back. The pool must outlive every buffer it handed out.
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "tier/slab_files.h"

namespace kvcache::tier {

class AlignedBuffers {
 public:
  explicit AlignedBuffers(std::size_t bytes) : bytes_(bytes) {}
  ~AlignedBuffers() {
    for (std::byte* p : free_) std::free(p);
  }
  AlignedBuffers(const AlignedBuffers&) = delete;
  AlignedBuffers& operator=(const AlignedBuffers&) = delete;

  std::size_t bytes() const { return bytes_; }

  // Throws std::bad_alloc when memory runs out.
  std::shared_ptr<std::byte> get() {
    std::byte* p = nullptr;
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        p = free_.back();
        free_.pop_back();
      }
    }
    if (p == nullptr) {
      p = static_cast<std::byte*>(std::aligned_alloc(kDiskAlign, bytes_));
      if (p == nullptr) throw std::bad_alloc();
    }
    return std::shared_ptr<std::byte>(p, [this](std::byte* q) {
      std::lock_guard lock(mu_);
      free_.push_back(q);
    });
  }

 private:
  const std::size_t bytes_;
  std::mutex mu_;
  std::vector<std::byte*> free_;
};

}  // namespace kvcache::tier
