// kvcache::cuda::store_kv into 8-bit caches (fp8_e4m3, fp8_e5m2, int8):
// quantizes each new (token, KV head) row exactly as store_kv_reference and
// the CPU kernels do (kvcache/dtype.h, docs/quantization.md):
//  - fp8: code = fp8(x * (1 / head scale)), the layer's static K or V scale
//    of the head (CacheDesc::head_scales, device memory);
//  - int8: absmax of the row, code = clamp(rint(x * (127 / absmax))), and
//    the (row, head) scale absmax / 127 written beside the page's values
//    (CacheDesc::scale_index).
// RoPE on K (StoreOptions::rope_k) is applied before quantizing, in fp32 with
// cos / sin from a double sincos rounded once (rope_cos_sin's formula) and
// rope_rotate_pair's explicit fma: the same bits as the host except within
// a few double ulps of a float rounding boundary.
//
// Work: one warp per (new token, KV head), both K and V; lane l holds
// elements l, l + 32, ... of the row (head_dim <= 256: 8 per lane), so the
// int8 absmax is one warp reduction. Bytes are written one per lane
// (32 consecutive bytes per warp store). The kernel is bandwidth-bound like
// the 16-bit one; it is not tuned further (docs/CUDA.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "element.cuh"
#include "kvcache/cuda/kernels.h"
#include "kvcache/kernels/rope.h"
#include "row_search.cuh"
#include "store_q8.h"
#include "validate.h"

namespace kvcache::cuda::detail {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kWarps = kThreads / 32;
constexpr unsigned kPerLane = kMaxHeadDim / 32;
constexpr unsigned kMaxPairs = kMaxHeadDim / 2;

struct Q8StoreParams {
  std::uint8_t* k_blocks;
  std::uint8_t* v_blocks;
  const float* k_head_scales;  // fp8: the layer's K scales [n_kv]
  const float* v_head_scales;
  const std::uint32_t* cache_lengths;
  const std::uint32_t* lookup;
  const std::uint32_t* row_offsets;
  const float* k_new;
  const float* v_new;
  std::size_t block_stride;
  std::size_t token_stride;
  std::size_t head_stride;
  std::size_t scales_offset;  // int8: bytes from a block's start to its scales
  std::uint64_t units;        // tokens x n_kv
  std::uint32_t batch;
  std::uint32_t lookup_stride;
  std::uint32_t page_size;
  std::uint32_t n_kv;
  std::uint32_t dim;
  std::uint32_t half;  // RoPE: rotary_dim / 2; 0 without
  float inv_freq[kMaxPairs];
};

__device__ float warp_absmax(float x) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

template <DType kType>
__device__ std::uint8_t encode(float scaled) {
  if constexpr (kType == DType::fp8_e4m3) {
    return f32_to_e4m3(scaled);
  } else if constexpr (kType == DType::fp8_e5m2) {
    return f32_to_e5m2(scaled);
  } else {
    return static_cast<std::uint8_t>(f32_to_i8(scaled));
  }
}

// Element d of a K row rotated at position pos (NeoX pairs d, d + half).
__device__ float rotated(const float* x, std::uint32_t d, std::uint32_t half, std::uint32_t pos,
                         const float* inv_freq) {
  if (d >= 2 * half) return x[d];
  const std::uint32_t i = d < half ? d : d - half;
  double sn = 0.0, cn = 0.0;
  sincos(__dmul_rn(static_cast<double>(pos), static_cast<double>(inv_freq[i])), &sn, &cn);
  const float c = __double2float_rn(cn), s = __double2float_rn(sn);
  const float x0 = x[i], x1 = x[i + half];
  return d < half ? __fmaf_rn(x0, c, -__fmul_rn(x1, s)) : __fmaf_rn(x0, s, __fmul_rn(x1, c));
}

template <DType kType>
__global__ void __launch_bounds__(kThreads)
    store_q8_kernel(const __grid_constant__ Q8StoreParams p) {
  const std::uint32_t lane = threadIdx.x & 31u;
  const std::uint64_t warps = std::uint64_t{gridDim.x} * kWarps;
  const std::size_t row = std::size_t{p.n_kv} * p.dim;
  for (std::uint64_t u = std::uint64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5); u < p.units;
       u += warps) {
    const auto r = static_cast<std::uint32_t>(u / p.n_kv);
    const auto h = static_cast<std::uint32_t>(u % p.n_kv);
    const std::uint32_t b = entry_of_row(p.row_offsets, p.batch, r);
    const std::uint32_t pos = p.cache_lengths[b] + (r - p.row_offsets[b]);
    const std::uint32_t block = p.lookup[std::size_t{b} * p.lookup_stride + pos / p.page_size];
    const std::size_t at =
        std::size_t{pos % p.page_size} * p.token_stride + std::size_t{h} * p.head_stride;
    const std::size_t base = std::size_t{block} * p.block_stride;
    for (std::uint32_t kv = 0; kv < 2; ++kv) {
      const float* src =
          (kv == 0 ? p.k_new : p.v_new) + std::size_t{r} * row + std::size_t{h} * p.dim;
      const bool rope = kv == 0 && p.half != 0;
      float x[kPerLane];
      float absmax = 0.0f;
#pragma unroll
      for (unsigned j = 0; j < kPerLane; ++j) {
        const std::uint32_t d = lane + 32 * j;
        x[j] = 0.0f;
        if (d < p.dim) x[j] = rope ? rotated(src, d, p.half, pos, p.inv_freq) : src[d];
        absmax = fmaxf(absmax, fabsf(x[j]));
      }
      std::uint8_t* dst = (kv == 0 ? p.k_blocks : p.v_blocks) + base;
      float inverse;
      if constexpr (kType == DType::int8) {
        absmax = warp_absmax(absmax);
        inverse = absmax > 0.0f ? __fdiv_rn(127.0f, absmax) : 0.0f;
        if (lane == 0) {
          const float scale = __fdiv_rn(absmax, 127.0f);
          *reinterpret_cast<float*>(dst + p.scales_offset + at / p.dim * sizeof(float)) = scale;
        }
      } else {
        inverse = __fdiv_rn(1.0f, (kv == 0 ? p.k_head_scales : p.v_head_scales)[h]);
      }
#pragma unroll
      for (unsigned j = 0; j < kPerLane; ++j) {
        const std::uint32_t d = lane + 32 * j;
        if (d < p.dim) dst[at + d] = encode<kType>(__fmul_rn(x[j], inverse));
      }
    }
  }
}

}  // namespace

