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
#include <cmath>
#include <cstdint>
#include <cstring>
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
  return kTile * sizeof(std::size_t) + m * sizeof(std::uint32_t) + floats * sizeof(float);
}

__device__ Smem carve(unsigned char* raw, std::uint32_t m, std::uint32_t dim) {
  Smem s;
  s.offs = reinterpret_cast<std::size_t*>(raw);
  s.lim = reinterpret_cast<std::uint32_t*>(s.offs + kTile);
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

// Loads tokens [tok0, tok0 + n_t) of KV head kvh of entry b into s.k / s.v
// as fp32 (rows past n_t zero-filled, so 0 * value stays 0).
template <class T>
__device__ void load_tile(const AttnParams& p, const Smem& s, std::uint32_t b, std::uint32_t kvh,
                          std::uint32_t tok0, std::uint32_t n_t) {
  const std::uint32_t dim = p.dim, dp = dim + 1;
  if (threadIdx.x < n_t) {
    const std::uint32_t pos = tok0 + threadIdx.x;
    const std::uint32_t block = p.lookup[std::size_t{b} * p.lookup_stride + pos / p.block_tokens];
    s.offs[threadIdx.x] = std::size_t{block} * p.block_stride +
                          std::size_t{pos % p.block_tokens} * p.token_stride +
                          std::size_t{kvh} * p.head_stride;
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
#pragma unroll
      for (std::uint32_t j = 0; j < kVec; ++j) {
        s.k[t * dp + d0 + j] = t < n_t ? to_f32(kv[j]) : 0.0f;
        s.v[t * dp + d0 + j] = t < n_t ? to_f32(vv[j]) : 0.0f;
      }
    }
  } else {
    for (std::uint32_t idx = threadIdx.x; idx < kTile * dim; idx += blockDim.x) {
      const std::uint32_t t = idx / dim, d = idx % dim;
      s.k[t * dp + d] = t < n_t ? to_f32(kb[s.offs[t] + d]) : 0.0f;
      s.v[t * dp + d] = t < n_t ? to_f32(vb[s.offs[t] + d]) : 0.0f;
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
  // the view's max_cache_length being exact.
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

// Combines the splits of one (row, query head): weights exp(lse_s - max).
// All loads are parallel: thread s reads split s's LSE (block max and sum by
// shuffles), then warp w sums splits w, w + 4, ... over the dims (lane d,
// d + 32, ...; coalesced rows, unrolled so several splits' loads are in
// flight), and the four warps' sums are added through shared memory.
__global__ void __launch_bounds__(kThreads) merge_kernel(AttnParams p) {
  constexpr unsigned kWarpsM = kThreads / 32;
  constexpr unsigned kPerLane = kMaxHeadDim / 32;
  static_assert(kThreads >= kMaxSplits, "one thread per split's LSE");
  __shared__ float weight[kMaxSplits];
  __shared__ float red[kWarpsM];
  __shared__ float sums[kWarpsM][kMaxHeadDim];
  const std::size_t rh = blockIdx.x;
  const std::size_t stride = std::size_t{p.total_rows} * p.n_q;
  const unsigned t = threadIdx.x, lane = t % 32, warp = t / 32;
  const float lse = t < p.n_splits ? p.part_lse[t * stride + rh] : kNegInf;
  float mx = lse;
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
  for (unsigned w = 1; w < kWarpsM; ++w) mx = fmaxf(mx, red[w]);
  const float wt = lse == kNegInf ? 0.0f : expf(lse - mx);
  if (t < kMaxSplits) weight[t] = wt;
  float sum = wt;
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __syncthreads();  // every thread has read red (the max)
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  float total = 0.0f;
  for (unsigned w = 0; w < kWarpsM; ++w) total += red[w];
  float acc[kPerLane];
#pragma unroll
  for (unsigned j = 0; j < kPerLane; ++j) acc[j] = 0.0f;
#pragma unroll 4
  for (unsigned sp = warp; sp < p.n_splits; sp += kWarpsM) {
    const float w = weight[sp];
    const float* src = p.part_o + (sp * stride + rh) * p.dim;
#pragma unroll
    for (unsigned j = 0; j < kPerLane; ++j) {
      const unsigned d = lane + 32 * j;
      if (d < p.dim) {
        const float x = src[d];
        acc[j] = w != 0.0f ? fmaf(w, x, acc[j]) : acc[j];
      }
    }
  }
#pragma unroll
  for (unsigned j = 0; j < kPerLane; ++j) {
    if (lane + 32 * j < p.dim) sums[warp][lane + 32 * j] = acc[j];
  }
  __syncthreads();
  const float inv_total = 1.0f / total;
  for (unsigned d = t; d < p.dim; d += kThreads) {
    float o = 0.0f;
    for (unsigned w = 0; w < kWarpsM; ++w) o += sums[w][d];
    p.out[rh * p.dim + d] = o * inv_total;
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
void launch(AttnParams p, std::uint64_t items, std::uint32_t max_context, const DeviceLimits& lim,
            cudaStream_t stream, const DecodeTuning& ws) {
  const std::size_t smem = smem_bytes(p.rows_per_block * p.heads_per_block, p.dim);
  check_cuda(cudaFuncSetAttribute(attention_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)),
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", smem);
  int per_sm = 0;
  check_cuda(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_kernel<T>, kThreads, smem),
      "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  plan_splits(p, items, max_context, std::uint64_t(std::max(per_sm, 1)) * lim.sms);
  const StreamScratch scratch = make_partials(p, stream, ws);
  const dim3 grid(static_cast<unsigned>(items), p.n_splits);
  attention_kernel<T><<<grid, kThreads, smem, stream>>>(p);
  check_cuda(cudaGetLastError(), "attention kernel launch");
  launch_merge(p, stream);
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

StreamScratch make_partials(AttnParams& p, cudaStream_t stream, const DecodeTuning& t) {
  const std::size_t part_rows = std::size_t{p.n_splits} * p.total_rows * p.n_q;
  const std::size_t bytes = p.n_splits > 1 ? part_rows * (p.dim + 1) * sizeof(float) : 0;
  const bool given = t.workspace != nullptr && t.workspace_bytes >= bytes;
  StreamScratch scratch(given ? 0 : bytes, stream);
  if (p.n_splits > 1) {
    float* base = given ? t.workspace : scratch.floats();
    p.part_o = base;
    p.part_lse = base + part_rows * p.dim;
  }
  return scratch;
}

std::size_t max_workspace_bytes(std::size_t q_rows, std::uint32_t n_q_heads,
                                std::uint32_t head_dim) {
  return std::size_t{kMaxSplits} * q_rows * n_q_heads * (std::size_t{head_dim} + 1) * sizeof(float);
}

void launch_merge(const AttnParams& p, cudaStream_t stream) {
  if (p.n_splits <= 1) return;
  merge_kernel<<<static_cast<unsigned>(std::size_t{p.total_rows} * p.n_q), kThreads, 0, stream>>>(
      p);
  check_cuda(cudaGetLastError(), "attention merge kernel launch");
}

void attention_cuda(DType dtype, const LayerCacheDesc<float>& k, const LayerCacheDesc<float>& v,
                    std::span<const float> q, std::uint32_t n_q_heads,
                    std::span<const std::uint32_t> row_offsets, std::span<float> out,
                    const AttentionOptions& options, CUstream_st* stream) {
  attention_cuda_tuned(dtype, k, v, q, n_q_heads, row_offsets, out, options, stream,
                       DecodeTuning{});
}

void attention_cuda_tuned(DType dtype, const LayerCacheDesc<float>& k,
                          const LayerCacheDesc<float>& v, std::span<const float> q,
                          std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
                          std::span<float> out, const AttentionOptions& options,
                          CUstream_st* stream, const DecodeTuning& tuning) {
  check_cache_pair(k, v);
  check_row_offsets_span(row_offsets, k.batch_size);
  kvcache::detail::check_precision(options.precision);
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
  p.token_stride = token_stride(k);
  p.head_stride = head_stride(k);
  p.lookup_stride = k.lookup_stride;
  p.block_tokens = k.block_tokens;
  p.n_kv = k.n_kv_heads;
  p.n_q = n_q_heads;
  p.group = n_q_heads / k.n_kv_heads;
  p.dim = k.head_dim;
  p.total_rows = static_cast<std::uint32_t>(rows);
  p.scale = options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(float(k.head_dim));
  const std::uint32_t vec = 16 / static_cast<std::uint32_t>(dtype_size(dtype));
  p.vec = k.head_dim % vec == 0 && k.block_stride % vec == 0 && aligned16(k.blocks) &&
          aligned16(v.blocks);
  const DeviceLimits lim = device_limits();
  if (decode_eligible(dtype, k, v)) {
    launch_decode(dtype, p, k, lim, to_stream(stream), tuning);
    return;
  }
  plan_tiles(p, k.max_seq_length, lim);
  const std::uint64_t items = std::uint64_t{k.batch_size} * p.row_tiles * p.n_kv * p.head_tiles;
  if (items > 0x7fffffffu) {
    throw InvalidArgument("attention needs " + std::to_string(items) +
                          " thread blocks per split, limit 2^31-1");
  }
  visit_dtype(dtype, [&](auto tag) {
    launch<decltype(tag)>(p, items, k.max_cache_length, lim, stream, tuning);
  });
}

const char* attention_kernel_name_cuda(DType dtype, const LayerCacheDesc<float>& k,
                                       const LayerCacheDesc<float>& v) {
  return decode_eligible(dtype, k, v) ? "decode" : "generic";
}

}  // namespace kvcache::cuda::detail
