// kvcache::cuda::store_kv: one thread block per (new token, KV head) row.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda_check.h"
#include "element.cuh"
#include "kvcache/cuda/kernels.h"
#include "validate.h"

namespace kvcache::cuda::detail {
namespace {

constexpr unsigned kStoreThreads = 64;

struct StoreParams {
  void* k_blocks;
  void* v_blocks;
  const std::uint32_t* cache_lengths;
  const std::uint32_t* lookup;
  const std::uint32_t* row_offsets;
  const float* k_new;
  const float* v_new;
  std::uint32_t batch;
  std::uint32_t lookup_stride;
  std::uint32_t block_tokens;
  std::uint32_t n_kv;
  std::uint32_t dim;
  std::size_t block_stride;
  std::size_t token_stride;
  std::size_t head_stride;
  bool vec4;  // dim % 4 == 0 and every row 4-element aligned: float4 in, 4 elements out
};

// The entry owning global row r: the last b with row_offsets[b] <= r.
__device__ std::uint32_t entry_of_row(const std::uint32_t* row_offsets, std::uint32_t batch,
                                      std::uint32_t r) {
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

template <class T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

template <class T>
__device__ void store_row(const StoreParams& p, const float* src, T* dst) {
  if (p.vec4) {
    for (std::uint32_t c = threadIdx.x; c < p.dim / 4; c += blockDim.x) {
      const float4 x = reinterpret_cast<const float4*>(src)[c];
      Pack4<T> out{{from_f32<T>(x.x), from_f32<T>(x.y), from_f32<T>(x.z), from_f32<T>(x.w)}};
      reinterpret_cast<Pack4<T>*>(dst)[c] = out;
    }
  } else {
    for (std::uint32_t d = threadIdx.x; d < p.dim; d += blockDim.x) dst[d] = from_f32<T>(src[d]);
  }
}

template <class T>
__global__ void store_kv_kernel(StoreParams p) {
  const std::uint32_t r = blockIdx.x / p.n_kv;
  const std::uint32_t h = blockIdx.x % p.n_kv;
  const std::uint32_t b = entry_of_row(p.row_offsets, p.batch, r);
  const std::uint32_t pos = p.cache_lengths[b] + (r - p.row_offsets[b]);
  const std::uint32_t block = p.lookup[std::size_t{b} * p.lookup_stride + pos / p.block_tokens];
  const std::size_t off = std::size_t{block} * p.block_stride +
                          std::size_t{pos % p.block_tokens} * p.token_stride + h * p.head_stride;
  const std::size_t src = (std::size_t{r} * p.n_kv + h) * p.dim;
  store_row(p, p.k_new + src, static_cast<T*>(p.k_blocks) + off);
  store_row(p, p.v_new + src, static_cast<T*>(p.v_blocks) + off);
}

bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

}  // namespace

void store_kv_cuda(DType dtype, const LayerCacheDesc<float>& k, const LayerCacheDesc<float>& v,
                   std::span<const float> k_new, std::span<const float> v_new,
                   std::span<const std::uint32_t> row_offsets, CUstream_st* stream) {
  check_cache_pair(k, v);
  check_row_offsets_span(row_offsets, k.batch_size);
  const std::size_t row = std::size_t{k.n_kv_heads} * k.head_dim;
  const std::size_t rows = rows_of("k_new", k_new.size(), row);
  if (v_new.size() != k_new.size()) {
    throw InvalidArgument("v_new has " + std::to_string(v_new.size()) +
                          " elements, expected k_new's " + std::to_string(k_new.size()));
  }
  check_device_span("k_new", k_new.data(), k_new.size());
  check_device_span("v_new", v_new.data(), v_new.size());
  if (rows == 0 || k.batch_size == 0) return;
  if (rows * k.n_kv_heads > 0x7fffffffu) {
    throw InvalidArgument("store_kv of " + std::to_string(rows) + " rows x " +
                          std::to_string(k.n_kv_heads) + " heads exceeds the grid limit 2^31-1");
  }
  const std::size_t elem = dtype_size(dtype);
  StoreParams p{k.blocks,           v.blocks,        k.cache_lengths, k.lookup_table,
                row_offsets.data(), k_new.data(),    v_new.data(),    k.batch_size,
                k.lookup_stride,    k.block_tokens,  k.n_kv_heads,    k.head_dim,
                k.block_stride,     token_stride(k), head_stride(k),  false};
  p.vec4 = k.head_dim % 4 == 0 && k.block_stride % 4 == 0 && aligned(k.blocks, 4 * elem) &&
           aligned(v.blocks, 4 * elem) && aligned(k_new.data(), 16) && aligned(v_new.data(), 16);
  const unsigned grid = static_cast<unsigned>(rows * k.n_kv_heads);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    store_kv_kernel<T><<<grid, kStoreThreads, 0, stream>>>(p);
  });
  check_cuda(cudaGetLastError(), "store_kv kernel launch");
}

}  // namespace kvcache::cuda::detail
