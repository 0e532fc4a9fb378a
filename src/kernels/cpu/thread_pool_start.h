// kernels/cpu/thread_pool_start.h — how ThreadPool starts its workers, with a
// fault-injection point so tests can make the system "refuse" a thread.
//
// Internal (src/): tests reach it through their src/ include path; users of
// the library never see it.
#pragma once

#include <cstddef>
#include <functional>
#include <thread>

namespace kvcache::detail {

// Starts worker `index` (1 .. num_threads - 1) running fn. Throws what
// std::thread throws when the system refuses a thread (std::system_error,
// resource_unavailable_try_again), and does so on purpose for the index set
// by fail_pool_thread_start_at.
std::thread start_pool_thread(std::size_t index, std::function<void()> fn);

// Test hook: every later start of worker `index` throws as a refused thread
// would (0, the default: never). Process-wide; set it only while no pool is
// being constructed on another thread.
void fail_pool_thread_start_at(std::size_t index);

}  // namespace kvcache::detail
