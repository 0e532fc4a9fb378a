#include "reliability/alloc_hook.h"

#include <cstdlib>
#include <new>

namespace {
// Per-thread countdown; 0 = disarmed. Test-only state (not library state).
thread_local std::size_t countdown = 0;
thread_local bool fired = false;
thread_local std::size_t requested = 0;

void* allocate(std::size_t n) {
  requested += n;
  if (countdown != 0 && --countdown == 0) {
    fired = true;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
}  // namespace

namespace kvcache::testing {
void fail_nth_allocation(std::size_t k) {
  countdown = k;
  fired = false;
}
bool disarm_allocation_failure() {
  countdown = 0;
  return fired;
}
std::size_t take_allocated_bytes() {
  const std::size_t n = requested;
  requested = 0;
  return n;
}
}  // namespace kvcache::testing

// Every non-aligned form is replaced, so whatever allocates here is freed by
// the matching replacement below (a partial set mixes allocators: ASan
// reports alloc-dealloc mismatches). The aligned forms stay the runtime's,
// allocation and release alike.
void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& tag) noexcept {
  return operator new(n, tag);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
