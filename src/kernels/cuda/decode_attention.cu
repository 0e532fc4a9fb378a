// kvcache::cuda::attention for decode steps: at most kDecodeMaxRows new
// tokens per entry (attention.cu's decode_eligible decides; the generic
// kernel serves everything else).
//
// Grid: blockIdx.x = (entry, KV head, query-head tile), blockIdx.y = split of
// the context. A block (kWarps warps) computes up to kM query vectors: every
// new row of its entry x a tile of the group's query heads, so each K/V byte
// is read once per block for all of them (GQA).
// K/V rows are never converted into a shared tile: kLanes lanes own one
// token row (16 bytes = one vector per lane per chunk), so a warp covers
// 32 / kLanes tokens per step. Each warp streams its own tokens through a
// private ring of kStages shared-memory stages filled by cp.async (16-byte,
// L1-bypassing, zero-filled past the end of the range); a lane reads back only
// the bytes it copied itself, so no barrier is needed in the loop and
// kStages - 1 stages (kStageLaneBytes per lane each) are in flight per warp.
// Per token: each lane's partial q.k over its dims (q in registers, fp32,
// pre-scaled by scale * log2(e)), a butterfly over the row's lanes, an online
// softmax per row of lanes (base 2) over the stage's tokens, then p.v into
// per-lane fp32 accumulators for the lane's dims. At the end the rows of a
// warp are combined by shuffles, the warps through shared memory (log-sum-exp
// weights); the block writes normalised outputs, or its split's normalised
// partial and natural-log LSE for attention.cu's merge kernel.
// 8-bit caches: a 16-byte chunk is 16 codes, unpacked to fp32 in registers
// (at most 4 query vectors per block keep q and acc there). fp8's static
// scales are folded in once: K's into q, V's into the written output. int8's
// per-token scales ride in the ring: every lane copies its token's K and V
// scale (4-byte cp.async) into a small float ring beside the values, then
// scales its row's score and the token's probability for p.v.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "async_copy.cuh"
#include "attention_internal.h"
#include "cuda_check.h"
#include "element.cuh"
#include "kvcache/cuda/kernels.h"
#include "kvcache/dtype.h"

