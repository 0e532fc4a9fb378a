// kvcache::cuda::attention for prefill and mixed batches on f16 / bf16
// caches: a FlashAttention-2 style kernel on the tensor cores
// (mma.sync.aligned.m16n8k16, 16-bit inputs, f32 accumulators).
// attention.cu's prefill_eligible decides when it runs (f16 / bf16, head_dim
// in {64, 80, 96, 128}, the view's max_seq_length > kDecodeMaxRows, 16-byte
// aligned pools); everything else keeps the decode or the generic kernel.
//
// Query vectors: an entry's new rows x the query heads of ONE KV head,
// flattened as v = row * group + head (so GQA heads of a row are adjacent and
// share every K/V tile). A block (kWarps warps) owns kM = 16 x kWarps
// consecutive vectors of one (entry, KV head); warp w owns vectors
// [16 w, 16 w + 16), the m16 tile of its mma. Grid: blockIdx.x = (entry, KV
// head, vector tile), tiles in reverse order so the longest (last rows,
// causal) start first; blocks past the entry's vectors exit.
//
// Per block: Q (f32 in global memory) is rounded to the cache's 16-bit type
// into shared memory, then held as mma A fragments in registers. K / V tiles
// of kN tokens are gathered from the pages (one page-table lookup per token
// row) with 16-byte cp.async copies into a double buffer (the next tile is in
// flight while this one is computed; zero-filled past the block's range).
// Rows are padded by 16 bytes, so the 8 rows of each ldmatrix 8x8 matrix fall
// into distinct 16-byte bank groups (conflict-free for head dims 64..128).
// S = Q K^T (ldmatrix.x4 of K), scaled in f32 by scale * log2(e), causal
// mask (vector of new row i of entry b sees positions < cache_length + i +
// 1; only tiles that reach past the block's smallest limit are masked; tiles
// past the block's largest limit are never loaded), online softmax in f32
// registers (base 2; row max / sum across the 4 lanes of a quad), P rounded
// to the 16-bit type in registers (the S accumulator layout is the A
// fragment layout of the next mma), O += P V (ldmatrix.x4.trans of V), O in
// f32 registers. The row sum l is accumulated from the f32 probabilities
// before rounding (as FlashAttention does). No split-KV: one block covers its
// vectors' whole context.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "async_copy.cuh"
#include "attention_internal.h"
#include "cuda_check.h"
#include "kvcache/cuda/kernels.h"
#include "kvcache/dtype.h"

namespace kvcache::cuda::detail {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kM = 16 * kWarps;  // query vectors per block
constexpr int kN = 64;           // tokens per K/V tile
constexpr int kPad = 8;          // elements of padding per shared row (16 bytes)
constexpr float kNegInf = -INFINITY;
constexpr float kLog2e = 1.4426950408889634f;

struct PrefillParams {
  AttnParams a;
  std::uint32_t tiles;  // vector tiles per (entry, KV head)
  float s_scale;        // scale * log2(e)
};

template <int kD>
struct Shape {
  static constexpr int kStride = kD + kPad;  // elements per shared row
  static constexpr int kChunks = kD / 8;     // 16-byte chunks per row
  static constexpr int kKSteps = kD / 16;    // k16 steps of Q K^T
  static constexpr int kDTiles = kD / 8;     // n8 tiles of O
  static constexpr int kQElems = kM * kStride;
  static constexpr int kKVElems = kN * kStride;
  // Q, then 2 x K, then 2 x V (16-bit elements).
  static constexpr std::size_t kSmem = (std::size_t{kQElems} + 4 * kKVElems) * 2;
  static_assert(kD % 16 == 0 && (kN * kChunks) % kThreads == 0);
};

// ---- PTX wrappers ----

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b, m16n8k16, f32 accumulators.
template <class T>
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                    unsigned b1) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two f32 as a packed pair of 16-bit values (round to nearest even), x low.
template <class T>
__device__ __forceinline__ unsigned pack2(float x, float y) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const unsigned*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<const unsigned*>(&h);
  }
}