void store_kv_q8_cuda(DType dtype, const CacheDesc& k, const CacheDesc& v,
                      std::span<const float> k_new, std::span<const float> v_new,
                      std::span<const std::uint32_t> row_offsets, std::uint32_t rotary_dim,
                      float rope_theta, std::size_t rows, CUstream_st* stream) {
  Q8StoreParams p{};
  p.k_blocks = static_cast<std::uint8_t*>(k.blocks);
  p.v_blocks = static_cast<std::uint8_t*>(v.blocks);
  p.k_head_scales = k.head_scales;
  p.v_head_scales = v.head_scales;
  p.cache_lengths = k.cache_lengths;
  p.lookup = k.lookup_table;
  p.row_offsets = row_offsets.data();
  p.k_new = k_new.data();
  p.v_new = v_new.data();
  p.block_stride = k.block_stride;
  p.token_stride = k.token_stride;
  p.head_stride = k.head_stride;
  p.scales_offset = k.block_values();
  p.units = std::uint64_t{rows} * k.n_kv_heads;
  p.batch = k.batch_size;
  p.lookup_stride = k.lookup_stride;
  p.page_size = k.page_size;
  p.n_kv = k.n_kv_heads;
  p.dim = k.head_dim;
  p.half = rotary_dim / 2;
  if (p.half != 0) {
    const std::vector<float> f = rope_inv_freqs(rotary_dim, rope_theta);
    std::copy(f.begin(), f.end(), p.inv_freq);
  }
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiprocessor count)");
  const std::uint64_t max_blocks = std::uint64_t{static_cast<unsigned>(std::max(sms, 1))} * 8;
  const auto grid =
      static_cast<unsigned>(std::min<std::uint64_t>((p.units + kWarps - 1) / kWarps, max_blocks));
  switch (dtype) {
    case DType::fp8_e4m3:
      store_q8_kernel<DType::fp8_e4m3><<<grid, kThreads, 0, stream>>>(p);
      break;
    case DType::fp8_e5m2:
      store_q8_kernel<DType::fp8_e5m2><<<grid, kThreads, 0, stream>>>(p);
      break;
    default:
      store_q8_kernel<DType::int8><<<grid, kThreads, 0, stream>>>(p);
      break;
  }
  check_cuda(cudaGetLastError(), "store_kv (8-bit) kernel launch");
}

}  // namespace kvcache::cuda::detail