namespace kvcache::cuda::detail {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kDefaultStages = 3;     // cp.async ring depth per warp
constexpr int kStageLaneBytes = 128;  // K + V bytes per lane per stage
constexpr int kMaxVectors = 8;        // query vectors per block
constexpr std::uint32_t kSplitWaves = 1;
constexpr std::uint32_t kMinSplitTokens = 256;
constexpr std::uint32_t kSplitRound = 32;
constexpr float kNegInf = -INFINITY;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct DecodeParams {
  AttnParams a;
  std::uint32_t rows;    // new rows per entry served (the view's max_seq_length)
  std::uint32_t chunks;  // 16-byte vectors per K/V row
  float q_scale;         // scale * log2(e): scores in base-2 exponent units
};

// Compile-time shape of one instantiation.
template <class T>
inline constexpr bool kFp8 = is_fp8(dtype_of_v<T>);
template <class T>
inline constexpr bool kInt8 = has_page_scales(dtype_of_v<T>);

template <class T, int kLanes_, int kChunks_, int kM_, int kStages_ = kDefaultStages>
struct Shape {
  using Elem = T;
  static constexpr int kStages = kStages_;  // cp.async ring depth per warp
  static constexpr int kLanes = kLanes_;    // lanes per token row
  static constexpr int kChunks = kChunks_;  // 16-byte vectors per lane per row
  static constexpr int kM = kM_;            // query vectors per block
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  static constexpr int kDims = kChunks * kVec;  // dims per lane per vector
  static constexpr int kGroups = 32 / kLanes;   // token rows per warp step
  static constexpr int kSteps = kStageLaneBytes / (32 * kChunks);
  static constexpr int kWarpTokens = kGroups * kSteps;  // tokens per warp stage
  static constexpr int kSlots = kSteps * kChunks * 2;   // uint4 per lane per stage
  // int8: each lane's copy of its token's K and V scale per step, after
  // the uint4 ring: [kWarps][kStages][kSteps][2][32] floats.
  static constexpr int kScaleSlots = kInt8<T> ? kSteps * 2 : 0;
  static constexpr int kValueRingBytes = kWarps * kStages_ * kSlots * 32 * 16;
  static constexpr int kRingBytes = kValueRingBytes + kWarps * kStages_ * kScaleSlots * 32 * 4;
  static_assert(kSteps >= 1 && kLanes * kGroups == 32);
};

// ---- small device helpers ----

// The 16 bytes of a row chunk as fp32 (exact for every element type).
template <class T>
__device__ __forceinline__ void unpack(const uint4& r, float* f);
template <>
__device__ __forceinline__ void unpack<float>(const uint4& r, float* f) {
  f[0] = __uint_as_float(r.x);
  f[1] = __uint_as_float(r.y);
  f[2] = __uint_as_float(r.z);
  f[3] = __uint_as_float(r.w);
}
template <>
__device__ __forceinline__ void unpack<BFloat16>(const uint4& r, float* f) {
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
template <>
__device__ __forceinline__ void unpack<Half>(const uint4& r, float* f) {
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

// 8-bit codes: 16 per chunk, each exactly as element.cuh's to_f32.
template <class T>
__device__ __forceinline__ float code_to_f32(std::uint32_t byte) {
  if constexpr (std::is_same_v<T, Fp8E4M3>) {
    return e4m3_to_f32(byte);
  } else if constexpr (std::is_same_v<T, Fp8E5M2>) {
    return e5m2_to_f32(byte);
  } else {
    return i8_to_f32(byte);
  }
}
template <class T>
__device__ __forceinline__ void unpack_codes(const uint4& r, float* f) {
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 16; ++i) f[i] = code_to_f32<T>((w[i / 4] >> (8 * (i % 4))) & 0xffu);
}
template <>
__device__ __forceinline__ void unpack<Fp8E4M3>(const uint4& r, float* f) {
  unpack_codes<Fp8E4M3>(r, f);
}
template <>
__device__ __forceinline__ void unpack<Fp8E5M2>(const uint4& r, float* f) {
  unpack_codes<Fp8E5M2>(r, f);
}
template <>
__device__ __forceinline__ void unpack<Int8>(const uint4& r, float* f) {
  unpack_codes<Int8>(r, f);
}

// Sum over the kLanes lanes of one token row (every lane gets the same bits).
template <int kLanes>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// ---- per-thread state ----

// Where this thread sits: warp, token row within the warp step (g), lane
// within the row (r).
struct Lane {
  int warp, lane, g, r;
};

// The block's work item.
struct Item {
  std::uint32_t b, kvh, head_tile, row_begin, n_rows, cache_len;
  std::uint32_t begin, end;  // this split's token range [begin, end) for the block
  std::uint32_t split_end;   // exclusive end of the split (UINT32_MAX for the last)
};

template <class S>
struct State {
  float q[S::kM][S::kDims];
  float acc[S::kM][S::kDims];
  float m[S::kM];            // running max (base-2 units)
  float l[S::kM];            // running sum of exp2(score - m)
  std::uint32_t lim[S::kM];  // exclusive end position each vector may see
};

// Vector m of the block: new row i and group-local query head h.
struct Vector {
  std::uint32_t i, h;
  bool valid;
};

__device__ __forceinline__ Vector vector_of(const DecodeParams& p, const Item& it, int m) {
  Vector v;
  v.i = static_cast<std::uint32_t>(m) / p.a.heads_per_block;
  v.h = it.head_tile * p.a.heads_per_block + static_cast<std::uint32_t>(m) % p.a.heads_per_block;
  v.valid = v.i < it.n_rows && v.h < p.a.group;
  return v;
}

__device__ __forceinline__ Item item_of(const DecodeParams& p) {
  const AttnParams& a = p.a;
  Item it;
  it.head_tile = blockIdx.x % a.head_tiles;
  it.kvh = (blockIdx.x / a.head_tiles) % a.n_kv;
  it.b = blockIdx.x / a.head_tiles / a.n_kv;
  it.row_begin = a.row_offsets[it.b];
  it.n_rows = min(a.row_offsets[it.b + 1] - it.row_begin, p.rows);
  it.cache_len = a.cache_lengths[it.b];
  it.begin = blockIdx.y * a.split_tokens;
  // The last split reaches to the end of every context: results never depend
  // on the view's max_full_context_length being exact.
  it.split_end = blockIdx.y + 1 == gridDim.y ? UINT32_MAX : it.begin + a.split_tokens;
  it.end = min(it.cache_len + it.n_rows, it.split_end);
  return it;
}

template <class S>
__device__ void init_state(const DecodeParams& p, const Item& it, const Lane& ln, State<S>& st) {
  const AttnParams& a = p.a;
  // fp8: the head's static K scale folded into q (score = (q . code) * scale).
  const float q_scale = kFp8<typename S::Elem> ? p.q_scale * a.k_head_scales[it.kvh] : p.q_scale;
#pragma unroll
  for (int m = 0; m < S::kM; ++m) {
    const Vector v = vector_of(p, it, m);
    st.lim[m] = v.valid ? min(it.cache_len + v.i + 1, it.split_end) : 0;
    st.m[m] = kNegInf;
    st.l[m] = 0.0f;
    const std::size_t row = (std::size_t{it.row_begin} + v.i) * a.n_q + it.kvh * a.group + v.h;
    const float* q = a.q + row * a.dim;
#pragma unroll
    for (int j = 0; j < S::kChunks; ++j) {
      const std::uint32_t c = ln.r + j * S::kLanes;
#pragma unroll
      for (int e = 0; e < S::kVec; ++e) {
        const bool use = v.valid && c < p.chunks;
        st.q[m][j * S::kVec + e] = use ? q[c * S::kVec + e] * q_scale : 0.0f;
        st.acc[m][j * S::kVec + e] = 0.0f;
      }
    }
  }
}

// First token of warp stage `stage` (row g = 0, step 0).
template <class S>
__device__ __forceinline__ std::uint32_t stage_token(const Item& it, const Lane& ln, int stage) {
  return it.begin + (static_cast<std::uint32_t>(stage) * kWarps + ln.warp) * S::kWarpTokens;
}

// Slot of (step u, chunk j, K or V) of one lane in a warp's stage.
template <class S>
__device__ __forceinline__ int slot(int u, int j, int kv) {
  return ((u * S::kChunks + j) * 2 + kv) * 32;
}

// Issues the cp.async copies of one warp stage into `ring_stage` (this
// lane's chunks of its tokens; past it.end: zero-filled, nothing read).
template <class T, class S>
__device__ void issue_stage(const DecodeParams& p, const Item& it, const Lane& ln,
                            uint4* ring_stage, float* scale_stage, std::uint32_t tok0) {
  const T* kb = static_cast<const T*>(p.a.k_blocks);
  const T* vb = static_cast<const T*>(p.a.v_blocks);
#pragma unroll
  for (int u = 0; u < S::kSteps; ++u) {
    const std::uint32_t tok = tok0 + u * S::kGroups + ln.g;
    const bool in = tok < it.end;
    const TokenPlace place = in ? token_place(p.a, it.b, tok) : TokenPlace{0, 0};
    const std::size_t off = in ? row_offset(p.a, place, it.kvh) : 0;
    if constexpr (kInt8<T>) {  // every lane copies its token's scales for itself
      const std::size_t so = in ? scale_offset(p.a, place, it.kvh) : 0;
      const auto* kbytes = static_cast<const unsigned char*>(p.a.k_blocks);
      const auto* vbytes = static_cast<const unsigned char*>(p.a.v_blocks);
      cp_async4(scale_stage + (u * 2) * 32 + ln.lane, kbytes + so, in);
      cp_async4(scale_stage + (u * 2 + 1) * 32 + ln.lane, vbytes + so, in);
    }
#pragma unroll
    for (int j = 0; j < S::kChunks; ++j) {
      const std::uint32_t c = ln.r + j * S::kLanes;
      if (c >= p.chunks) continue;
      const std::size_t e = off + std::size_t{c} * S::kVec;
      cp_async16(ring_stage + slot<S>(u, j, 0) + ln.lane, kb + e, in);
      cp_async16(ring_stage + slot<S>(u, j, 1) + ln.lane, vb + e, in);
    }
  }
}

// Scores (base 2) of the stage's tokens of this lane's row, -inf where the
// vector may not see the token.
template <class T, class S>
__device__ void stage_scores(const DecodeParams& p, const Lane& ln, const uint4* ring_stage,
                             const float* scale_stage, std::uint32_t tok0, const State<S>& st,
                             float (&s)[S::kSteps][S::kM]) {
#pragma unroll
  for (int u = 0; u < S::kSteps; ++u) {
    float part[S::kM];
#pragma unroll
    for (int m = 0; m < S::kM; ++m) part[m] = 0.0f;
#pragma unroll
    for (int j = 0; j < S::kChunks; ++j) {
      if (ln.r + j * S::kLanes >= p.chunks) continue;
      float k[S::kVec];
      unpack<T>(ring_stage[slot<S>(u, j, 0) + ln.lane], k);
#pragma unroll
      for (int m = 0; m < S::kM; ++m) {
#pragma unroll
        for (int e = 0; e < S::kVec; ++e) part[m] = fmaf(st.q[m][j * S::kVec + e], k[e], part[m]);
      }
    }
    const std::uint32_t tok = tok0 + u * S::kGroups + ln.g;
    const float k_scale = kInt8<T> ? scale_stage[(u * 2) * 32 + ln.lane] : 1.0f;
#pragma unroll
    for (int m = 0; m < S::kM; ++m) {
      const float score =
          kInt8<T> ? row_sum<S::kLanes>(part[m]) * k_scale : row_sum<S::kLanes>(part[m]);
      s[u][m] = tok < st.lim[m] ? score : kNegInf;
    }
  }
}

// Online-softmax step of this lane's row over the stage: s becomes the
// probabilities (relative to the new running max), acc is rescaled.
template <class S>
__device__ void stage_softmax(State<S>& st, float (&s)[S::kSteps][S::kM]) {
#pragma unroll
  for (int m = 0; m < S::kM; ++m) {
    float mx = st.m[m];
#pragma unroll
    for (int u = 0; u < S::kSteps; ++u) mx = fmaxf(mx, s[u][m]);
    if (mx == kNegInf) {  // nothing visible yet: the state stays empty
#pragma unroll
      for (int u = 0; u < S::kSteps; ++u) s[u][m] = 0.0f;
      continue;
    }
    const float alpha = exp2f(st.m[m] - mx);  // 0 when the state was empty
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < S::kSteps; ++u) {
      s[u][m] = exp2f(s[u][m] - mx);  // exp2f(-inf) == 0
      sum += s[u][m];
    }
    st.l[m] = fmaf(st.l[m], alpha, sum);
    st.m[m] = mx;
#pragma unroll
    for (int d = 0; d < S::kDims; ++d) st.acc[m][d] *= alpha;
  }
}

// acc += p . v over the stage's tokens of this lane's row.
template <class T, class S>
__device__ void stage_values(const DecodeParams& p, const Lane& ln, const uint4* ring_stage,
                             const float* scale_stage, const float (&s)[S::kSteps][S::kM],
                             State<S>& st) {
#pragma unroll
  for (int u = 0; u < S::kSteps; ++u) {
    const float v_scale = kInt8<T> ? scale_stage[(u * 2 + 1) * 32 + ln.lane] : 1.0f;
#pragma unroll
    for (int j = 0; j < S::kChunks; ++j) {
      if (ln.r + j * S::kLanes >= p.chunks) continue;
      float v[S::kVec];
      unpack<T>(ring_stage[slot<S>(u, j, 1) + ln.lane], v);
#pragma unroll
      for (int m = 0; m < S::kM; ++m) {
#pragma unroll
        for (int e = 0; e < S::kVec; ++e) {
          const float w = kInt8<T> ? s[u][m] * v_scale : s[u][m];
          st.acc[m][j * S::kVec + e] = fmaf(w, v[e], st.acc[m][j * S::kVec + e]);
        }
      }
    }
  }
}

// Streams the block's token range through the warp's ring.
template <class T, class S>
__device__ void stream_tokens(const DecodeParams& p, const Item& it, const Lane& ln, uint4* ring,
                              State<S>& st) {
  constexpr int kStages = S::kStages;
  uint4* wring = ring + ln.warp * kStages * S::kSlots * 32;
  float* sring =
      reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(ring) + S::kValueRingBytes) +
      ln.warp * kStages * S::kScaleSlots * 32;
  const std::uint32_t range = it.end > it.begin ? it.end - it.begin : 0;
  constexpr std::uint32_t kBlockTokens = kWarps * S::kWarpTokens;
  const int n_stages = static_cast<int>((range + kBlockTokens - 1) / kBlockTokens);
#pragma unroll
  for (int st0 = 0; st0 < kStages - 1; ++st0) {
    if (st0 < n_stages) {
      issue_stage<T, S>(p, it, ln, wring + st0 * S::kSlots * 32, sring + st0 * S::kScaleSlots * 32,
                        stage_token<S>(it, ln, st0));
    }
    cp_async_commit();
  }
  for (int stage = 0; stage < n_stages; ++stage) {
    const int next = stage + kStages - 1;
    if (next < n_stages) {
      issue_stage<T, S>(p, it, ln, wring + (next % kStages) * S::kSlots * 32,
                        sring + (next % kStages) * S::kScaleSlots * 32,
                        stage_token<S>(it, ln, next));
    }
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    const std::uint32_t tok0 = stage_token<S>(it, ln, stage);
    if (tok0 >= it.end) continue;  // warp-uniform: this warp's stage is past the range
    const uint4* cur = wring + (stage % kStages) * S::kSlots * 32;
    const float* cur_scales = sring + (stage % kStages) * S::kScaleSlots * 32;
    float s[S::kSteps][S::kM];
    stage_scores<T, S>(p, ln, cur, cur_scales, tok0, st, s);
    stage_softmax<S>(st, s);
    stage_values<T, S>(p, ln, cur, cur_scales, s, st);
  }
  cp_async_wait<0>();
}

