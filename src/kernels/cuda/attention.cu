// kvcache::cuda::attention: split-KV flash attention with an online softmax.
//
// One thread block computes a tile of query vectors (up to kMaxVectors:
// rows_per_block new-token rows x heads_per_block query heads of ONE KV head,
// so the group's heads share every K/V load) over one split of the context.
// K/V come through shared memory in tiles of kTile tokens, converted to fp32
// (16-byte loads from the page when the rows allow it). Per tile: scores
// (one thread per (vector, token) dot product), an online-softmax update (one
// warp per vector, kTile == warp size), and the P.V accumulation (one thread
// per (vector, dim)) into an fp32 accumulator in shared memory. With one split
// the block writes normalised rows to `out`; with several, each split writes
// its normalised partial row and log-sum-exp, and merge_kernel combines them.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "attention_internal.h"
#include "cuda_check.h"
#include "decode_tuning.h"
#include "element.cuh"
#include "kvcache/cuda/kernels.h"
#include "validate.h"

namespace kvcache::cuda::detail {
namespace {

constexpr unsigned kThreads = 128;
constexpr std::uint32_t kTile = 32;  // tokens per K/V tile; == warp size (softmax step)
constexpr std::uint32_t kMaxVectors = 16;
constexpr std::uint32_t kMinSplitTokens = 256;
constexpr float kNegInf = -INFINITY;

// Shared memory of one block, carved from the dynamic allocation.
struct Smem {
  std::size_t* offs;   // [kTile] element offset of each tile token's row
  float* k_scale;      // [kTile] 8-bit: each tile token's K dequantisation scale
  float* v_scale;      // [kTile] 8-bit: its V scale
  std::uint32_t* lim;  // [M] exclusive end position each vector may see in this split
  float* q;            // [M][dim]
  float* k;            // [kTile][dim + 1]
  float* v;            // [kTile][dim + 1]
  float* s;            // [M][kTile] scores, then probabilities
  float* o;            // [M][dim] running (unnormalised) output
  float* m_run;        // [M] running max
  float* l_run;        // [M] running sum
  float* alpha;        // [M] rescale factor of this tile
};

std::size_t smem_bytes(std::uint32_t m, std::uint32_t dim) {
  const std::size_t floats = std::size_t{m} * dim * 2 + 2 * std::size_t{kTile} * (dim + 1) +
                             std::size_t{m} * kTile + 3 * std::size_t{m};
  return kTile * sizeof(std::size_t) + 2 * kTile * sizeof(float) + m * sizeof(std::uint32_t) +
         floats * sizeof(float);
}

__device__ Smem carve(unsigned char* raw, std::uint32_t m, std::uint32_t dim) {
  Smem s;
  s.offs = reinterpret_cast<std::size_t*>(raw);
  s.k_scale = reinterpret_cast<float*>(s.offs + kTile);
  s.v_scale = s.k_scale + kTile;
  s.lim = reinterpret_cast<std::uint32_t*>(s.v_scale + kTile);
  s.q = reinterpret_cast<float*>(s.lim + m);
  s.k = s.q + m * dim;
  s.v = s.k + kTile * (dim + 1);
  s.s = s.v + kTile * (dim + 1);
  s.o = s.s + m * kTile;
  s.m_run = s.o + m * dim;
  s.l_run = s.m_run + m;
  s.alpha = s.l_run + m;
  return s;
}

// Which query vector m of the block is: new-token row i (entry-local) and
// query head `head` of the group (group-local); valid when both exist.
struct Vector {
  std::uint32_t i;
  std::uint32_t head;
  bool valid;
};

__device__ Vector vector_of(const AttnParams& p, std::uint32_t m, std::uint32_t i0,
                            std::uint32_t head_tile, std::uint32_t n_rows) {
  Vector v;
  v.i = i0 + m / p.heads_per_block;
  v.head = head_tile * p.heads_per_block + m % p.heads_per_block;
  v.valid = v.i < n_rows && v.head < p.group;
  return v;
}

__device__ float warp_max(float x) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__device__ float warp_sum(float x) {
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <class T>
inline constexpr bool kQuantized = is_quantized(dtype_of_v<T>);
template <class T>
inline constexpr bool kPageScales = has_page_scales(dtype_of_v<T>);

// Element value as fp32: an 8-bit code times its scale.
template <class T>
__device__ __forceinline__ float dequant(T x, float scale) {
  if constexpr (kQuantized<T>) {
    return to_f32(x) * scale;
  } else {
    return to_f32(x);
  }
}

// Loads tokens [tok0, tok0 + n_t) of KV head kvh of entry b into s.k / s.v
// as fp32 (rows past n_t zero-filled, so 0 * value stays 0); 8-bit codes
// are multiplied by their scale (fp8: the head's, int8: the row's).
template <class T>
__device__ void load_tile(const AttnParams& p, const Smem& s, std::uint32_t b, std::uint32_t kvh,
                          std::uint32_t tok0, std::uint32_t n_t) {
  const std::uint32_t dim = p.dim, dp = dim + 1;
  if (threadIdx.x < n_t) {
    const std::uint32_t pos = tok0 + threadIdx.x;
    const std::uint32_t block = p.lookup[std::size_t{b} * p.lookup_stride + pos / p.page_size];
    const std::size_t in_block =
        std::size_t{pos % p.page_size} * p.token_stride + std::size_t{kvh} * p.head_stride;
    s.offs[threadIdx.x] = std::size_t{block} * p.block_stride + in_block;
    if constexpr (kPageScales<T>) {
      const std::size_t at =
          std::size_t{block} * p.block_stride + p.scales_offset + in_block / dim * sizeof(float);
      s.k_scale[threadIdx.x] =
          *reinterpret_cast<const float*>(static_cast<const unsigned char*>(p.k_blocks) + at);
      s.v_scale[threadIdx.x] =
          *reinterpret_cast<const float*>(static_cast<const unsigned char*>(p.v_blocks) + at);
    } else if constexpr (kQuantized<T>) {
      s.k_scale[threadIdx.x] = p.k_head_scales[kvh];
      s.v_scale[threadIdx.x] = p.v_head_scales[kvh];
    }
  }
  __syncthreads();
  const T* kb = static_cast<const T*>(p.k_blocks);
  const T* vb = static_cast<const T*>(p.v_blocks);
  if (p.vec) {
    constexpr std::uint32_t kVec = 16 / sizeof(T);
    const std::uint32_t chunks = dim / kVec;
    for (std::uint32_t c = threadIdx.x; c < kTile * chunks; c += blockDim.x) {
      const std::uint32_t t = c / chunks, d0 = (c % chunks) * kVec;
      T kv[kVec], vv[kVec];
      if (t < n_t) {
        const uint4 kr = *reinterpret_cast<const uint4*>(kb + s.offs[t] + d0);
        const uint4 vr = *reinterpret_cast<const uint4*>(vb + s.offs[t] + d0);
        memcpy(kv, &kr, 16);
        memcpy(vv, &vr, 16);
      }
      const float ks = kQuantized<T> && t < n_t ? s.k_scale[t] : 1.0f;
      const float vs = kQuantized<T> && t < n_t ? s.v_scale[t] : 1.0f;
#pragma unroll
      for (std::uint32_t j = 0; j < kVec; ++j) {
        s.k[t * dp + d0 + j] = t < n_t ? dequant(kv[j], ks) : 0.0f;
        s.v[t * dp + d0 + j] = t < n_t ? dequant(vv[j], vs) : 0.0f;
      }
    }
  } else {
    for (std::uint32_t idx = threadIdx.x; idx < kTile * dim; idx += blockDim.x) {
      const std::uint32_t t = idx / dim, d = idx % dim;
      s.k[t * dp + d] =
          t < n_t ? dequant(kb[s.offs[t] + d], kQuantized<T> ? s.k_scale[t] : 1.0f) : 0.0f;
      s.v[t * dp + d] =
          t < n_t ? dequant(vb[s.offs[t] + d], kQuantized<T> ? s.v_scale[t] : 1.0f) : 0.0f;
    }
  }
}

// s.s[m][t] = scale * q_m . k_t for positions the vector may see, else -inf.
__device__ void tile_scores(const AttnParams& p, const Smem& s, std::uint32_t m_count,
                            std::uint32_t tok0) {
  const std::uint32_t dim = p.dim, dp = dim + 1;
  for (std::uint32_t idx = threadIdx.x; idx < m_count * kTile; idx += blockDim.x) {
    const std::uint32_t m = idx / kTile, t = idx % kTile;
    float score = kNegInf;
    if (tok0 + t < s.lim[m]) {
      const float* qm = s.q + m * dim;
      const float* kt = s.k + t * dp;
      float acc = 0.0f;
      for (std::uint32_t d = 0; d < dim; ++d) acc = fmaf(qm[d], kt[d], acc);
      score = acc * p.scale;
    }
    s.s[idx] = score;
  }
}

// Online softmax: one warp per vector, lane t holds token t of the tile.
__device__ void tile_softmax(const Smem& s, std::uint32_t m_count) {
  const std::uint32_t lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (std::uint32_t m = threadIdx.x / 32; m < m_count; m += warps) {
    const float score = s.s[m * kTile + lane];
    const float m_old = s.m_run[m];
    const float m_new = fmaxf(m_old, warp_max(score));
    const float prob = score == kNegInf ? 0.0f : expf(score - m_new);
    const float a = m_new == kNegInf ? 1.0f : expf(m_old - m_new);
    const float sum = warp_sum(prob);
    s.s[m * kTile + lane] = prob;
    // Every lane has read m_run[m] and l_run[m] before lane 0 rewrites them
    // (the shuffles order that already; this says so to racecheck too).
    __syncwarp();
    if (lane == 0) {
      s.l_run[m] = s.l_run[m] * a + sum;
      s.m_run[m] = m_new;
      s.alpha[m] = a;
    }
  }
}

// o[m][d] = o[m][d] * alpha[m] + sum_t p[m][t] * v[t][d].
__device__ void tile_accumulate(const AttnParams& p, const Smem& s, std::uint32_t m_count,
                                std::uint32_t n_t) {
  const std::uint32_t dim = p.dim, dp = dim + 1;
  for (std::uint32_t idx = threadIdx.x; idx < m_count * dim; idx += blockDim.x) {
    const std::uint32_t m = idx / dim, d = idx % dim;
    const float* pm = s.s + m * kTile;
    float acc = s.o[idx] * s.alpha[m];
    for (std::uint32_t t = 0; t < n_t; ++t) acc = fmaf(pm[t], s.v[t * dp + d], acc);
    s.o[idx] = acc;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  std::uint32_t x = blockIdx.x;
  const std::uint32_t head_tile = x % p.head_tiles;
  x /= p.head_tiles;
  const std::uint32_t kvh = x % p.n_kv;
  x /= p.n_kv;
  const std::uint32_t row_tile = x % p.row_tiles;
  const std::uint32_t b = x / p.row_tiles;
  const std::uint32_t row_begin = p.row_offsets[b];
  const std::uint32_t n_rows = p.row_offsets[b + 1] - row_begin;
  const std::uint32_t i0 = row_tile * p.rows_per_block;
  if (i0 >= n_rows) return;  // uniform across the block

  const std::uint32_t m_count = p.rows_per_block * p.heads_per_block;
  const std::uint32_t dim = p.dim;
  const Smem s = carve(smem_raw, m_count, dim);
  const std::uint32_t cache_len = p.cache_lengths[b];
  const std::uint32_t split_begin = blockIdx.y * p.split_tokens;
  // The last split takes everything after its start: results never depend on
  // the view's max_full_context_length being exact.
  const std::uint32_t split_end =
      blockIdx.y + 1 == gridDim.y ? UINT32_MAX : split_begin + p.split_tokens;
  for (std::uint32_t m = threadIdx.x; m < m_count; m += blockDim.x) {
    const Vector v = vector_of(p, m, i0, head_tile, n_rows);
    s.lim[m] = v.valid ? min(cache_len + v.i + 1, split_end) : 0;
    s.m_run[m] = kNegInf;
    s.l_run[m] = 0.0f;
    s.alpha[m] = 1.0f;
  }
  for (std::uint32_t idx = threadIdx.x; idx < m_count * dim; idx += blockDim.x) {
    const Vector v = vector_of(p, idx / dim, i0, head_tile, n_rows);
    const std::size_t row = row_begin + v.i;
    s.q[idx] = v.valid ? p.q[(row * p.n_q + kvh * p.group + v.head) * dim + idx % dim] : 0.0f;
    s.o[idx] = 0.0f;
  }
  const std::uint32_t last_i = min(i0 + p.rows_per_block, n_rows) - 1;
  const std::uint32_t block_end = min(cache_len + last_i + 1, split_end);
  __syncthreads();
  for (std::uint32_t tok0 = split_begin; tok0 < block_end; tok0 += kTile) {
    const std::uint32_t n_t = min(kTile, block_end - tok0);
    load_tile<T>(p, s, b, kvh, tok0, n_t);
    __syncthreads();
    tile_scores(p, s, m_count, tok0);
    __syncthreads();
    tile_softmax(s, m_count);
    __syncthreads();
    tile_accumulate(p, s, m_count, n_t);
    __syncthreads();
  }
  for (std::uint32_t idx = threadIdx.x; idx < m_count * dim; idx += blockDim.x) {
    const std::uint32_t m = idx / dim, d = idx % dim;
    const Vector v = vector_of(p, m, i0, head_tile, n_rows);
    if (!v.valid) continue;
    const std::size_t rh = (std::size_t{row_begin} + v.i) * p.n_q + kvh * p.group + v.head;
    const float l = s.l_run[m];
    if (p.n_splits == 1) {
      p.out[rh * dim + d] = s.o[idx] / l;
      continue;
    }
    const std::size_t part = std::size_t{blockIdx.y} * p.total_rows * p.n_q + rh;
    p.part_o[part * dim + d] = l > 0.0f ? s.o[idx] / l : 0.0f;
    if (d == 0) p.part_lse[part] = l > 0.0f ? s.m_run[m] + logf(l) : kNegInf;
  }
}

// Merge geometry: a block owns kMergeDims dims of one (row, query head);
// kMergeLanes lanes cover one split's kMergeDims dims (4 consecutive floats
// each, one 16-byte load when head_dim % 4 == 0), so a warp reads 4 splits
// per step and a block of G groups (G = next power of two >= n_splits,
// 4..32) reads G splits at once: every partial of the block is loaded in
// one or a few independent rounds (<= 4 loads per thread at 128 splits).
constexpr unsigned kMergeDims = 32;
constexpr unsigned kMergeLanes = 8;
constexpr unsigned kMergeMaxGroups = 32;
constexpr unsigned kMergeMaxThreads = kMergeLanes * kMergeMaxGroups;

// Sum (kSum) or max over the block; every thread gets the result.
template <bool kSum>
__device__ float block_reduce(float x, float* red) {
  for (int o = 16; o > 0; o /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = kSum ? x + y : fmaxf(x, y);
  }
  const unsigned warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  float r = red[0];
  for (unsigned w = 1; w < warps; ++w) r = kSum ? r + red[w] : fmaxf(r, red[w]);
  __syncthreads();  // red may be reused
  return r;
}

// Combines the splits of (row, query head) blockIdx.x over dims
// [blockIdx.y * kMergeDims, +kMergeDims): weights exp(lse_s - max) / sum.
// Each thread reads at most one split's LSE (blockDim.x >= n_splits), the
// block reduces max and sum, group g = t / kMergeLanes accumulates splits
// g, g + G, ... (all loads independent), the groups' sums meet in shared
// memory and one warp writes the chunk.
__global__ void __launch_bounds__(kMergeMaxThreads) merge_kernel(AttnParams p) {
  static_assert(kMergeMaxThreads >= kMaxSplits, "one thread per split's LSE");
  __shared__ float weight[kMaxSplits];
  __shared__ float red[kMergeMaxThreads / 32];
  __shared__ float sums[kMergeMaxGroups][kMergeDims + 1];
  const std::size_t rh = blockIdx.x;
  const std::size_t stride = std::size_t{p.total_rows} * p.n_q;
  const unsigned t = threadIdx.x;
  const unsigned groups = blockDim.x / kMergeLanes;
  const float lse = t < p.n_splits ? p.part_lse[t * stride + rh] : kNegInf;
  const float mx = block_reduce<false>(lse, red);
  const float wt = lse == kNegInf ? 0.0f : expf(lse - mx);
  if (t < p.n_splits) weight[t] = wt;
  const float total = block_reduce<true>(wt, red);  // its barrier publishes weight
  const unsigned g = t / kMergeLanes;
  const unsigned d0 = blockIdx.y * kMergeDims + (t % kMergeLanes) * 4;
  const bool vec = p.dim % 4 == 0;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
  for (unsigned sp = g; sp < p.n_splits; sp += groups) {
    const float w = weight[sp];
    const float* src = p.part_o + (sp * stride + rh) * p.dim + d0;
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (vec) {
      if (d0 < p.dim) {
        const float4 v = *reinterpret_cast<const float4*>(src);
        x[0] = v.x;
        x[1] = v.y;
        x[2] = v.z;
        x[3] = v.w;
      }
    } else {
#pragma unroll
      for (unsigned e = 0; e < 4; ++e) x[e] = d0 + e < p.dim ? src[e] : 0.0f;
    }
#pragma unroll
    for (unsigned e = 0; e < 4; ++e) acc[e] = w != 0.0f ? fmaf(w, x[e], acc[e]) : acc[e];
  }
#pragma unroll
  for (unsigned e = 0; e < 4; ++e) sums[g][(t % kMergeLanes) * 4 + e] = acc[e];
  __syncthreads();
  if (t < kMergeDims) {
    const unsigned d = blockIdx.y * kMergeDims + t;
    float o = 0.0f;
    for (unsigned gg = 0; gg < groups; ++gg) o += sums[gg][t];
    if (d < p.dim) p.out[rh * p.dim + d] = o / total;
  }
}

// Tiling of the query vectors: heads per block, rows per block (both >= 1)
// within kMaxVectors and the device's shared memory.
void plan_tiles(AttnParams& p, std::uint32_t max_new, const DeviceLimits& lim) {
  p.heads_per_block = std::min(p.group, kMaxVectors);
  p.rows_per_block = std::max(1u, std::min(kMaxVectors / p.heads_per_block, max_new));
  while (smem_bytes(p.rows_per_block * p.heads_per_block, p.dim) >
             static_cast<std::size_t>(lim.smem_optin) &&
         p.rows_per_block * p.heads_per_block > 1) {
    if (p.rows_per_block > 1) {
      p.rows_per_block /= 2;
    } else {
      p.heads_per_block = (p.heads_per_block + 1) / 2;
    }
  }
  p.head_tiles = ceil_div(p.group, p.heads_per_block);
  p.row_tiles = ceil_div(max_new, p.rows_per_block);
}

// Splits of the context so that the grid fills the device about twice.
void plan_splits(AttnParams& p, std::uint64_t items, std::uint32_t max_context,
                 std::uint64_t resident_blocks) {
  const std::uint64_t target = 2 * resident_blocks;
  std::uint64_t splits = items >= target ? 1 : (target + items - 1) / items;
  splits = std::min<std::uint64_t>(splits, std::max(1u, max_context / kMinSplitTokens));
  splits = std::min<std::uint64_t>(splits, kMaxSplits);
  if (splits <= 1 || max_context == 0) {
    p.n_splits = 1;
    p.split_tokens = UINT32_MAX;
    return;
  }
  p.split_tokens = ceil_div(ceil_div(max_context, splits), kTile) * kTile;
  p.n_splits = ceil_div(max_context, p.split_tokens);
}

template <class T>
void launch(AttnParams p, std::uint64_t items, std::uint32_t max_context, CallContext& c) {
  const std::size_t smem = smem_bytes(p.rows_per_block * p.heads_per_block, p.dim);
  // The attribute is always the device's opt-in maximum (plan_tiles keeps
  // smem within it), so no call lowers it under another's launch.
  const int per_sm = blocks_per_sm(c, reinterpret_cast<const void*>(&attention_kernel<T>), kThreads,
                                   smem, static_cast<std::size_t>(c.lim.smem_optin));
  plan_splits(p, items, max_context, std::uint64_t(std::max(per_sm, 1)) * c.lim.sms);
  const StreamScratch scratch = make_partials(p, c);
  const dim3 grid(static_cast<unsigned>(items), p.n_splits);
  attention_kernel<T><<<grid, kThreads, smem, c.stream>>>(p);
  check_cuda(cudaGetLastError(), "attention kernel launch");
  launch_merge(p, c.stream);
}

void check_heads(std::uint32_t n_q_heads, std::uint32_t n_kv) {
  if (n_q_heads == 0 || n_q_heads % n_kv != 0) {
    throw InvalidArgument("n_q_heads " + std::to_string(n_q_heads) +
                          " must be a positive multiple of n_kv_heads " + std::to_string(n_kv));
  }
}

}  // namespace

DeviceLimits device_limits() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  DeviceLimits l;
  check_cuda(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, dev),
             "cudaDeviceGetAttribute(MultiProcessorCount)");
  check_cuda(cudaDeviceGetAttribute(&l.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
             "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  return l;
}

CallContext make_context(AttentionWorkspace* ws, cudaStream_t stream) {
  CallContext c;
  c.stream = stream;
  if (ws == nullptr) {
    c.lim = device_limits();
    return c;
  }
  c.ws = ws->state();
  if (c.ws == nullptr) {
    throw InvalidArgument("attention: the AttentionWorkspace is moved-from (empty)");
  }
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev != c.ws->device) {
    throw InvalidArgument("attention: the AttentionWorkspace belongs to device " +
                          std::to_string(c.ws->device) + " but device " + std::to_string(dev) +
                          " is current");
  }
  c.lim = c.ws->lim;
  return c;
}

int blocks_per_sm(CallContext& c, const void* kernel, int threads, std::size_t smem,
                  std::size_t attr_smem) {
  WorkspaceState* ws = c.ws;
  if (ws != nullptr) {
    for (const WorkspaceState::Occupancy& o : ws->occupancy) {
      if (o.kernel == kernel && o.smem == smem) return o.blocks_per_sm;
    }
  }
  const bool set = ws == nullptr || std::find(ws->attributes_set.begin(), ws->attributes_set.end(),
                                              kernel) == ws->attributes_set.end();
  if (set) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(attr_smem)),
               "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", attr_smem);
    if (ws != nullptr) ws->attributes_set.push_back(kernel);
  }
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  if (ws != nullptr) ws->occupancy.push_back({kernel, smem, per_sm});
  return per_sm;
}

