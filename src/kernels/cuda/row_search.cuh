// Internal: which batch entry a new-token row belongs to (the store kernels).
#pragma once

#include <cstdint>

namespace kvcache::cuda::detail {

// The entry owning global row r: the last b with row_offsets[b] <= r
// (row_offsets non-decreasing from 0, batch entries).
__device__ __forceinline__ std::uint32_t entry_of_row(const std::uint32_t* row_offsets,
                                                      std::uint32_t batch, std::uint32_t r) {
  std::uint32_t lo = 0, hi = batch;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (row_offsets[mid] <= r) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace kvcache::cuda::detail
