// Page-aligned, zero-initialised host memory for cache blocks (RAII).
//
// Large arenas come from mmap and are advised to use transparent 2 MiB huge
// pages (madvise MADV_HUGEPAGE) where the OS allows; `huge_pages_advised()`
// says whether the advice was accepted. Move-only; frees on destruction.
#pragma once

#include <cstddef>

namespace kvcache::memory {

class HostArena {
 public:
  HostArena() = default;
  // Throws OutOfMemory naming the size when the mapping fails.
  explicit HostArena(std::size_t bytes, bool advise_huge_pages = true);
  ~HostArena();
  HostArena(HostArena&& other) noexcept;
  HostArena& operator=(HostArena&& other) noexcept;
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool huge_pages_advised() const { return huge_; }

 private:
  void reset() noexcept;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;
  bool huge_ = false;
};

}  // namespace kvcache::memory
