// Internal: the 8-bit store kernel (store_kv_q8.cu), called by store_kv_cuda
// (store_kv.cu) after it has validated the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvcache/cache_desc.h"
#include "kvcache/dtype.h"

struct CUstream_st;

namespace kvcache::cuda::detail {

// Quantizes `rows` new K/V rows into k / v (fp8_e4m3, fp8_e5m2 or int8),
// RoPE on K when rotary_dim > 0. Arguments as checked by store_kv_cuda.
void store_kv_q8_cuda(DType dtype, const CacheDesc& k, const CacheDesc& v,
                      std::span<const float> k_new, std::span<const float> v_new,
                      std::span<const std::uint32_t> row_offsets, std::uint32_t rotary_dim,
                      float rope_theta, std::size_t rows, CUstream_st* stream);

}  // namespace kvcache::cuda::detail
