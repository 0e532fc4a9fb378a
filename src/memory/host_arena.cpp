#include "memory/host_arena.h"

#include <sys/mman.h>

#include <string>
#include <utility>

#include "kvcache/error.h"

namespace kvcache::memory {

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
}

HostArena::HostArena(std::size_t bytes, bool advise_huge_pages) : size_(bytes) {
  if (bytes == 0) return;
  mapped_ = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw OutOfMemory("could not map " + std::to_string(bytes) + " bytes for the KV cache");
  }
  data_ = static_cast<std::byte*>(p);
#ifdef MADV_HUGEPAGE
  if (advise_huge_pages && mapped_ >= kHugePage) huge_ = madvise(p, mapped_, MADV_HUGEPAGE) == 0;
#else
  (void)advise_huge_pages;
#endif
}

HostArena::~HostArena() { reset(); }

HostArena::HostArena(HostArena&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      huge_(std::exchange(other.huge_, false)) {}

HostArena& HostArena::operator=(HostArena&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    huge_ = std::exchange(other.huge_, false);
  }
  return *this;
}

void HostArena::reset() noexcept {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  size_ = mapped_ = 0;
  huge_ = false;
}

}  // namespace kvcache::memory