// Merges the token rows of a warp (lanes kLanes, 2 kLanes, ... apart hold
// the same dims) into the lanes of row 0.
template <class S>
__device__ void combine_rows(State<S>& st) {
#pragma unroll
  for (int o = S::kLanes; o < 32; o *= 2) {
#pragma unroll
    for (int m = 0; m < S::kM; ++m) {
      const float mo = __shfl_xor_sync(0xffffffffu, st.m[m], o);
      const float lo = __shfl_xor_sync(0xffffffffu, st.l[m], o);
      const float mx = fmaxf(st.m[m], mo);
      const float a = mx == kNegInf ? 0.0f : exp2f(st.m[m] - mx);
      const float ao = mx == kNegInf ? 0.0f : exp2f(mo - mx);
      st.l[m] = st.l[m] * a + lo * ao;
      st.m[m] = mx;
#pragma unroll
      for (int d = 0; d < S::kDims; ++d) {
        const float other = __shfl_xor_sync(0xffffffffu, st.acc[m][d], o);
        st.acc[m][d] = st.acc[m][d] * a + other * ao;
      }
    }
  }
}

// Each warp's row 0 writes (acc, m, l) to shared memory:
// o_s [kWarps][kM][dim], ml_s [kWarps][kM][2].
template <class S>
__device__ void publish_warp(const DecodeParams& p, const Lane& ln, const State<S>& st, float* o_s,
                             float* ml_s) {
  if (ln.g != 0) return;
  const std::uint32_t dim = p.a.dim;
#pragma unroll
  for (int m = 0; m < S::kM; ++m) {
    float* o = o_s + (ln.warp * S::kM + m) * dim;
#pragma unroll
    for (int j = 0; j < S::kChunks; ++j) {
      const std::uint32_t c = ln.r + j * S::kLanes;
      if (c >= p.chunks) continue;
#pragma unroll
      for (int e = 0; e < S::kVec; ++e) o[c * S::kVec + e] = st.acc[m][j * S::kVec + e];
    }
    if (ln.r == 0) {
      ml_s[(ln.warp * S::kM + m) * 2] = st.m[m];
      ml_s[(ln.warp * S::kM + m) * 2 + 1] = st.l[m];
    }
  }
}

