// kvcache/kernels/bandwidth.h — machine probes the kernel benchmarks compare
// against (DESIGN.md §6): streaming read bandwidth and fp32 FMA throughput,
// measured with the same SIMD dispatch and threads as the kernels.
//
// Each probe runs one slice per pool thread (pool == nullptr: the calling
// thread) and returns a value derived from the data so the work cannot be
// optimised away. Timing is the caller's job. Thread-safe; no global state.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcache/thread_pool.h"

namespace kvcache::kernels {

// Reads `bytes` bytes from `data` (as floats, 4 independent SIMD sums per
// thread); returns their sum. bytes must be a multiple of 4.
float stream_read(const void* data, std::size_t bytes, ThreadPool* pool);

// memcpy(dst, src, bytes), split across the pool's threads.
void stream_copy(void* dst, const void* src, std::size_t bytes, ThreadPool* pool);

// Runs independent fp32 FMA chains (register-resident) on every thread;
// returns the number of floating-point operations executed (2 per FMA lane).
// `iterations` scales the work per thread.
std::uint64_t fma_peak(std::uint64_t iterations, ThreadPool* pool, float* sink);

}  // namespace kvcache::kernels
