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
#include <span>

#include "kvcache/kv_cache.h"
#include "kvcache/thread_pool.h"

namespace kvcache::kernels {

// Reads `bytes` bytes from `data` (as floats, 4 independent SIMD sums per
// thread); returns their sum. bytes must be a multiple of 4.
float stream_read(const void* data, std::size_t bytes, ThreadPool* pool);

// Reads the K and V rows of tokens [0, tokens[b]) of every entry b of a
// layer view, block by block in page-table order (one contiguous run of rows
// per block, K then V): the bytes decode attention reads, in the order of its
// pages, without its arithmetic. Blocks are split evenly across the pool's
// threads. Returns a sum of the data. tokens.size() must be the view's
// batch size and each count within its entry's reserved room and page table
// (InvalidArgument otherwise); as for attention, every row read must lie in
// a page the entry holds (k must be valid: CacheDesc::validate; v the same
// batch and geometry).
// Its bandwidth is the ceiling that the page size and page order leave a
// paged kernel. On the Zen 4 VM, shuffled 32 KiB pages read at 0.84-0.88 of
// a sequential stream while the VM gets ~34 GB/s, and at 0.56-0.73 in the
// windows where it gets ~55 GB/s.
float paged_read(const CacheDesc& k, const CacheDesc& v, std::span<const std::uint32_t> tokens,
                 ThreadPool* pool);

// memcpy(dst, src, bytes), split across the pool's threads.
void stream_copy(void* dst, const void* src, std::size_t bytes, ThreadPool* pool);

// Runs independent fp32 FMA chains (register-resident) on every thread;
// returns the number of floating-point operations executed (2 per FMA lane).
// `iterations` scales the work per thread.
std::uint64_t fma_peak(std::uint64_t iterations, ThreadPool* pool, float* sink);

}  // namespace kvcache::kernels
