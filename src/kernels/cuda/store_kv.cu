// kvcache::cuda::store_kv: a streaming kernel over whole token rows, with
// optional RoPE on K (StoreOptions::rope_k).
//
// Work: a group of G lanes (G = 32, or the next power of two >= a token's
// units when a token row is smaller) owns one new token, i.e. all n_kv_heads
// heads of it; a warp owns a contiguous run of tokens (slots of 32 / G
// tokens), so the bookkeeping (the token's entry: a binary search over
// row_offsets once per warp, then a linear step per token; its position and
// page lookup) is done once per token for all its heads. 256-thread blocks,
// grid = min(work, 4 blocks per SM, 3 with RoPE): each warp walks ~tokens / (warps) tokens.
// A lane converts units of W consecutive elements: W = 8 (f16 / bf16: two
// float4 loads, one 16-byte store), 4 (f32, or 16-bit rows whose head_dim is
// a multiple of 4 only: float4 load, 16- or 8-byte store) or 1 (odd head
// dims, unaligned pools). Two units per lane are loaded (K and V) before any
// is stored, so each lane has 8 float4 loads in flight at W = 8.
// Rounding: the same integer round-to-nearest-even as kvcache/dtype.h for
// bf16; f16 through the hardware's round-to-nearest-even pair conversion
// (cvt.rn.f16x2.f32, IEEE: the same bits as f32_to_f16_bits for every
// non-NaN input) with NaNs taken from the software path (payload kept).
// RoPE: the group computes the token's cos / sin (rotary_dim / 2 pairs,
// shared by its heads) into shared memory: angle = double(pos) *
// double(inv_freq) (exact for pos < 2^29), sincos in double (CUDA: <= 2 ulp
// of double, argument reduction exact for any position), rounded once to
// float: the reference's rope_cos_sin up to the last bit of a double. The
// inverse frequencies are the host's (rope_inv_freqs, double pow) passed as
// kernel parameters. A lane rotating unit c (in the first rotary half) loads
// its partner unit c + half / W too (and vice versa): the pair's other half
// usually comes from L1 / L2, the DRAM traffic is unchanged. The rotation is
// rope_rotate_pair's fma(x0, c, -(x1 * s)), fma(x0, s, x1 * c) with explicit
// __fmaf_rn / __fmul_rn (no contraction), so equal cos / sin give equal bits.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
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

constexpr unsigned kStoreThreads = 256;
constexpr unsigned kStoreWarps = kStoreThreads / 32;
// Resident blocks per SM the grid is sized for (__launch_bounds__): <= 64
// registers without RoPE, <= 80 with (its partner units and cos / sin).
constexpr unsigned blocks_per_sm(bool rope) { return rope ? 3 : 4; }
constexpr unsigned kMaxPairs = kMaxHeadDim / 2;
// cos + sin floats of one warp: (32 / G) groups x rotary_dim <= 256 (G >=
// the token's units >= head_dim / W when G < 32, so (32 / G) * head_dim <= 32 W).
constexpr unsigned kCsPerWarp = 256;

struct StoreParams {
  void* k_blocks;
  void* v_blocks;
  const std::uint32_t* cache_lengths;
  const std::uint32_t* lookup;
  const std::uint32_t* row_offsets;
  const float* k_new;
  const float* v_new;
  std::size_t block_stride;
  std::size_t token_stride;
  std::size_t head_stride;
  std::uint32_t batch;
  std::uint32_t lookup_stride;
  std::uint32_t page_size;
  std::uint32_t dim;
  std::uint32_t tokens;          // total new tokens
  std::uint32_t units;           // units of W elements per token row (n_kv * dim / W)
  std::uint32_t head_units;      // units per head (dim / W)
  std::uint32_t half;            // RoPE: rotary_dim / 2 (elements)
  std::uint32_t group_shift;     // log2 G
  std::uint32_t slots;           // ceil(tokens / (32 / G))
  std::uint32_t slots_per_warp;  // contiguous slots per warp
  float inv_freq[kMaxPairs];     // RoPE: the host's rope_inv_freqs
};

template <int W>
struct Vec {
  float x[W];
};