// Combines the warps' partials and writes the block's outputs (or its
// split's partial and LSE).
template <class S>
__device__ void write_block(const DecodeParams& p, const Item& it, const float* o_s,
                            const float* ml_s) {
  const AttnParams& a = p.a;
  const std::uint32_t dim = a.dim;
  // fp8: the head's static V scale (out = sum p code / sum p * scale).
  const float v_scale = kFp8<typename S::Elem> ? a.v_head_scales[it.kvh] : 1.0f;
  for (std::uint32_t idx = threadIdx.x; idx < S::kM * dim; idx += kThreads) {
    const int m = static_cast<int>(idx / dim);
    const std::uint32_t d = idx % dim;
    const Vector v = vector_of(p, it, m);
    if (!v.valid) continue;
    float mx = kNegInf;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, ml_s[(w * S::kM + m) * 2]);
    float l = 0.0f, o = 0.0f;
    if (mx != kNegInf) {
      for (int w = 0; w < kWarps; ++w) {
        const float wt = exp2f(ml_s[(w * S::kM + m) * 2] - mx);
        l = fmaf(ml_s[(w * S::kM + m) * 2 + 1], wt, l);
        o = fmaf(o_s[(w * S::kM + m) * dim + d], wt, o);
      }
    }
    const std::size_t rh = (std::size_t{it.row_begin} + v.i) * a.n_q + it.kvh * a.group + v.h;
    if (a.n_splits == 1) {
      a.out[rh * dim + d] = kFp8<typename S::Elem> ? o / l * v_scale : o / l;
      continue;
    }
    const std::size_t part = std::size_t{blockIdx.y} * a.total_rows * a.n_q + rh;
    a.part_o[part * dim + d] = l > 0.0f ? (kFp8<typename S::Elem> ? o / l * v_scale : o / l) : 0.0f;
    if (d == 0) a.part_lse[part] = l > 0.0f ? (mx + log2f(l)) * kLn2 : kNegInf;
  }
}