StreamScratch make_partials(AttnParams& p, CallContext& c) {
  if (p.n_splits <= 1) return {};
  const std::size_t part_rows = std::size_t{p.n_splits} * p.total_rows * p.n_q;
  const std::size_t bytes = part_rows * (p.dim + 1) * sizeof(float);
  const auto point = [&](float* base) {
    p.part_o = base;
    p.part_lse = base + part_rows * p.dim;
  };
  WorkspaceState* ws = c.ws;
  if (ws == nullptr) {
    StreamScratch scratch(bytes, c.stream);
    point(scratch.floats());
    return scratch;
  }
  if (ws->capacity < bytes) {
    // Earlier calls on this stream may still read the old scratch.
    check_cuda(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");
    if (ws->scratch != nullptr) check_cuda(cudaFree(ws->scratch), "cudaFree");
    ws->scratch = nullptr;
    ws->capacity = 0;
    constexpr std::size_t kRound = std::size_t{1} << 16;
    const std::size_t grown = (bytes + kRound - 1) / kRound * kRound;
    check_cuda(cudaMalloc(&ws->scratch, grown), "cudaMalloc", grown);
    ws->capacity = grown;
  }
  point(static_cast<float*>(ws->scratch));
  return {};
}

void launch_merge(const AttnParams& p, cudaStream_t stream) {
  if (p.n_splits <= 1) return;
  unsigned groups = 4;
  while (groups < p.n_splits && groups < kMergeMaxGroups) groups *= 2;
  const dim3 grid(static_cast<unsigned>(std::size_t{p.total_rows} * p.n_q),
                  ceil_div(p.dim, kMergeDims));
  merge_kernel<<<grid, groups * kMergeLanes, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "attention merge kernel launch");
}

