// Test-only allocation failure injection: the k-th operator new on the
// arming thread throws std::bad_alloc. Other threads are never affected.
// Also counts the bytes each thread asks operator new for.
#pragma once

#include <cstddef>

namespace kvcache::testing {

// Arms the hook: the `k`-th allocation (1-based) on this thread fails.
void fail_nth_allocation(std::size_t k);
// Disarms; returns true if the armed failure fired.
bool disarm_allocation_failure();
// Bytes requested from operator new on this thread since the last call
// (then reset to 0).
std::size_t take_allocated_bytes();

}  // namespace kvcache::testing
