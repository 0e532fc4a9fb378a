#include "reliability/alloc_hook.h"

#include <cstdlib>
#include <new>

namespace {
// Per-thread countdown; 0 = disarmed. Test-only state (not library state).
thread_local std::size_t countdown = 0;
thread_local bool fired = false;

void* allocate(std::size_t n) {
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
}  // namespace kvcache::testing

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