template <class T, class S>
__global__ void __launch_bounds__(kThreads) decode_kernel(const DecodeParams p) {
  extern __shared__ uint4 ring[];
  const Item it = item_of(p);
  if (it.n_rows == 0) return;  // uniform across the block
  Lane ln;
  ln.lane = static_cast<int>(threadIdx.x % 32);
  ln.warp = static_cast<int>(threadIdx.x / 32);
  ln.g = ln.lane / S::kLanes;
  ln.r = ln.lane % S::kLanes;
  State<S> st;
  init_state<S>(p, it, ln, st);
  stream_tokens<T, S>(p, it, ln, ring, st);
  combine_rows<S>(st);
  __syncthreads();  // every warp is done with its ring: reuse it
  float* o_s = reinterpret_cast<float*>(ring);
  float* ml_s = o_s + kWarps * S::kM * p.a.dim;
  publish_warp<S>(p, ln, st, o_s, ml_s);
  __syncthreads();
  write_block<S>(p, it, o_s, ml_s);
}

// ---- host side ----

// Splits: as many as fit the grid into kSplitWaves waves of resident blocks
// without exceeding it (floor(waves x resident / items)), each split at
// least kMinSplitTokens long, at most kMaxSplits. One wave: every block is
// resident from the start, there is no tail wave, and the splits are as long
// as the device allows (fewer partials to write and merge). A grid that
// already fills a wave is not split. Measured (H200, bf16): batch 1 x 32k
// n_q 8 the old 4-wave plan (128 x 256 tokens) 120.7 us vs 1 wave 98.5 us,
// n_q 32 144.5 vs 113.2 us.
void plan_splits(AttnParams& a, std::uint64_t items, std::uint32_t max_context,
                 std::uint64_t resident_blocks, const DecodeTuning& t) {
  const std::uint64_t waves = t.split_waves != 0 ? t.split_waves : kSplitWaves;
  const std::uint32_t min_tokens = t.min_split_tokens != 0 ? t.min_split_tokens : kMinSplitTokens;
  const std::uint64_t target = waves * resident_blocks;
  std::uint64_t splits = std::max<std::uint64_t>(1, target / std::max<std::uint64_t>(items, 1));
  splits = std::min<std::uint64_t>(splits, std::max(1u, max_context / min_tokens));
  splits = std::min<std::uint64_t>(splits, kMaxSplits);
  if (splits <= 1 || max_context == 0) {
    a.n_splits = 1;
    a.split_tokens = UINT32_MAX;
    return;
  }
  a.split_tokens = ceil_div(ceil_div(max_context, splits), kSplitRound) * kSplitRound;
  a.n_splits = ceil_div(max_context, a.split_tokens);
}

