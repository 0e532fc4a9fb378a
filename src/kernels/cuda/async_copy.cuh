// Internal: Ampere+ asynchronous global -> shared copies (cp.async), shared by
// the decode and prefill attention kernels.
#pragma once

#include <cuda_runtime.h>

namespace kvcache::cuda::detail {

// The shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes from gmem to the shared address dst, bypassing L1 (.cg);
// with fill == false nothing is read and the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* gmem, bool fill) {
  const int bytes = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool fill) {
  cp_async16(smem_addr(smem), gmem, fill);
}

// Copies 4 bytes (cp.async.ca: sizes below 16 go through L1); with fill ==
// false nothing is read and the 4 bytes are zero-filled.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool fill) {
  const int bytes = fill ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(bytes)
               : "memory");
}

// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace kvcache::cuda::detail