// ---- the kernel ----

// Issues the cp.async copies of K and V tokens [tok0, tok0 + kN) into one
// buffer (tokens >= end zero-filled). Thread t copies chunks t, t +
// kThreads, ... of the tile's kN x kChunks chunks.
template <class T, int kD>
__device__ __forceinline__ void issue_tile(const PrefillParams& p, std::uint32_t b,
                                           std::uint32_t kvh, std::uint32_t tok0, std::uint32_t end,
                                           unsigned k_dst, unsigned v_dst) {
  using S = Shape<kD>;
  const T* kb = static_cast<const T*>(p.a.k_blocks);
  const T* vb = static_cast<const T*>(p.a.v_blocks);
  constexpr int kPerThread = kN * S::kChunks / kThreads;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int c = static_cast<int>(threadIdx.x) + j * kThreads;
    const int t = c / S::kChunks, ch = c % S::kChunks;
    const std::uint32_t tok = tok0 + t;
    const bool in = tok < end;
    const std::size_t off = (in ? row_offset(p.a, b, kvh, tok) : 0) + std::size_t(ch) * 8;
    const unsigned so = static_cast<unsigned>((t * S::kStride + ch * 8) * 2);
    cp_async16(k_dst + so, kb + off, in);
    cp_async16(v_dst + so, vb + off, in);
  }
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads) prefill_kernel(const PrefillParams p) {
  using S = Shape<kD>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const AttnParams& a = p.a;
  std::uint32_t x = blockIdx.x;
  const std::uint32_t tile = p.tiles - 1 - x % p.tiles;  // longest tiles first
  x /= p.tiles;
  const std::uint32_t kvh = x % a.n_kv;
  const std::uint32_t b = x / a.n_kv;
  const std::uint32_t row_begin = a.row_offsets[b];
  const std::uint32_t n_rows = a.row_offsets[b + 1] - row_begin;
  const std::uint32_t n_vec = n_rows * a.group;
  const std::uint32_t v0 = tile * kM;
  if (v0 >= n_vec) return;  // uniform across the block
  const std::uint32_t cache_len = a.cache_lengths[b];
  const std::uint32_t v_last = min(v0 + kM, n_vec) - 1;
  const std::uint32_t block_min_lim = cache_len + v0 / a.group + 1;
  const std::uint32_t block_end = cache_len + v_last / a.group + 1;

  T* q_s = reinterpret_cast<T*>(smem_raw);
  T* k_s = q_s + S::kQElems;  // [2][kN][kStride]
  T* v_s = k_s + 2 * S::kKVElems;
  const unsigned k_base = smem_addr(k_s), v_base = smem_addr(v_s);
  constexpr unsigned kBufBytes = S::kKVElems * 2;

  // First K/V tile in flight while Q is converted.
  issue_tile<T, kD>(p, b, kvh, 0, block_end, k_base, v_base);
  cp_async_commit();

  // Q: vector v0 + m -> q_s[m][:], rounded to T (0 for vectors past n_vec).
  for (int idx = static_cast<int>(threadIdx.x); idx < kM * kD / 4; idx += kThreads) {
    const int m = idx / (kD / 4), d = (idx % (kD / 4)) * 4;
    const std::uint32_t v = v0 + m;
    float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (v < n_vec) {
      const std::uint32_t i = v / a.group, h = v % a.group;
      const std::size_t row = (std::size_t{row_begin} + i) * a.n_q + kvh * a.group + h;
      const float* src = a.q + row * kD + d;  // scalar loads: q need not be 16-byte aligned
      f = make_float4(src[0], src[1], src[2], src[3]);
    }
    uint2 packed;
    packed.x = pack2<T>(f.x, f.y);
    packed.y = pack2<T>(f.z, f.w);
    *reinterpret_cast<uint2*>(q_s + m * S::kStride + d) = packed;
  }
  __syncthreads();

  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  // A fragments of this warp's 16 vectors: ldmatrix.x4, lanes 0-15 rows
  // 0-15 at column k0, lanes 16-31 the same rows at k0 + 8.
  unsigned qf[S::kKSteps][4];
  {
    const unsigned base = smem_addr(q_s + (warp * 16 + lane % 16) * S::kStride + (lane / 16) * 8);
#pragma unroll
    for (int ks = 0; ks < S::kKSteps; ++ks) ldmatrix_x4(qf[ks], base + ks * 32);
  }

  // The two vectors (rows of the m16 tile) this thread holds accumulators
  // of: r0 = lane / 4 and r0 + 8; their causal limits.
  std::uint32_t lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::uint32_t v = v0 + warp * 16 + lane / 4 + h * 8;
    lim[h] = v < n_vec ? cache_len + v / a.group + 1 : 0;
  }
  float o[S::kDTiles][4];