template <class T, class S>
void launch_shape(DecodeParams p, std::uint64_t items, std::uint32_t max_context, CallContext& c,
                  const DecodeTuning& t) {
  constexpr std::size_t ring = S::kRingBytes;
  constexpr std::size_t combine =
      (std::size_t{kWarps} * S::kM * kMaxHeadDim + std::size_t{kWarps} * S::kM * 2) * sizeof(float);
  // The combine buffer reuses the ring (a shallow ring of a big block may
  // be the smaller of the two).
  constexpr std::size_t smem = std::max(ring, combine);
  const auto kernel = decode_kernel<T, S>;
  const int per_sm = blocks_per_sm(c, reinterpret_cast<const void*>(kernel), kThreads, smem, smem);
  plan_splits(p.a, items, max_context, std::uint64_t(std::max(per_sm, 1)) * c.lim.sms, t);
  const StreamScratch scratch = make_partials(p.a, c);
  const dim3 grid(static_cast<unsigned>(items), p.a.n_splits);
  kernel<<<grid, kThreads, smem, c.stream>>>(p);
  check_cuda(cudaGetLastError(), "decode attention kernel launch");
  launch_merge(p.a, c.stream);
}

// Ring depth: t.stages (2 or 4) for f16 / bf16 rows of 16 vectors per
// lane-row set (16 lanes x 1 or 8 lanes x 2), else the default (3).
template <class T, int kLanes, int kChunks, int kM>
void launch_stages(const DecodeParams& p, std::uint64_t items, std::uint32_t max_context,
                   CallContext& c, const DecodeTuning& t) {
  if constexpr (sizeof(T) == 2 && kLanes * kChunks == 16) {
    if (t.stages == 2) {
      return launch_shape<T, Shape<T, kLanes, kChunks, kM, 2>>(p, items, max_context, c, t);
    }
    if (t.stages == 4) {
      return launch_shape<T, Shape<T, kLanes, kChunks, kM, 4>>(p, items, max_context, c, t);
    }
  }
  launch_shape<T, Shape<T, kLanes, kChunks, kM>>(p, items, max_context, c, t);
}

