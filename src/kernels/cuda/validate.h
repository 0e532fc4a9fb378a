// Internal: host-side argument checks shared by the CUDA kernels. Each throws
// InvalidArgument naming the value and the limit; none reads device memory
// (only pointer attributes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvcache/kv_cache.h"

namespace kvcache::cuda::detail {

// K and V of the same shape and batch; a usable, device-resident view.
void check_cache_pair(const CacheDesc& k, const CacheDesc& v);
// row_offsets has batch_size + 1 entries in device memory.
void check_row_offsets_span(std::span<const std::uint32_t> row_offsets, std::uint32_t batch_size);
// `n` is a whole number of rows of `row` elements; returns the row count.
std::size_t rows_of(const char* what, std::size_t n, std::size_t row);
// A non-empty span must be device memory.
void check_device_span(const char* what, const void* p, std::size_t n);

}  // namespace kvcache::cuda::detail