#pragma unroll
  for (int n = 0; n < S::kDTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {kNegInf, kNegInf};
  float l_run[2] = {0.0f, 0.0f};  // this thread's partial sums (quad-reduced at the end)

  // ldmatrix addresses (byte offsets within a buffer):
  // K (non-trans): matrix mi = lane / 8: tokens (mi / 2) * 8 + lane % 8, dims
  // (mi % 2) * 8 -> b0 / b1 of n-tile 2j and 2j + 1.
  const unsigned k_off =
      static_cast<unsigned>((((lane / 16) * 8 + lane % 8) * S::kStride + ((lane / 8) % 2) * 8) * 2);
  // V (trans): tokens ((lane / 8) % 2) * 8 + lane % 8, dims (lane / 16) * 8.
  const unsigned v_off =
      static_cast<unsigned>(((((lane / 8) % 2) * 8 + lane % 8) * S::kStride + (lane / 16) * 8) * 2);

  const int n_tiles = static_cast<int>((block_end + kN - 1) / kN);
  for (int t = 0; t < n_tiles; ++t) {
    const int buf = t & 1;
    if (t + 1 < n_tiles) {
      issue_tile<T, kD>(p, b, kvh, static_cast<std::uint32_t>(t + 1) * kN, block_end,
                        k_base + (buf ^ 1) * kBufBytes, v_base + (buf ^ 1) * kBufBytes);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const unsigned kb = k_base + buf * kBufBytes + k_off;
    const unsigned vb = v_base + buf * kBufBytes + v_off;
    const std::uint32_t tok0 = static_cast<std::uint32_t>(t) * kN;

    // S = Q K^T: kN / 8 n-tiles of 8 tokens.
    float s[kN / 8][4];
#pragma unroll
    for (int n = 0; n < kN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
#pragma unroll
      for (int ks = 0; ks < S::kKSteps; ++ks) {
        unsigned kf[4];
        ldmatrix_x4(kf, kb + (np * 16 * S::kStride + ks * 16) * 2);
        mma<T>(s[2 * np], qf[ks], kf[0], kf[1]);
        mma<T>(s[2 * np + 1], qf[ks], kf[2], kf[3]);
      }
    }

    // Scale to base-2 units, mask, online softmax per row.
    const bool masked = tok0 + kN > block_min_lim;  // uniform
    float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
    for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        float val = s[n][e] * p.s_scale;
        if (masked) {
          const std::uint32_t tok = tok0 + n * 8 + (lane % 4) * 2 + e % 2;
          val = tok < lim[h] ? val : kNegInf;
        }
        s[n][e] = val;
        mx[h] = fmaxf(mx[h], val);
      }
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      // A row with nothing visible yet keeps an empty state (p = 0).
      const float base = mx[h] == kNegInf ? 0.0f : mx[h];
      alpha[h] = exp2f(m_run[h] - base);  // exp2f(-inf) == 0
      m_run[h] = mx[h];
      l_run[h] *= alpha[h];
#pragma unroll
      for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[n][e] = exp2f(s[n][e] - base);
          l_run[h] += s[n][e];
        }
      }
    }