// kMaxM: the largest block instantiated (8 lanes x 2 vectors keeps 32 fp32
// per vector in registers: 4 vectors at most).
template <class T, int kLanes, int kChunks, int kMaxM = 8>
void launch_vectors(std::uint32_t vectors, const DecodeParams& p, std::uint64_t items,
                    std::uint32_t max_context, CallContext& c, const DecodeTuning& t) {
  if (vectors <= 1) return launch_stages<T, kLanes, kChunks, 1>(p, items, max_context, c, t);
  if (vectors <= 2) return launch_stages<T, kLanes, kChunks, 2>(p, items, max_context, c, t);
  if (kMaxM <= 4 || vectors <= 4)
    return launch_stages<T, kLanes, kChunks, 4>(p, items, max_context, c, t);
  if constexpr (kMaxM >= 8) launch_stages<T, kLanes, kChunks, 8>(p, items, max_context, c, t);
}

// Lanes per token row and chunks per lane from the row's 16-byte chunks.
template <class T>
void launch_typed(std::uint32_t vectors, const DecodeParams& p, std::uint64_t items,
                  std::uint32_t max_context, CallContext& c, const DecodeTuning& t) {
  if constexpr (sizeof(T) == 1) {  // 16 dims per chunk: at most 4 vectors (launch_decode)
    if (p.chunks <= 8) return launch_vectors<T, 8, 1, 4>(vectors, p, items, max_context, c, t);
    return launch_vectors<T, 16, 1, 4>(vectors, p, items, max_context, c, t);
  } else {
    if (p.chunks <= 8) return launch_vectors<T, 8, 1>(vectors, p, items, max_context, c, t);
    if (p.chunks <= 16) {
      if constexpr (sizeof(T) == 2) {
        if (t.lanes == 8 && vectors <= 4) {
          return launch_vectors<T, 8, 2, 4>(vectors, p, items, max_context, c, t);
        }
      }
      return launch_vectors<T, 16, 1>(vectors, p, items, max_context, c, t);
    }
    if constexpr (sizeof(T) == 4) {
      if (p.chunks > 32) return launch_vectors<T, 32, 2>(vectors, p, items, max_context, c, t);
    }
    launch_vectors<T, 32, 1>(vectors, p, items, max_context, c, t);
  }
}

}  // namespace