template <int W>
__device__ inline Vec<W> load_vec(const float* src) {
  Vec<W> v;
  if constexpr (W == 1) {
    v.x[0] = *src;
  } else {
#pragma unroll
    for (int i = 0; i < W / 4; ++i) {
      const float4 f = reinterpret_cast<const float4*>(src)[i];
      v.x[4 * i] = f.x;
      v.x[4 * i + 1] = f.y;
      v.x[4 * i + 2] = f.z;
      v.x[4 * i + 3] = f.w;
    }
  }
  return v;
}

template <class T, int W>
struct alignas(W * sizeof(T)) Pack {
  T v[W];
};

__device__ inline bool is_nan_bits(float x) {
  return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u;
}

// Two floats to f16 bits, round to nearest even: the hardware pair
// conversion (IEEE RNE, subnormals and overflow to infinity included: the
// bits of f32_to_f16_rne), NaNs from f32_to_f16_rne (it keeps the payload).
__device__ inline void f16_pair(float a, float b, Half& ha, Half& hb) {
  const __half2 h = __floats2half2_rn(a, b);
  ha.bits = is_nan_bits(a) ? f32_to_f16_rne(a) : __half_as_ushort(__low2half(h));
  hb.bits = is_nan_bits(b) ? f32_to_f16_rne(b) : __half_as_ushort(__high2half(h));
}

template <class T, int W>
__device__ inline void store_vec(T* dst, const Vec<W>& v) {
  Pack<T, W> out;
  if constexpr (std::is_same_v<T, Half> && W % 2 == 0) {
#pragma unroll
    for (int i = 0; i < W; i += 2) f16_pair(v.x[i], v.x[i + 1], out.v[i], out.v[i + 1]);
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) out.v[i] = from_f32<T>(v.x[i]);
  }
  *reinterpret_cast<Pack<T, W>*>(dst) = out;
}

template <int W>
__device__ inline Vec<W> load_cs(const float* p) {
  if constexpr (W == 1) {
    return Vec<W>{{*p}};
  } else {
    Vec<W> v;
#pragma unroll
    for (int i = 0; i < W / 4; ++i) {
      const float4 f = reinterpret_cast<const float4*>(p)[i];
      v.x[4 * i] = f.x;
      v.x[4 * i + 1] = f.y;
      v.x[4 * i + 2] = f.z;
      v.x[4 * i + 3] = f.w;
    }
    return v;
  }
}

// x = unit c of a K head, y = its partner (c +- half / W); cs = the token's
// cos [0, half) and sin [half, 2 half). Exactly rope_rotate_pair.
template <int W>
__device__ inline void rotate(Vec<W>& x, const Vec<W>& y, bool first_half, const float* cs,
                              std::uint32_t pair, std::uint32_t half) {
  const Vec<W> c = load_cs<W>(cs + pair);
  const Vec<W> s = load_cs<W>(cs + half + pair);
#pragma unroll
  for (int i = 0; i < W; ++i) {
    x.x[i] = first_half ? __fmaf_rn(x.x[i], c.x[i], -__fmul_rn(y.x[i], s.x[i]))
                        : __fmaf_rn(y.x[i], s.x[i], __fmul_rn(x.x[i], c.x[i]));
  }
}