void attention_cuda(DType dtype, const CacheDesc& k, const CacheDesc& v, std::span<const float> q,
                    std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
                    std::span<float> out, const AttentionOptions& options, CUstream_st* stream,
                    AttentionWorkspace* workspace) {
  attention_cuda_tuned(dtype, k, v, q, n_q_heads, row_offsets, out, options, stream, workspace,
                       DecodeTuning{});
}

void attention_cuda_tuned(DType dtype, const CacheDesc& k, const CacheDesc& v,
                          std::span<const float> q, std::uint32_t n_q_heads,
                          std::span<const std::uint32_t> row_offsets, std::span<float> out,
                          const AttentionOptions& options, CUstream_st* stream,
                          AttentionWorkspace* workspace, const DecodeTuning& tuning) {
  check_cache_pair(k, v);
  check_row_offsets_span(row_offsets, k.batch_size);
  kvcache::detail::check_precision(options.precision);
  kvcache::detail::check_scale(options.scale);
  if (options.precision != AttentionPrecision::fp32) {
    throw InvalidArgument(
        "AttentionPrecision::bf16 is not supported by kvcache::cuda::attention "
        "(fp32 only)");
  }
  check_heads(n_q_heads, k.n_kv_heads);
  const std::size_t rows = rows_of("q", q.size(), std::size_t{n_q_heads} * k.head_dim);
  if (out.size() != q.size()) {
    throw InvalidArgument("out has " + std::to_string(out.size()) + " elements, expected q's " +
                          std::to_string(q.size()));
  }
  check_device_span("q", q.data(), q.size());
  check_device_span("out", out.data(), out.size());
  if (rows == 0 || k.batch_size == 0) return;
  if (k.max_seq_length == 0) {
    throw InvalidArgument("max_seq_length is 0 but q has " + std::to_string(rows) +
                          " rows: the view must give the batch's largest new-token count");
  }
  if (rows > UINT32_MAX) {
    throw InvalidArgument("q has " + std::to_string(rows) + " rows, limit 2^32-1");
  }
  AttnParams p{};
  p.k_blocks = k.blocks;
  p.v_blocks = v.blocks;
  p.cache_lengths = k.cache_lengths;
  p.lookup = k.lookup_table;
  p.row_offsets = row_offsets.data();
  p.q = q.data();
  p.out = out.data();
  p.block_stride = k.block_stride;
  p.token_stride = k.token_stride;
  p.head_stride = k.head_stride;
  p.lookup_stride = k.lookup_stride;
  p.page_size = k.page_size;
  p.page_pow2 = std::has_single_bit(k.page_size);
  p.page_shift = p.page_pow2 ? static_cast<std::uint32_t>(std::countr_zero(k.page_size)) : 0;
  p.n_kv = k.n_kv_heads;
  p.n_q = n_q_heads;
  p.group = n_q_heads / k.n_kv_heads;
  p.dim = k.head_dim;
  p.total_rows = static_cast<std::uint32_t>(rows);
  p.scale = options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(float(k.head_dim));
  const std::uint32_t vec = 16 / static_cast<std::uint32_t>(dtype_size(dtype));
  p.vec = k.head_dim % vec == 0 && k.block_stride % vec == 0 && k.token_stride % vec == 0 &&
          k.head_stride % vec == 0 && aligned16(k.blocks) && aligned16(v.blocks);
  p.k_head_scales = k.head_scales;
  p.v_head_scales = v.head_scales;
  p.scales_offset = k.block_values();
  p.scale_token_stride = k.token_stride / k.head_dim;
  p.scale_head_stride = k.head_stride / k.head_dim;
  CallContext ctx = make_context(workspace, to_stream(stream));
  if (!tuning.generic && decode_eligible(dtype, k, v)) {
    launch_decode(dtype, p, k, ctx, tuning);
    return;
  }
  if (!tuning.generic && prefill_eligible(dtype, k, v)) {
    launch_prefill(dtype, p, k, ctx);
    return;
  }
  plan_tiles(p, k.max_seq_length, ctx.lim);
  const std::uint64_t items = std::uint64_t{k.batch_size} * p.row_tiles * p.n_kv * p.head_tiles;
  if (items > 0x7fffffffu) {
    throw InvalidArgument("attention needs " + std::to_string(items) +
                          " thread blocks per split, limit 2^31-1");
  }
  visit_dtype(dtype,
              [&](auto tag) { launch<decltype(tag)>(p, items, k.max_full_context_length, ctx); });
}

}  // namespace kvcache::cuda::detail

namespace kvcache::cuda {

AttentionWorkspace::AttentionWorkspace() : state_(std::make_unique<detail::WorkspaceState>()) {
  detail::check_cuda(cudaGetDevice(&state_->device), "cudaGetDevice");
  state_->lim = detail::device_limits();
}
AttentionWorkspace::~AttentionWorkspace() = default;
AttentionWorkspace::AttentionWorkspace(AttentionWorkspace&& o) noexcept = default;
AttentionWorkspace& AttentionWorkspace::operator=(AttentionWorkspace&& o) noexcept = default;
int AttentionWorkspace::device() const noexcept { return state_ ? state_->device : -1; }
std::size_t AttentionWorkspace::capacity_bytes() const noexcept {
  return state_ ? state_->capacity : 0;
}

}  // namespace kvcache::cuda

namespace kvcache::cuda::detail {

const char* attention_kernel_name_cuda(DType dtype, const CacheDesc& k, const CacheDesc& v) {
  if (decode_eligible(dtype, k, v)) return "decode";
  return prefill_eligible(dtype, k, v) ? "prefill" : "generic";
}

}  // namespace kvcache::cuda::detail