#pragma unroll
    for (int n = 0; n < S::kDTiles; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }

    // O += P V: k16 steps over the tile's tokens; P's A fragment is the S
    // accumulators of n-tiles 2j (a0, a1) and 2j + 1 (a2, a3).
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      unsigned pf[4];
      pf[0] = pack2<T>(s[2 * j][0], s[2 * j][1]);
      pf[1] = pack2<T>(s[2 * j][2], s[2 * j][3]);
      pf[2] = pack2<T>(s[2 * j + 1][0], s[2 * j + 1][1]);
      pf[3] = pack2<T>(s[2 * j + 1][2], s[2 * j + 1][3]);
#pragma unroll
      for (int dp = 0; dp < S::kDTiles / 2; ++dp) {
        unsigned vf[4];
        ldmatrix_x4_trans(vf, vb + (j * 16 * S::kStride + dp * 16) * 2);
        mma<T>(o[2 * dp], pf, vf[0], vf[1]);
        mma<T>(o[2 * dp + 1], pf, vf[2], vf[3]);
      }
    }
    __syncthreads();  // everyone is done with this buffer before it is refilled
  }
  cp_async_wait<0>();

  // Normalise and write: out[row][kvh * group + head][d].
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const std::uint32_t v = v0 + warp * 16 + lane / 4 + h * 8;
    if (v >= n_vec) continue;
    const float inv = 1.0f / l;
    const std::uint32_t i = v / a.group, hd = v % a.group;
    float* dst =
        a.out + ((std::size_t{row_begin} + i) * a.n_q + kvh * a.group + hd) * kD + (lane % 4) * 2;
#pragma unroll
    for (int n = 0; n < S::kDTiles; ++n) {
      dst[n * 8] = o[n][2 * h] * inv;
      dst[n * 8 + 1] = o[n][2 * h + 1] * inv;
    }
  }
}

template <class T, int kD>
void launch_dim(const PrefillParams& p, std::uint64_t items, CallContext& c) {
  constexpr std::size_t smem = Shape<kD>::kSmem;
  const auto kernel = prefill_kernel<T, kD>;
  // Sets the shared-memory attribute (once per workspace); the occupancy is
  // not needed (no split plan).
  (void)blocks_per_sm(c, reinterpret_cast<const void*>(kernel), kThreads, smem, smem);
  kernel<<<static_cast<unsigned>(items), kThreads, smem, c.stream>>>(p);
  check_cuda(cudaGetLastError(), "prefill attention kernel launch");
}

template <class T>
void launch_typed(const PrefillParams& p, std::uint64_t items, CallContext& c) {
  switch (p.a.dim) {
    case 64:
      return launch_dim<T, 64>(p, items, c);
    case 80:
      return launch_dim<T, 80>(p, items, c);
    case 96:
      return launch_dim<T, 96>(p, items, c);
    default:
      return launch_dim<T, 128>(p, items, c);
  }
}

}  // namespace

bool prefill_eligible(DType dtype, const CacheDesc& k, const CacheDesc& v) {
  const std::uint32_t d = k.head_dim;
  return (dtype == DType::f16 || dtype == DType::bf16) && k.max_seq_length > kDecodeMaxRows &&
         (d == 64 || d == 80 || d == 96 || d == 128) && k.block_stride % 8 == 0 &&
         aligned16(k.blocks) && aligned16(v.blocks);
}

void launch_prefill(DType dtype, const AttnParams& a, const CacheDesc& k, CallContext& c) {
  PrefillParams p{};
  p.a = a;
  p.a.n_splits = 1;
  p.tiles = ceil_div(std::uint64_t{k.max_seq_length} * a.group, kM);
  p.s_scale = a.scale * kLog2e;
  const std::uint64_t items = std::uint64_t{k.batch_size} * a.n_kv * p.tiles;
  if (items > 0x7fffffffu) {
    throw InvalidArgument("attention needs " + std::to_string(items) +
                          " thread blocks, limit 2^31-1");
  }
  if (dtype == DType::bf16) {
    launch_typed<BFloat16>(p, items, c);
  } else {
    launch_typed<Half>(p, items, c);
  }
}

}  // namespace kvcache::cuda::detail