template <class T, int W, bool kRope>
__global__ void __launch_bounds__(kStoreThreads, blocks_per_sm(kRope))
    store_kv_kernel(const __grid_constant__ StoreParams p) {
  __shared__ alignas(16) float s_inv[kRope ? kMaxPairs : 1];
  __shared__ alignas(16) float s_cs[kRope ? kStoreWarps : 1][kRope ? kCsPerWarp : 1];
  if constexpr (kRope) {
    for (std::uint32_t i = threadIdx.x; i < p.half; i += blockDim.x) s_inv[i] = p.inv_freq[i];
    __syncthreads();
  }
  const std::uint32_t lane = threadIdx.x & 31u;
  const std::uint32_t warp = threadIdx.x >> 5;
  const std::uint32_t g = 1u << p.group_shift;  // lanes per token
  const std::uint32_t gl = lane & (g - 1);      // lane within the group
  const std::uint32_t grp = lane >> p.group_shift;
  const std::uint32_t per_slot = 32u >> p.group_shift;
  const std::uint32_t first = (blockIdx.x * kStoreWarps + warp) * p.slots_per_warp;
  const std::uint32_t end = min(first + p.slots_per_warp, p.slots);
  const std::uint32_t half = p.half;
  const std::uint32_t hu = half / W;  // units per rotary half
  float* cs = kRope ? &s_cs[warp][0] + grp * 2 * half : nullptr;
  const std::size_t row = std::size_t{p.units} * W;
  std::uint32_t b = 0;
  bool have_entry = false;
  for (std::uint32_t slot = first; slot < end; ++slot) {  // warp-uniform
    const std::uint32_t r = slot * per_slot + grp;
    const bool active = r < p.tokens;
    std::uint32_t pos = 0;
    std::size_t base = 0;
    if (active) {
      if (!have_entry) {
        b = entry_of_row(p.row_offsets, p.batch, r);
        have_entry = true;
      } else {
        while (p.row_offsets[b + 1] <= r) ++b;  // tokens only grow along a warp's run
      }
      pos = p.cache_lengths[b] + (r - p.row_offsets[b]);
      const std::uint32_t block = p.lookup[std::size_t{b} * p.lookup_stride + pos / p.page_size];
      base = std::size_t{block} * p.block_stride + std::size_t{pos % p.page_size} * p.token_stride;
    }
    if constexpr (kRope) {
      __syncwarp();  // the previous token's cos / sin are read
      if (active) {
        for (std::uint32_t i = gl; i < half; i += g) {
          double sn = 0.0, cn = 0.0;
          sincos(__dmul_rn(static_cast<double>(pos), static_cast<double>(s_inv[i])), &sn, &cn);
          cs[i] = __double2float_rn(cn);
          cs[half + i] = __double2float_rn(sn);
        }
      }
      __syncwarp();
    }
    if (!active) continue;
    const float* ks = p.k_new + std::size_t{r} * row;
    const float* vs = p.v_new + std::size_t{r} * row;
    T* kd = static_cast<T*>(p.k_blocks) + base;
    T* vd = static_cast<T*>(p.v_blocks) + base;
    for (std::uint32_t u0 = gl; u0 < p.units; u0 += 2 * g) {
      Vec<W> kx[2], vx[2], kp[2];
      std::uint32_t h[2], c[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const std::uint32_t u = u0 + j * g;
        if (u < p.units) {
          h[j] = u / p.head_units;
          c[j] = u - h[j] * p.head_units;
          kx[j] = load_vec<W>(ks + std::size_t{u} * W);
          vx[j] = load_vec<W>(vs + std::size_t{u} * W);
          if (kRope && c[j] < 2 * hu) {
            kp[j] = load_vec<W>(ks + std::size_t{c[j] < hu ? u + hu : u - hu} * W);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const std::uint32_t u = u0 + j * g;
        if (u < p.units) {
          if (kRope && c[j] < 2 * hu) {
            const bool lo = c[j] < hu;
            rotate<W>(kx[j], kp[j], lo, cs, (lo ? c[j] : c[j] - hu) * W, half);
          }
          const std::size_t off = std::size_t{h[j]} * p.head_stride + std::size_t{c[j]} * W;
          store_vec<T, W>(kd + off, kx[j]);
          store_vec<T, W>(vd + off, vx[j]);
        }
      }
    }
  }
}

bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

template <class T, int W>
void launch(bool rope, unsigned grid, const StoreParams& p, CUstream_st* stream) {
  if (rope) {
    store_kv_kernel<T, W, true><<<grid, kStoreThreads, 0, stream>>>(p);
  } else {
    store_kv_kernel<T, W, false><<<grid, kStoreThreads, 0, stream>>>(p);
  }
}

// The CPU's option checks (kvcache/kernels/rope.h, store_kv_cpu) that apply
// on the device; returns rotary_dim in effect, 0 without RoPE.
std::uint32_t check_store_options(const StoreOptions& options, std::uint32_t head_dim) {
  if (options.prefetch > StorePrefetch::none) {
    throw InvalidArgument("StoreOptions::prefetch value " +
                          std::to_string(static_cast<int>(options.prefetch)) +
                          " is not automatic, next_row_l1 or none");
  }
  if (options.rope_table != nullptr) {
    throw InvalidArgument(
        "StoreOptions::rope_table is set: kvcache::cuda::store_kv does not take a RopeTable "
        "(host memory; the device computes cos/sin per token), pass nullptr");
  }
  if (!options.rope_k.enabled) return 0;
  return rope_rotary_dim(options.rope_k, head_dim);
}

}  // namespace

void store_kv_cuda(DType dtype, const CacheDesc& k, const CacheDesc& v,
                   std::span<const float> k_new, std::span<const float> v_new,
                   std::span<const std::uint32_t> row_offsets, const StoreOptions& options,
                   CUstream_st* stream) {
  check_cache_pair(k, v);
  check_row_offsets_span(row_offsets, k.batch_size);
  const std::uint32_t rotary_dim = check_store_options(options, k.head_dim);
  const std::size_t row = std::size_t{k.n_kv_heads} * k.head_dim;
  const std::size_t rows = rows_of("k_new", k_new.size(), row);
  if (v_new.size() != k_new.size()) {
    throw InvalidArgument("v_new has " + std::to_string(v_new.size()) +
                          " elements, expected k_new's " + std::to_string(k_new.size()));
  }
  check_device_span("k_new", k_new.data(), k_new.size());
  check_device_span("v_new", v_new.data(), v_new.size());
  if (rows == 0 || k.batch_size == 0) return;
  if (rows > 0xffffffffu) {
    throw InvalidArgument("store_kv of " + std::to_string(rows) +
                          " rows exceeds the row index limit 2^32-1");
  }
  if (is_quantized(dtype)) {
    store_kv_q8_cuda(dtype, k, v, k_new, v_new, row_offsets, rotary_dim, options.rope_k.theta, rows,
                     stream);
    return;
  }
  const std::uint32_t half = rotary_dim / 2;
  const std::size_t elem = dtype_size(dtype);
  const std::size_t tstride = k.token_stride, hstride = k.head_stride;
  // Widest unit every row, page and rotary half allows.
  const auto fits = [&](std::uint32_t w) {
    return k.head_dim % w == 0 && half % w == 0 && k.block_stride % w == 0 && tstride % w == 0 &&
           hstride % w == 0 && aligned(k.blocks, w * elem) && aligned(v.blocks, w * elem) &&
           aligned(k_new.data(), 16) && aligned(v_new.data(), 16);
  };
  const std::uint32_t w = elem == 2 && fits(8) ? 8 : fits(4) ? 4 : 1;
  StoreParams p{};
  p.k_blocks = k.blocks;
  p.v_blocks = v.blocks;
  p.cache_lengths = k.cache_lengths;
  p.lookup = k.lookup_table;
  p.row_offsets = row_offsets.data();
  p.k_new = k_new.data();
  p.v_new = v_new.data();
  p.block_stride = k.block_stride;
  p.token_stride = tstride;
  p.head_stride = hstride;
  p.batch = k.batch_size;
  p.lookup_stride = k.lookup_stride;
  p.page_size = k.page_size;
  p.dim = k.head_dim;
  p.tokens = static_cast<std::uint32_t>(rows);
  p.units = static_cast<std::uint32_t>(row / w);
  p.head_units = k.head_dim / w;
  p.half = half;
  std::uint32_t g = 1;
  while (g < 32 && g < p.units) g *= 2;
  p.group_shift = static_cast<std::uint32_t>(__builtin_ctz(g));
  const std::uint32_t per_slot = 32 / g;
  p.slots = (p.tokens + per_slot - 1) / per_slot;
  if (half != 0) {
    const std::vector<float> f = rope_inv_freqs(rotary_dim, options.rope_k.theta);
    std::copy(f.begin(), f.end(), p.inv_freq);
  }
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiprocessor count)");
  const std::uint64_t max_warps = std::uint64_t{static_cast<unsigned>(std::max(sms, 1))} *
                                  blocks_per_sm(half != 0) * kStoreWarps;
  const std::uint64_t warps = std::min<std::uint64_t>(p.slots, max_warps);
  p.slots_per_warp = static_cast<std::uint32_t>((p.slots + warps - 1) / warps);
  const std::uint64_t used_warps = (p.slots + p.slots_per_warp - 1) / p.slots_per_warp;
  const unsigned grid = static_cast<unsigned>((used_warps + kStoreWarps - 1) / kStoreWarps);
  const bool rope = half != 0;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_quantized(dtype_of_v<T>)) {
      return;  // 8-bit caches: store_kv_q8_cuda above
    } else if (w == 8) {
      if constexpr (sizeof(T) == 2) launch<T, 8>(rope, grid, p, stream);
    } else if (w == 4) {
      launch<T, 4>(rope, grid, p, stream);
    } else {
      launch<T, 1>(rope, grid, p, stream);
    }
  });
  check_cuda(cudaGetLastError(), "store_kv kernel launch");
}

}  // namespace kvcache::cuda::detail