bool decode_eligible(DType dtype, const CacheDesc& k, const CacheDesc& v) {
  const std::uint32_t vec = 16 / static_cast<std::uint32_t>(dtype_size(dtype));
  return k.max_seq_length >= 1 && k.max_seq_length <= kDecodeMaxRows && k.head_dim % vec == 0 &&
         k.head_dim <= kMaxHeadDim && k.block_stride % vec == 0 && aligned16(k.blocks) &&
         aligned16(v.blocks);
}

void launch_decode(DType dtype, AttnParams a, const CacheDesc& k, CallContext& c,
                   const DecodeTuning& t) {
  const std::uint32_t max_new = k.max_seq_length;
  const std::uint32_t max_context = k.max_full_context_length;
  DecodeParams p{};
  p.rows = max_new;
  p.chunks = a.dim * static_cast<std::uint32_t>(dtype_size(dtype)) / 16;
  p.q_scale = a.scale * kLog2e;
  a.rows_per_block = max_new;
  a.row_tiles = 1;
  // 8-bit rows give a lane 16 dims per chunk: 4 vectors keep q and acc in registers.
  std::uint32_t max_vectors = dtype_size(dtype) == 1 ? 4 : kMaxVectors;
  if (t.max_vectors != 0) max_vectors = std::min<std::uint32_t>(t.max_vectors, max_vectors);
  a.heads_per_block = std::min(a.group, std::max(1u, max_vectors / max_new));
  a.head_tiles = ceil_div(a.group, a.heads_per_block);
  p.a = a;
  const std::uint64_t items = std::uint64_t{a.n_kv} * a.head_tiles * k.batch_size;
  if (items > 0x7fffffffu) {
    throw InvalidArgument("attention needs " + std::to_string(items) +
                          " thread blocks per split, limit 2^31-1");
  }
  const std::uint32_t vectors = max_new * a.heads_per_block;
  visit_dtype(dtype,
              [&](auto tag) { launch_typed<decltype(tag)>(vectors, p, items, max_context, c, t); });
}

}  // namespace kvcache::cuda::detail
