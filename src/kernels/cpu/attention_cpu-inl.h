// Per-target body of the CPU attention kernel: everything but the entry points,
// which live one element type per translation unit (attention_f32.cpp,
// attention_f16.cpp, attention_bf16.cpp) so that a parallel build compiles
// the three instantiations at once. Included once per Highway target.
//
//
// Per work item: query vectors are pre-scaled into scratch; KV tokens are
// walked in tiles of at most kTile tokens (rows addressed through the page
// table one by one, so tiles span pages). Within a tile every KV head of the
// item is processed together, token-major: the tile's K rows are scored a
// few tokens at a time across all heads (blocks of kQ queries x kT tokens of
// one head, kQ * kT = kN lanes, or with one query per head kN (token, head)
// pairs, each row read whole), so the reads walk each page in address order.
// On HND pages the tile goes head by head instead (each head's rows are
// adjacent there; with one or two query vectors per head V over the whole
// tile per accumulator load);
// each K load feeds 2 * kQ FMAs and one transpose-add tree turns the kN
// partial-product vectors into one vector of kN scores. The online softmax
// runs on whole score vectors per (head, query), then V rows are accumulated
// a few tokens at a time across the heads (up to 8 query vectors per V
// load; with one query per head, two heads' accumulators in registers).
// bf16 rows are read as u32 and split into even/odd f32 vectors (shift /
// mask, no shuffles); query and accumulator rows use that element order and
// are put back in order on output. While one tile runs, rows ahead are
// prefetched (AttentionPrefetch: the next block into L1, or the next whole
// tile into L2 at the rate the loops read, chosen per processor). Split
// items write (max, sum, acc) partials merged afterwards. Prefill items (one
// KV head, a block of query rows) take the query-lanes path of
// attention_prefill-inl.h instead where the target has the lanes for it.
#if defined(KVCACHE_KERNELS_CPU_ATTENTION_CPU_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ATTENTION_CPU_INL_H_
#undef KVCACHE_KERNELS_CPU_ATTENTION_CPU_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ATTENTION_CPU_INL_H_
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "kernels/cpu/attention_prefill-inl.h"
#include "kernels/cpu/exp_scores-inl.h"
#include "kernels/cpu/kernel_common.h"
#include "kernels/cpu/round_bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr std::uint32_t kTile = 32;  // max KV tokens per tile (multiple of any lane count)
// Tokens per PV step of the token-major (NHD) loops: each head's (or head
// pair's) accumulators are loaded once per this many tokens of V rows, read
// token by token across the heads. Against 4, with the L2 pump from L2 (1
// thread): NHD MHA 1.09x, GQA 4 1.13x. In DRAM (2 threads) the A/B read
// 1.00-1.085x, inside the +-5 % that builds with identical DRAM loops differ
// by on this VM (docs/PERFORMANCE.md, session 18).
// With next_step_l1 the steps are kPvTokensStepL1 tokens, the next step's V
// rows prefetched into L1, and the last step prefetches as many tokens of
// the next tile's K rows. Each step's prefetches go out at once, and a
// burst larger than the core's misses in flight stalls it: on Zen 3 (DRAM,
// 2 threads, NHD, 8 heads) 2 tokens (64 lines) read 1.26x of 4 tokens for
// MHA and 1.06x for GQA 4, with the next tile's first 2 tokens instead of 8
// another 1.12x for GQA 4 (docs/PERFORMANCE.md, session 25).
constexpr std::uint32_t kPvTokens = 16;
constexpr std::uint32_t kPvTokensStepL1 = 2;
// With next_step_l1 and several query vectors per head (GQA on NHD pages,
// token-major), the arithmetic per row is several times MHA's, and 2-token
// steps cost it the accumulators' loads and stores every 2 tokens (from L3,
// 1 thread, GQA 4: 6.3-6.8 GB/s against 9.2-12.1 for 16-token steps without
// prefetches). These items take kPvTokensStepL1Gqa-token steps instead, and
// each head's prefetches go out just before that head's part of the step,
// kPrefetchTokensGqa tokens ahead, so that no burst is larger than one
// head's rows of one step (docs/PERFORMANCE.md, session 26).
constexpr std::uint32_t kPvTokensStepL1Gqa = 4;
constexpr std::uint32_t kPrefetchTokensGqa = 8;
// On NHD pages, query vectors per head from which the tile loops go head by
// head (a head's rows 256 bytes apart in a page, but its queries and
// accumulators stay in L1). DRAM, 2 threads, against token-major: GQA 8
// 1.09x, GQA 4 0.93-1.05x, MHA 0.93x (docs/PERFORMANCE.md, session 11).
constexpr std::uint32_t kNhdHeadMajorVectors = 8;
// The online softmax's share of a tile's time, before it has been measured,
// and the most it is taken to be (see ItemRunner::time_softmax).
constexpr float kSoftmaxShareGuess = 0.1f;
constexpr float kSoftmaxShareMax = 0.25f;
// One pumping tile in this many is timed for the softmax's share.
constexpr std::uint32_t kTimedTileEvery = 8;
// Tiles whose row pointers are kept: the current one and those ahead.
constexpr std::uint32_t kRing = kPrefetchTilesAhead + 2;

HWY_INLINE VF LoadF(DF df, const float* p) { return hn::LoadU(df, p); }
HWY_INLINE VF LoadF(DF df, const hwy::bfloat16_t* p) {
  const hn::Rebind<hwy::bfloat16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, p));
}
HWY_INLINE VF LoadF(DF df, const hwy::float16_t* p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, p));
}

HWY_INLINE float ToF(float x) { return x; }
HWY_INLINE float ToF(hwy::bfloat16_t x) { return hwy::F32FromBF16(x); }
HWY_INLINE float ToF(hwy::float16_t x) {
  Half h;
  std::memcpy(&h, &x, sizeof(h));
  return to_float(h);
}

HWY_INLINE float ReduceSum(DF df, VF v) { return hn::GetLane(hn::SumOfLanes(df, v)); }

// Lanes per f32 vector, known at compile time for every x86 target.
constexpr std::size_t kN = HWY_LANES(float);
// Elements per chunk: a K or V row is consumed 2 * kN elements at a time as
// two f32 vectors (lo, hi).
constexpr std::size_t kC = 2 * kN;
static_assert(kTile % kN == 0, "a tile must hold whole score vectors");

// 64-byte cache lines a chunk of kC elements of T spans (at least 1): what the
// prefetch pump is told each time the loops consume one chunk of a row.
// Lines the loops read between reports to the pump, at least.
constexpr std::uint32_t kPumpLines = 16;

template <class T>
constexpr std::uint32_t kChunkLines = kC * sizeof(T) / 64 > 0 ? kC * sizeof(T) / 64 : 1;

// bf16 chunks are split into even elements (lo) and odd elements (hi): one
// 32-bit load, a shift and a mask, no lane shuffles. Query and accumulator
// rows use the same element order ("layout"); outputs are put back in order.
template <class T>
constexpr bool kSplitLayout = std::is_same_v<T, hwy::bfloat16_t>;

// Position of element e of a row in the layout of T.
template <class T>
HWY_INLINE std::size_t LayoutPos(std::size_t e) {
  if constexpr (kSplitLayout<T>) {
    const std::size_t r = e % kC;
    return e - r + (r % 2) * kN + r / 2;
  } else {
    return e;
  }
}

// dst[0, dim rounded up to kC) = src[0, dim) * scale in the layout of T,
// zero padded. Whole chunks are plain loops over the even / odd elements
// (vectorized by the compiler: with the LayoutPos index table this scatter
// was a third of a short decode call, docs/PERFORMANCE.md session 6).
template <class T>
HWY_INLINE void ToLayout(const float* src, std::size_t dim, float scale, float* dst) {
  const std::size_t full = dim / kC * kC;
  if constexpr (kSplitLayout<T>) {
    for (std::size_t c = 0; c < full; c += kC) {
      for (std::size_t i = 0; i < kN; ++i) {
        dst[c + i] = src[c + 2 * i] * scale;
        dst[c + kN + i] = src[c + 2 * i + 1] * scale;
      }
    }
  } else {
    for (std::size_t d = 0; d < full; ++d) dst[d] = src[d] * scale;
  }
  if (full < dim) {
    std::fill(dst + full, dst + full + kC, 0.0f);
    for (std::size_t d = full; d < dim; ++d) dst[full + LayoutPos<T>(d - full)] = src[d] * scale;
  }
}

// dst[0, dim) = acc (layout of T) * scale, back in element order.
template <class T>
HWY_INLINE void FromLayout(const float* acc, std::size_t dim, float scale, float* dst) {
  const std::size_t full = dim / kC * kC;
  if constexpr (kSplitLayout<T>) {
    for (std::size_t c = 0; c < full; c += kC) {
      for (std::size_t i = 0; i < kN; ++i) {
        dst[c + 2 * i] = acc[c + i] * scale;
        dst[c + 2 * i + 1] = acc[c + kN + i] * scale;
      }
    }
  } else {
    for (std::size_t d = 0; d < full; ++d) dst[d] = acc[d] * scale;
  }
  for (std::size_t d = full; d < dim; ++d) dst[d] = acc[full + LayoutPos<T>(d - full)] * scale;
}

// GCC 12 stored a loaded bf16 chunk to the stack and read it back twice (as
// the memory operands of the shift and the mask) in every unrolled PV and
// score loop; an empty asm that takes the vector in a register keeps it
// there (MHA decode from L2 +11 %, docs/PERFORMANCE.md session 7).
template <class V>
HWY_INLINE void KeepInRegister(V& v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3 && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG)
  asm("" : "+v"(v.raw));
#else
  (void)v;
#endif
}

HWY_INLINE void LoadChunk(DF df, const float* p, VF& lo, VF& hi) {
  lo = hn::LoadU(df, p);
  hi = hn::LoadU(df, p + kN);
}
HWY_INLINE void LoadChunk(DF df, const hwy::float16_t* p, VF& lo, VF& hi) {
  lo = LoadF(df, p);
  hi = LoadF(df, p + kN);
}
// On AVX-512 the bf16 chunk is loaded by an asm statement: with
// KeepInRegister GCC still stored every loaded chunk to the stack (a dead
// store per chunk). From L2, 1 thread: MHA 1.02-1.03x, GQA 4 1.035-1.04x;
// DRAM 0.99-1.01x, noise there (docs/PERFORMANCE.md, session 18).
// Sanitizer builds keep the intrinsic load, which they can check.
HWY_INLINE void LoadChunk(DF df, const hwy::bfloat16_t* p, VF& lo, VF& hi) {
  const hn::RebindToUnsigned<DF> du;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG) && \
    !HWY_IS_ASAN && !HWY_IS_MSAN
  hn::Vec<decltype(du)> w;
  asm("vmovdqu64 %1, %0" : "=v"(w.raw) : "m"(*reinterpret_cast<const __m512i*>(p)));
#else
  auto w = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(p));
  KeepInRegister(w);
#endif
  lo = hn::BitCast(df, hn::ShiftLeft<16>(w));
  hi = hn::BitCast(df, hn::And(w, hn::Set(du, 0xFFFF0000u)));
}

// Whether partial chunks use masked loads: AVX-512, where lanes masked off
// are neither read nor able to fault, for every lane size.
constexpr bool kMaskedTail = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3;

// The first t < kC elements of a chunk at p, the rest zero, with masked loads
// (only instantiated where kMaskedTail).
template <class D, class T>
HWY_INLINE void LoadChunkPart(D df, const T* p, std::size_t t, VF& lo, VF& hi) {
  const std::size_t t_hi = t > kN ? t - kN : 0;
  if constexpr (std::is_same_v<T, float>) {
    lo = hn::MaskedLoad(hn::FirstN(df, t), df, p);
    hi = hn::MaskedLoad(hn::FirstN(df, t_hi), df, p + kN);
  } else if constexpr (std::is_same_v<T, hwy::float16_t>) {
    const hn::Rebind<hwy::float16_t, D> dh;
    lo = hn::PromoteTo(df, hn::MaskedLoad(hn::FirstN(dh, t), dh, p));
    hi = hn::PromoteTo(df, hn::MaskedLoad(hn::FirstN(dh, t_hi), dh, p + kN));
  } else {
    // bf16 in 16-bit lanes, so that an odd t reads nothing past the row.
    const hn::RebindToUnsigned<D> du;
    const hn::Repartition<std::uint16_t, D> d16;
    const auto w = hn::BitCast(
        du, hn::MaskedLoad(hn::FirstN(d16, t), d16, reinterpret_cast<const std::uint16_t*>(p)));
    lo = hn::BitCast(df, hn::ShiftLeft<16>(w));
    hi = hn::BitCast(df, hn::And(w, hn::Set(du, 0xFFFF0000u)));
  }
}

// Chunk at element d of a row of dim elements; past the row end (head dims
// that are not a multiple of kC) the missing elements read as zero. With
// masked loads where they cannot fault; elsewhere through a zeroed copy
// (which stalls on store forwarding: AVX-512 head dim 80 decode from L2
// computed at 0.4 of head dim 96's rate that way).
template <bool kTail, class T>
HWY_INLINE void LoadChunkAt(DF df, const T* row, std::size_t d, std::size_t dim, VF& lo, VF& hi) {
  if constexpr (kTail && kMaskedTail) {
    LoadChunkPart(df, row + d, dim - d, lo, hi);
  } else if constexpr (kTail) {
    HWY_ALIGN T tmp[kC];
    std::memset(static_cast<void*>(tmp), 0, sizeof(tmp));
    std::memcpy(static_cast<void*>(tmp), row + d, (dim - d) * sizeof(T));
    LoadChunk(df, tmp, lo, hi);
  } else {
    (void)dim;
    LoadChunk(df, row + d, lo, hi);
  }
}

// Reduces kN per-(query, token) partial-product vectors a[u] to one vector
// whose lane u is the horizontal sum of a[u] (a transpose-add tree: about
// 3 * kN shuffles and adds instead of kN horizontal sums).
HWY_INLINE VF ReduceTokens(DF df, VF* a) {
#if HWY_TARGET == HWY_SCALAR
  (void)df;
  return a[0];
#else
  if constexpr (kN % 4 == 0 && kN <= 16) {
    const hn::Repartition<std::uint64_t, DF> du;
    // Within each 128-bit block: lane j of c[g] = block sum of a[4g + j].
    VF c[kN / 4];
    for (std::size_t g = 0; g < kN / 4; ++g) {
      const VF* x = a + 4 * g;
      const VF s01 =
          hn::Add(hn::InterleaveLower(df, x[0], x[1]), hn::InterleaveUpper(df, x[0], x[1]));
      const VF s23 =
          hn::Add(hn::InterleaveLower(df, x[2], x[3]), hn::InterleaveUpper(df, x[2], x[3]));
      const auto w01 = hn::BitCast(du, s01);
      const auto w23 = hn::BitCast(du, s23);
      c[g] = hn::Add(hn::BitCast(df, hn::InterleaveLower(du, w01, w23)),
                     hn::BitCast(df, hn::InterleaveUpper(du, w01, w23)));
    }
    if constexpr (kN == 4) {
      return c[0];
    } else if constexpr (kN == 8) {
      return hn::Add(hn::ConcatLowerLower(df, c[1], c[0]), hn::ConcatUpperUpper(df, c[1], c[0]));
    } else {
      // kN == 16 (AVX-512): halve, then pick blocks across the two halves.
      const VF f01 =
          hn::Add(hn::ConcatLowerLower(df, c[1], c[0]), hn::ConcatUpperUpper(df, c[1], c[0]));
      const VF f23 =
          hn::Add(hn::ConcatLowerLower(df, c[3], c[2]), hn::ConcatUpperUpper(df, c[3], c[2]));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      const __m512 x = _mm512_shuffle_f32x4(f01.raw, f23.raw, _MM_SHUFFLE(2, 0, 2, 0));
      const __m512 y = _mm512_shuffle_f32x4(f01.raw, f23.raw, _MM_SHUFFLE(3, 1, 3, 1));
      return VF{_mm512_add_ps(x, y)};
#else
      HWY_ALIGN float buf[2][kN];
      hn::Store(f01, df, buf[0]);
      hn::Store(f23, df, buf[1]);
      HWY_ALIGN float r[kN];
      for (std::size_t blk = 0; blk < 4; ++blk)
        for (std::size_t j = 0; j < 4; ++j)
          r[4 * blk + j] = buf[blk / 2][8 * (blk % 2) + j] + buf[blk / 2][8 * (blk % 2) + 4 + j];
      return hn::Load(df, r);
#endif
    }
  } else {
    HWY_ALIGN float r[kN];
    for (std::size_t u = 0; u < kN; ++u) r[u] = ReduceSum(df, a[u]);
    return hn::Load(df, r);
  }
#endif
}

// Where the query vectors of key row u start: the same for every row (the
// rows are tokens of one KV head), or one pointer per row (rows of several
// heads). Query j of row u is at that pointer + j * dimp.
struct SharedQuery {
  const float* q;
  HWY_INLINE const float* operator()(int) const { return q; }
};
struct QueryPerRow {
  const float* const* q;
  HWY_INLINE const float* operator()(int u) const { return q[u]; }
};

// Scores of kQ query vectors (layout order, stride dimp, zero padded) against
// kT key rows, kQ * kT == kN: lane j * kT + u = q_j . k_u. Each K chunk load
// feeds 2 * kQ FMAs; one transpose-add tree per kN scores.
template <int kQ, int kT, bool kTail, class T, class Query, class Pump>
HWY_INLINE void ScoreChunks(DF df, const Query& q, std::size_t dimp, const T* const* kr,
                            std::size_t d0, std::size_t d1, std::size_t dim, VF* a,
                            const Pump& pump) {
  // Report the lines read about kPumpLines at a time (the pump's per-call
  // cost is ~20 instructions).
  constexpr std::uint32_t kLines = kT * kChunkLines<T>;
  constexpr std::uint32_t kEvery = kLines >= kPumpLines ? 1 : kPumpLines / kLines;
  std::uint32_t n = 0;
  for (std::size_t d = d0; d < d1; d += kC) {
    if (++n == kEvery) {
      pump(kEvery * kLines);
      n = 0;
    }
#pragma GCC unroll 16
    for (int u = 0; u < kT; ++u) {
      VF lo, hi;
      LoadChunkAt<kTail>(df, kr[u], d, dim, lo, hi);
#pragma GCC unroll 16
      for (int j = 0; j < kQ; ++j) {
        a[j * kT + u] = hn::MulAdd(hn::Load(df, q(u) + j * dimp + d), lo, a[j * kT + u]);
        a[j * kT + u] = hn::MulAdd(hn::Load(df, q(u) + j * dimp + d + kN), hi, a[j * kT + u]);
      }
    }
  }
  if (n != 0) pump(n * kLines);
}

// As ScoreChunks for one query vector per row (kQ == 1), but each row read
// whole before the next: the (token, head) rows of a block are adjacent in an
// NHD page, so the loads walk it in address order. Against chunk-major order
// (chunk c of all kT rows, then c + 1): MHA from L2 +10-17 %, DRAM on one
// thread 0.49-0.64 -> 0.60-0.65 of stream, two threads unchanged
// (docs/PERFORMANCE.md session 7; session 6's row-major attempt, which also
// unrolled the row, lost on one thread).
template <int kT, bool kTail, class T, class Query, class Pump>
HWY_INLINE void ScoreRows(DF df, const Query& q, const T* const* kr, std::size_t d0, std::size_t d1,
                          std::size_t dim, VF* a, const Pump& pump) {
  const std::uint32_t row_lines = static_cast<std::uint32_t>((d1 - d0) / kC) * kChunkLines<T>;
#pragma GCC unroll 16
  for (int u = 0; u < kT; ++u) {
    VF b = hn::Zero(df);
    const float* qu = q(u);
    for (std::size_t d = d0; d < d1; d += kC) {
      VF lo, hi;
      LoadChunkAt<kTail>(df, kr[u], d, dim, lo, hi);
      a[u] = hn::MulAdd(hn::Load(df, qu + d), lo, a[u]);
      b = hn::MulAdd(hn::Load(df, qu + d + kN), hi, b);
    }
    a[u] = hn::Add(a[u], b);
    pump(row_lines);  // every row: DRAM 1.11x of every 4 rows for HND MHA (session 10)
  }
}

// ScoreRows for one query shared by every row and rows of exactly 2-4
// whole chunks (head dims 64, 96, 128 on AVX-512): the query held in
// registers, each row's chunks unrolled, so a chunk costs its load, the bf16
// split and two FMAs (the loop had 8 instructions a chunk, 3 loads). MHA
// from L2, 1 thread: HND 1.15x, NHD (head-major when cached) 1.13x; from L3,
// 2 threads: 1.055-1.07x; DRAM HND MHA (same binary, switched by an
// environment hook): 0.975x by gbps, 0.814 against 0.812 of stream, inside
// this VM's noise (docs/PERFORMANCE.md, session 19). AVX2 (head dims 32-64
// there): dim 64 1.21x from L2; SSE4 and others keep ScoreRows.
constexpr bool kQueryInRegisters = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2;
template <int kT, int kChunks, class T, class Pump>
HWY_INLINE void ScoreRowsFixed(DF df, const float* q, const T* const* kr, VF* a, const Pump& pump) {
  constexpr std::uint32_t kRowLines = kChunks * kChunkLines<T>;
  VF qlo[kChunks], qhi[kChunks];
#pragma GCC unroll 8
  for (int c = 0; c < kChunks; ++c) {
    qlo[c] = hn::Load(df, q + c * kC);
    qhi[c] = hn::Load(df, q + c * kC + kN);
  }
#pragma GCC unroll 16
  for (int u = 0; u < kT; ++u) {
    VF s0 = hn::Zero(df), s1 = hn::Zero(df);
#pragma GCC unroll 8
    for (int c = 0; c < kChunks; ++c) {
      VF lo, hi;
      LoadChunk(df, kr[u] + c * kC, lo, hi);
      s0 = hn::MulAdd(qlo[c], lo, s0);
      s1 = hn::MulAdd(qhi[c], hi, s1);
    }
    a[u] = hn::Add(s0, s1);
    pump(kRowLines);
  }
}

template <int kQ, int kT, class T, class Query, class Pump>
HWY_INLINE VF ScoreBlock(DF df, const Query& q, std::size_t dimp, const T* const* kr,
                         std::size_t dim, const Pump& pump) {
  static_assert(kQ * kT == static_cast<int>(kN), "one score vector per block");
  VF a[kN];
#pragma GCC unroll 16
  for (std::size_t u = 0; u < kN; ++u) a[u] = hn::Zero(df);
  const std::size_t full = dim / kC * kC;
  if constexpr (kQ == 1 && kQueryInRegisters && std::is_same_v<Query, SharedQuery>) {
    // Each case reduces on its own: the same code as an if-chain with one
    // ReduceTokens after it compiled slower under GCC 12 (HND MHA from L2,
    // 1 thread, 0.87-0.89x; session 20; not examined further).
    if (full == dim) {
      switch (dim / kC) {
        case 2:
          ScoreRowsFixed<kT, 2>(df, q.q, kr, a, pump);
          return ReduceTokens(df, a);
        case 3:
          ScoreRowsFixed<kT, 3>(df, q.q, kr, a, pump);
          return ReduceTokens(df, a);
        case 4:
          ScoreRowsFixed<kT, 4>(df, q.q, kr, a, pump);
          return ReduceTokens(df, a);
        default:
          break;
      }
    }
  }
  if constexpr (kQ == 1) {
    ScoreRows<kT, false>(df, q, kr, 0, full, dim, a, pump);
    if (full < dim) ScoreRows<kT, true>(df, q, kr, full, full + kC, dim, a, pump);
  } else {
    ScoreChunks<kQ, kT, false>(df, q, dimp, kr, 0, full, dim, a, pump);
    if (full < dim) ScoreChunks<kQ, kT, true>(df, q, dimp, kr, full, full + kC, dim, a, pump);
  }
  return ReduceTokens(df, a);
}

// acc_r += sum_t p_r[t] * v_t for kR query vectors over chunks [d0, d1),
// kCh chunks per register block, so each V chunk load feeds 2 * kR FMAs.
template <int kR, int kCh, bool kTail, std::uint32_t kEvery, class T, class Pump>
HWY_INLINE void PvChunks(DF df, const float* const* p, float* const* acc, const T* const* vr,
                         std::uint32_t nt, std::size_t d0, std::size_t d1, std::size_t dim,
                         const Pump& pump) {
  // The pump hears of the rows read every kEvery rows, however many query
  // vectors share them (told once per block of tokens, 32-token groups had
  // read 0.93 of 4-token ones for GQA 4 in DRAM; docs/PERFORMANCE.md,
  // sessions 9 and 10; kEvery: see kPvRowsPerReportMany).
  constexpr std::uint32_t kLines = kCh * kChunkLines<T>;
  for (std::size_t d = d0; d + kCh * kC <= d1; d += kCh * kC) {
    VF a[kR][2 * kCh];
#pragma GCC unroll 16
    for (int r = 0; r < kR; ++r)
#pragma GCC unroll 16
      for (int i = 0; i < 2 * kCh; ++i) a[r][i] = hn::Load(df, acc[r] + d + i * kN);
    std::uint32_t n = 0;
    for (std::uint32_t t = 0; t < nt; ++t) {
      if (++n == kEvery) {
        pump(kEvery * kLines);
        n = 0;
      }
      // Each chunk is consumed as it is loaded: with the row's 2 * kCh
      // vectors loaded first, an AVX2 block of 4 chunks needs 18 registers
      // of 16, and a change elsewhere in this file made GCC spill an
      // accumulator (a store-to-load chain per token; MHA from L2 0.84x).
      VF pr[kR];
#pragma GCC unroll 16
      for (int r = 0; r < kR; ++r) pr[r] = hn::Set(df, p[r][t]);
#pragma GCC unroll 16
      for (int c = 0; c < kCh; ++c) {
        VF lo, hi;
        LoadChunkAt<kTail>(df, vr[t], d + c * kC, dim, lo, hi);
#pragma GCC unroll 16
        for (int r = 0; r < kR; ++r) {
          a[r][2 * c] = hn::MulAdd(pr[r], lo, a[r][2 * c]);
          a[r][2 * c + 1] = hn::MulAdd(pr[r], hi, a[r][2 * c + 1]);
        }
      }
    }
    if (n != 0) pump(n * kLines);
#pragma GCC unroll 16
    for (int r = 0; r < kR; ++r)
#pragma GCC unroll 16
      for (int i = 0; i < 2 * kCh; ++i) hn::Store(a[r][i], df, acc[r] + d + i * kN);
  }
}

// One query vector per head, kH heads at a time (each its own V rows, heads
// side by side in a token's row): acc_h += sum_t p_h[t] * v_h,t over the
// whole chunks of the row, kCh chunks per register block. vr[h][t] is head
// h's row of token t.
template <int kH, int kCh, class T, class Pump>
HWY_INLINE std::size_t PvHeads(DF df, const float* const* p, float* const* acc,
                               const T* const* const* vr, std::uint32_t nt, std::size_t d0,
                               std::size_t full, const Pump& pump) {
  std::size_t d = d0;
  for (; d + kCh * kC <= full; d += kCh * kC) {
    VF a[kH][2 * kCh];
#pragma GCC unroll 16
    for (int h = 0; h < kH; ++h)
#pragma GCC unroll 16
      for (int i = 0; i < 2 * kCh; ++i) a[h][i] = hn::Load(df, acc[h] + d + i * kN);
    for (std::uint32_t t = 0; t < nt; ++t) {
      pump(kH * kCh * kChunkLines<T>);
#pragma GCC unroll 16
      for (int h = 0; h < kH; ++h) {
        const VF ph = hn::Set(df, p[h][t]);
#pragma GCC unroll 16
        for (int c = 0; c < kCh; ++c) {
          VF lo, hi;
          LoadChunk(df, vr[h][t] + d + c * kC, lo, hi);
          a[h][2 * c] = hn::MulAdd(ph, lo, a[h][2 * c]);
          a[h][2 * c + 1] = hn::MulAdd(ph, hi, a[h][2 * c + 1]);
        }
      }
    }
#pragma GCC unroll 16
    for (int h = 0; h < kH; ++h)
#pragma GCC unroll 16
      for (int i = 0; i < 2 * kCh; ++i) hn::Store(a[h][i], df, acc[h] + d + i * kN);
  }
  return d;
}

// f32 accumulator registers a PV register block may use (32 vector registers
// on AVX-512, 16 elsewhere).
constexpr int kAccRegs = kN >= 16 ? 16 : 8;

// PV over the whole chunks [d0, d1 rounded down to kCh chunks); returns the end.
template <int kR, int kCh, std::uint32_t kEvery, class T, class Pump>
HWY_INLINE std::size_t PvBlocks(DF df, const float* const* p, float* const* acc, const T* const* vr,
                                std::uint32_t nt, std::size_t d0, std::size_t d1, std::size_t dim,
                                const Pump& pump) {
  const std::size_t end = d0 + (d1 - d0) / (kCh * kC) * (kCh * kC);
  PvChunks<kR, kCh, false, kEvery>(df, p, acc, vr, nt, d0, end, dim, pump);
  return end;
}

// V rows read between the PV loop's reports to the pump where an HND head
// has at least kPvManyQueries query vectors (its first block of 4 reports;
// every row elsewhere). Against every row, HND GQA 8: from L2 1.06-1.08x,
// DRAM 1.04-1.06x; the same read 0.95-0.97x for NHD GQA 8 and 0.96-0.98x
// for GQA 4 in DRAM (though 1.03-1.05x from L2), and every 4 rows cost MHA
// 0.94-0.96x in DRAM (docs/PERFORMANCE.md, session 14).
constexpr std::uint32_t kPvManyQueries = 8;
constexpr std::uint32_t kPvRowsPerReportMany = 4;

// Register blocks as wide as the accumulator budget allows, then narrower
// ones for what is left (enough independent FMA chains even for one query);
// the pump is told every kEvery rows.
template <int kR, std::uint32_t kEvery, class T, class Pump>
HWY_INLINE void PvRows(DF df, const float* const* p, float* const* acc, const T* const* vr,
                       std::uint32_t nt, std::size_t dim, const Pump& pump) {
  constexpr int kChMax = kAccRegs / (2 * kR) > 0 ? kAccRegs / (2 * kR) : 1;
  const std::size_t full = dim / kC * kC;
  std::size_t d = PvBlocks<kR, kChMax, kEvery>(df, p, acc, vr, nt, 0, full, dim, pump);
  if constexpr (kChMax > 4) d = PvBlocks<kR, 4, kEvery>(df, p, acc, vr, nt, d, full, dim, pump);
  if constexpr (kChMax > 2) d = PvBlocks<kR, 2, kEvery>(df, p, acc, vr, nt, d, full, dim, pump);
  if constexpr (kChMax > 1) d = PvBlocks<kR, 1, kEvery>(df, p, acc, vr, nt, d, full, dim, pump);
  if (full < dim) PvChunks<kR, 1, true, kEvery>(df, p, acc, vr, nt, full, full + kC, dim, pump);
}

// ---- AttentionPrecision::bf16 with AVX512-BF16 ------------------------------
// vdpbf16ps: lane i of acc += a.bf16[2i] * b.bf16[2i] + a.bf16[2i+1] *
// b.bf16[2i+1], 32 products an instruction against an f32 FMA's 16, exact
// products summed in fp32 (bf16 denormals, below 2^-126, count as zero).
// Scores: the rounded query packed as bf16 pairs in element order
// (Scratch::qb) against K rows as stored, one instruction per chunk. PV:
// probabilities packed as bf16 pairs of consecutive tokens (Scratch::pairs)
// against two tokens' V chunks merged into (even element, odd element) pairs,
// so that the accumulators keep the even/odd layout of the f32 path. Used
// where the processor has the instruction, dim is whole chunks, and the item
// has 2 or more query vectors per KV head and is not pumped (ItemRunner::dot_);
// elsewhere the f32 loops run on the rounded values.

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG)
static_assert(kTile == 2 * kN, "PackPairs packs one tile of probabilities");
using DU = hn::RebindToUnsigned<DF>;
using VU = hn::Vec<DU>;

// DotBF16 (vdpbf16ps) is in round_bf16-inl.h.

HWY_INLINE VU LoadPairs(const hwy::bfloat16_t* p) {
  return hn::LoadU(DU(), reinterpret_cast<const std::uint32_t*>(p));
}

// ScoreRowsFixed's form: one query shared by the rows, its kChunks chunks in
// registers, each row read whole (two chains).
template <int kT, int kChunks, class Pump>
HWY_INLINE void ScoreRowsDotFixed(const std::uint32_t* q, const hwy::bfloat16_t* const* kr, VF* a,
                                  const Pump& pump) {
  const DU du;
  constexpr std::uint32_t kRowLines = kChunks * kChunkLines<hwy::bfloat16_t>;
  VU qc[kChunks];
#pragma GCC unroll 8
  for (int c = 0; c < kChunks; ++c) qc[c] = hn::Load(du, q + c * kN);
#pragma GCC unroll 16
  for (int u = 0; u < kT; ++u) {
    VF s1 = hn::Zero(DF());
#pragma GCC unroll 8
    for (int c = 0; c < kChunks; ++c) {
      if (c % 2 == 0) {
        a[u] = DotBF16(a[u], qc[c], LoadPairs(kr[u] + c * kC));
      } else {
        s1 = DotBF16(s1, qc[c], LoadPairs(kr[u] + c * kC));
      }
    }
    a[u] = hn::Add(a[u], s1);
    pump(kRowLines);
  }
}

// One query vector shared by the rows, rows of any number of chunks, each
// read whole.
template <int kT, class Pump>
HWY_INLINE void ScoreRowsDot(const std::uint32_t* q, const hwy::bfloat16_t* const* kr,
                             std::size_t chunks, VF* a, const Pump& pump) {
  const DU du;
  const auto row_lines = static_cast<std::uint32_t>(chunks) * kChunkLines<hwy::bfloat16_t>;
#pragma GCC unroll 16
  for (int u = 0; u < kT; ++u) {
    VF s1 = hn::Zero(DF());
    std::size_t c = 0;
    for (; c + 2 <= chunks; c += 2) {
      a[u] = DotBF16(a[u], hn::Load(du, q + c * kN), LoadPairs(kr[u] + c * kC));
      s1 = DotBF16(s1, hn::Load(du, q + (c + 1) * kN), LoadPairs(kr[u] + (c + 1) * kC));
    }
    if (c < chunks) a[u] = DotBF16(a[u], hn::Load(du, q + c * kN), LoadPairs(kr[u] + c * kC));
    a[u] = hn::Add(a[u], s1);
    pump(row_lines);
  }
}

// ScoreBlock by bf16 pair products: kQ query vectors of one KV head (packed
// pairs from q, qstride u32 apart) against kT rows of dim = whole chunks;
// lane j * kT + u = q_j . k_u.
template <int kQ, int kT, class Pump>
HWY_INLINE VF ScoreBlockDot(DF df, const std::uint32_t* q, std::size_t qstride,
                            const hwy::bfloat16_t* const* kr, std::size_t dim, const Pump& pump) {
  static_assert(kQ * kT == static_cast<int>(kN), "one score vector per block");
  VF a[kN];
#pragma GCC unroll 16
  for (std::size_t u = 0; u < kN; ++u) a[u] = hn::Zero(df);
  const std::size_t chunks = dim / kC;
  if constexpr (kQ == 1) {
    switch (chunks) {
      case 2:
        ScoreRowsDotFixed<kT, 2>(q, kr, a, pump);
        return ReduceTokens(df, a);
      case 4:
        ScoreRowsDotFixed<kT, 4>(q, kr, a, pump);
        return ReduceTokens(df, a);
      case 8:
        ScoreRowsDotFixed<kT, 8>(q, kr, a, pump);
        return ReduceTokens(df, a);
      default:
        break;
    }
    ScoreRowsDot<kT>(q, kr, chunks, a, pump);
  } else {
    const DU du;
    constexpr std::uint32_t kLines = kT * kChunkLines<hwy::bfloat16_t>;
    constexpr std::uint32_t kEvery = kLines >= kPumpLines ? 1 : kPumpLines / kLines;
    std::uint32_t n = 0;
    for (std::size_t c = 0; c < chunks; ++c) {
      if (++n == kEvery) {
        pump(kEvery * kLines);
        n = 0;
      }
      VU qc[kQ];
#pragma GCC unroll 8
      for (int j = 0; j < kQ; ++j) qc[j] = hn::Load(du, q + j * qstride + c * kN);
#pragma GCC unroll 16
      for (int u = 0; u < kT; ++u) {
        const VU k = LoadPairs(kr[u] + c * kC);
#pragma GCC unroll 8
        for (int j = 0; j < kQ; ++j) a[j * kT + u] = DotBF16(a[j * kT + u], qc[j], k);
      }
    }
    if (n != 0) pump(n * kLines);
  }
  return ReduceTokens(df, a);
}

// PvChunks by bf16 pair products over two tokens at a time: pp[r][i] holds
// the probabilities of tokens 2i and 2i + 1 of query vector r (an odd last
// token pairs with probability 0 and its own row).
template <int kR, int kCh, std::uint32_t kEvery, class Pump>
HWY_INLINE void PvChunksDot(const std::uint32_t* const* pp, float* const* acc,
                            const hwy::bfloat16_t* const* vr, std::uint32_t nt, std::size_t d0,
                            std::size_t d1, const Pump& pump) {
  const DF df;
  const DU du;
  constexpr std::uint32_t kLines = kCh * kChunkLines<hwy::bfloat16_t>;
  for (std::size_t d = d0; d + kCh * kC <= d1; d += kCh * kC) {
    VF a[kR][2 * kCh];
#pragma GCC unroll 16
    for (int r = 0; r < kR; ++r)
#pragma GCC unroll 16
      for (int i = 0; i < 2 * kCh; ++i) a[r][i] = hn::Load(df, acc[r] + d + i * kN);
    std::uint32_t n = 0;
    for (std::uint32_t t = 0; t < nt; t += 2) {
      const hwy::bfloat16_t* v0 = vr[t];
      const hwy::bfloat16_t* v1 = t + 1 < nt ? vr[t + 1] : v0;
      n += t + 1 < nt ? 2 : 1;
      if (n >= kEvery) {
        pump(n * kLines);
        n = 0;
      }
      VU pr[kR];
#pragma GCC unroll 16
      for (int r = 0; r < kR; ++r) pr[r] = hn::Set(du, pp[r][t / 2]);
#pragma GCC unroll 16
      for (int c = 0; c < kCh; ++c) {
        const VU w0 = LoadPairs(v0 + d + c * kC);
        const VU w1 = LoadPairs(v1 + d + c * kC);
        // Words 2i: token t's element; words 2i + 1: token t + 1's.
        const VU even{_mm512_mask_blend_epi16(0xAAAAAAAAu, w0.raw, hn::ShiftLeft<16>(w1).raw)};
        const VU odd{_mm512_mask_blend_epi16(0xAAAAAAAAu, hn::ShiftRight<16>(w0).raw, w1.raw)};
#pragma GCC unroll 16
        for (int r = 0; r < kR; ++r) {
          a[r][2 * c] = DotBF16(a[r][2 * c], pr[r], even);
          a[r][2 * c + 1] = DotBF16(a[r][2 * c + 1], pr[r], odd);
        }
      }
    }
    if (n != 0) pump(n * kLines);
#pragma GCC unroll 16
    for (int r = 0; r < kR; ++r)
#pragma GCC unroll 16
      for (int i = 0; i < 2 * kCh; ++i) hn::Store(a[r][i], df, acc[r] + d + i * kN);
  }
}

// PvChunksDot over [d0, d1 rounded down to kCh chunks); returns the end.
template <int kR, int kCh, std::uint32_t kEvery, class Pump>
HWY_INLINE std::size_t PvBlocksDot(const std::uint32_t* const* pp, float* const* acc,
                                   const hwy::bfloat16_t* const* vr, std::uint32_t nt,
                                   std::size_t d0, std::size_t d1, const Pump& pump) {
  const std::size_t end = d0 + (d1 - d0) / (kCh * kC) * (kCh * kC);
  PvChunksDot<kR, kCh, kEvery>(pp, acc, vr, nt, d0, end, pump);
  return end;
}

// PvRows by bf16 pair products (dim whole chunks).
template <int kR, std::uint32_t kEvery, class Pump>
HWY_INLINE void PvRowsDot(const std::uint32_t* const* pp, float* const* acc,
                          const hwy::bfloat16_t* const* vr, std::uint32_t nt, std::size_t dim,
                          const Pump& pump) {
  constexpr int kChMax = kAccRegs / (2 * kR) > 0 ? kAccRegs / (2 * kR) : 1;
  std::size_t d = PvBlocksDot<kR, kChMax, kEvery>(pp, acc, vr, nt, 0, dim, pump);
  if constexpr (kChMax > 4) d = PvBlocksDot<kR, 4, kEvery>(pp, acc, vr, nt, d, dim, pump);
  if constexpr (kChMax > 2) d = PvBlocksDot<kR, 2, kEvery>(pp, acc, vr, nt, d, dim, pump);
  if constexpr (kChMax > 1) PvBlocksDot<kR, 1, kEvery>(pp, acc, vr, nt, d, dim, pump);
}

// Rounded probabilities of tokens [0, kN) (p0) and [kN, 2 * kN) (p1)
// packed as bf16 pairs of consecutive tokens: pairs[i] = p[2i] | p[2i + 1]
// << 16.
HWY_INLINE void PackPairs(VF p0, VF p1, std::uint32_t* pairs) {
  const hn::Repartition<std::uint16_t, DU> dw;
  const auto lo = hn::BitCast(dw, p0);
  const auto hi = hn::BitCast(dw, p1);
  hn::Store(hn::BitCast(DU(), hn::ConcatOdd(dw, hi, lo)), DU(), pairs);
}

// Rounded query chunks in the even/odd layout (lo: even elements, hi: odd)
// packed as bf16 pairs in element order: q[2i] | q[2i + 1] << 16.
HWY_INLINE void PackQuery(const float* q, std::size_t dimp, std::uint32_t* out) {
  const DU du;
  for (std::size_t c = 0; c < dimp / kC; ++c) {
    const VU lo = hn::BitCast(du, hn::Load(DF(), q + c * kC));
    const VU hi = hn::BitCast(du, hn::Load(DF(), q + c * kC + kN));
    hn::Store(hn::Or(hn::ShiftRight<16>(lo), hi), du, out + c * kN);
  }
}
#else
// Declared only: ItemRunner names them in branches that kHaveDotBF16 discards.
void PackQuery(const float* q, std::size_t dimp, std::uint32_t* out);
void PackPairs(VF p0, VF p1, std::uint32_t* pairs);
template <int kQ, int kT, class Pump>
VF ScoreBlockDot(DF df, const std::uint32_t* q, std::size_t qstride,
                 const hwy::bfloat16_t* const* kr, std::size_t dim, const Pump& pump);
template <int kR, std::uint32_t kEvery, class Pump>
void PvRowsDot(const std::uint32_t* const* pp, float* const* acc, const hwy::bfloat16_t* const* vr,
               std::uint32_t nt, std::size_t dim, const Pump& pump);
#endif

// Per-worker buffers. Query and accumulator rows are dimp long (dim rounded
// up to kC, padding zero) in the layout of the cache's element type.
struct Scratch {
  std::size_t dimp = 0, rows = 0;
  hwy::AlignedFreeUniquePtr<float[]> qs, acc, probs;
  // Per query vector: running max, softmax denominator, and the denominator
  // as kN partial sums while the tiles run (summed into l at the end).
  std::vector<float> mx, l;
  hwy::AlignedFreeUniquePtr<float[]> lv;
  // AttentionPrecision::bf16 by pair products (ItemRunner::dot_): each query
  // vector as dimp / 2 packed bf16 pairs, each probability row as kTile / 2
  // (pairs[i / 2] holds probs[i] and probs[i + 1], i even).
  hwy::AlignedFreeUniquePtr<std::uint32_t[]> qb, pairs;
  void ensure(std::size_t total, std::size_t dim) {
    dimp = (dim + kC - 1) / kC * kC;
    if (rows < total) {
      rows = total;
      qs = Zeroed(total * dimp);
      acc = Zeroed(total * dimp);
      probs = Zeroed(total * kTile);
      lv = Zeroed(total * kN);
      qb = hwy::AllocateAligned<std::uint32_t>(total * dimp / 2);
      pairs = hwy::AllocateAligned<std::uint32_t>(total * kTile / 2);
      mx.resize(total);
      l.resize(total);
    }
  }
  static hwy::AlignedFreeUniquePtr<float[]> Zeroed(std::size_t n) {
    auto p = hwy::AllocateAligned<float>(n);
    std::fill(p.get(), p.get() + n, 0.0f);
    return p;
  }
};

// How far (natural-log units) a tile's scores may rise above a query's
// running maximum before the maximum is raised and its accumulators rescaled.
// Until then the tile's probabilities are exp(s - max) <= e^8 (~3e3), which
// costs fp32 neither range nor relative precision: the sums and accumulators
// are divided by the same l at the end, and a split's (max, l, acc) merge as
// any other. It takes the horizontal max (and with it the scalar exp and the
// branch on its result) off the path from the scores to the PV loop in every
// tile but the first and those that raise the maximum by more than this.
// From L2, 1 thread: GQA 4 1.04-1.05x, MHA 1.005-1.02x (session 19). The
// denominator is kept as kN partial sums (Scratch::lv) until the item ends:
// the horizontal sum per tile had been half the softmax's samples (GQA 4
// 1.025-1.04x, MHA 1.024x).
constexpr float kSoftmaxMaxSlack = 8.0f;

// Online-softmax update of one query vector from its tile scores p[0, nt)
// (nvalid visible) on whole score vectors; turns p into probabilities
// exp(s - mx), mx the running maximum, raised only where a score exceeds it
// by more than kSoftmaxMaxSlack (then to the tile's maximum); lv[0, kN) += the
// probabilities, lane by lane. With kRound (AttentionPrecision::bf16) p
// receives them rounded to bf16 (lv the exact ones), and with pairs (the dot
// path, kHaveDotBF16) they go there packed as bf16 pairs instead of into p.
template <bool kRound = false>
HWY_INLINE void SoftmaxUpdate(DF df, float* p, std::uint32_t nt, std::uint32_t nvalid, float& mx,
                              float* lv, float* acc, std::size_t dimp,
                              std::uint32_t* pairs = nullptr) {
  const std::size_t groups = (nt + kN - 1) / kN;
  if (nvalid == 0) {
    std::fill(p, p + groups * kN, 0.0f);
    if (pairs != nullptr) std::fill(pairs, pairs + kTile / 2, 0u);
    return;
  }
  const VF neg = hn::Set(df, -std::numeric_limits<float>::infinity());
  const VF limit = hn::Set(df, mx + kSoftmaxMaxSlack);
  VF s[kTile / kN];
  auto over = hn::FirstN(df, 0);  // no lane yet
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t first = g * kN;
    const std::size_t visible = nvalid <= first ? 0 : std::min<std::size_t>(kN, nvalid - first);
    s[g] = hn::IfThenElse(hn::FirstN(df, visible), hn::Load(df, p + first), neg);
    over = hn::Or(over, hn::Gt(s[g], limit));
  }
  if (!hn::AllFalse(df, over)) {
    VF vmax = neg;
    for (std::size_t g = 0; g < groups; ++g) vmax = hn::Max(vmax, s[g]);
    const float m_new = hn::GetLane(hn::MaxOfLanes(df, vmax));
    if (mx != -std::numeric_limits<float>::infinity()) {
      const VF va = hn::Set(df, std::exp(mx - m_new));
      hn::Store(hn::Mul(va, hn::Load(df, lv)), df, lv);
      for (std::size_t d = 0; d < dimp; d += kN)
        hn::Store(hn::Mul(va, hn::Load(df, acc + d)), df, acc + d);
    }
    mx = m_new;
  }
  const VF vm = hn::Set(df, mx);
  VF vsum = hn::Load(df, lv);
  VF e[kTile / kN];
  for (std::size_t g = 0; g < groups; ++g) {
    e[g] = ExpScores(df, hn::Sub(s[g], vm));
    vsum = hn::Add(vsum, e[g]);
    if constexpr (kRound) e[g] = RoundToBF16(df, e[g]);
    if (pairs == nullptr) hn::Store(e[g], df, p + g * kN);
  }
  hn::Store(vsum, df, lv);
  if constexpr (kRound && kHaveDotBF16) {
    if (pairs != nullptr) PackPairs(e[0], groups > 1 ? e[1] : hn::Zero(df), pairs);
  }
}

template <class T>
class ItemRunner {
 public:
  explicit ItemRunner(const AttentionCtx& c)
      : c_(c), dot_capable_(kDotT && c.bf16_inputs && c.dim % kC == 0 && cpu_has_avx512_bf16()) {}

  // Runs one item. `claim_next()` is called at most once, when the pump
  // runs out of the item's tiles: it returns the item this runner will run
  // next, or null, and the pump goes on into that item's first tiles so that
  // memory does not idle across the boundary (only decode items over the
  // same heads qualify).
  template <class ClaimNext>
  void run(const WorkItem& it, Scratch& s, float* partial, ClaimNext&& claim_next) {
    const std::uint32_t dim = c_.dim;
    const std::uint32_t nrows = it.r1 - it.r0;
    const std::uint32_t m_per_head = nrows * c_.group;
    const std::uint32_t nh = it.h1 - it.h0;
    const std::size_t total = std::size_t{nh} * m_per_head;
    const std::uint32_t tiles = (it.t1 - it.t0 + kTile - 1) / kTile;
    const bool resident = rows_resident(it, tiles);
    // Rows already in the caches need no prefetcher-friendly walk: NHD items
    // go head by head there too (as HND ones do; see head_major()).
    head_major_ = !heads_contiguous() || m_per_head >= kNhdHeadMajorVectors || resident;
    // Rows the probe found cached run without prefetches either way.
    step_l1_ = c_.prefetch == AttentionPrefetch::next_step_l1 && !resident;
    // NHD rows hold only the item's heads when it has them all (decode).
    pump_pairs_ = heads_contiguous() && std::size_t{nh} * dim != c_.token_stride;
    // The pair products only where each K/V row serves several query vectors
    // and the loops are not pumping rows in from memory; the f32 loops
    // compute the same rounded products. Cached, 2 threads: GQA 2 1.09-1.12x,
    // GQA 4 1.13-1.18x, GQA 8 1.15x, but MHA 0.95-0.97x; pumped from DRAM
    // they only made the wait longer (HND GQA 4 0.92-0.94x in the slow
    // memory state; docs/PERFORMANCE.md, session 21).
    dot_ = dot_capable_ && m_per_head >= 2 && (!pump_chosen() || resident);
    s.ensure(total, dim);
    probs_ = s.probs.get();
    pairs_ = s.pairs.get();
    load_queries(it, s);
    std::fill(s.mx.begin(), s.mx.begin() + total, -std::numeric_limits<float>::infinity());
    std::fill(s.lv.get(), s.lv.get() + total * kN, 0.0f);
    std::fill(s.acc.get(), s.acc.get() + total * s.dimp, 0.0f);
    // Row i (local) of the item sees tokens < first_limit + i.
    const std::uint32_t first_limit = c_.cache_lengths[it.b] + (it.r0 - c_.row_offsets[it.b]) + 1;
    // Row pointers (KV head 0) of the tiles in flight: [k % kRing] is tile k;
    // head h's row is the pointer + h * head_stride. One page-table walk per tile.
    TileRows ring[kRing];
    const bool pumping = pump_chosen() && !resident;
    const std::uint32_t ahead = pumping ? kPrefetchTilesAhead : 1;
    for (std::uint32_t k = 0; k <= ahead && k < tiles; ++k) fill_tile(it, k, ring[k]);
    const WorkItem* following = nullptr;  // the runner's next item, once claimed
    bool claimed = false;
    for (std::uint32_t k = 0; k < tiles; ++k) {
      const TileRows& cur = ring[k % kRing];
      const std::uint32_t ta = it.t0 + k * kTile;  // tile k's first token
      const TileRows* next = k + 1 < tiles ? &ring[(k + 1) % kRing] : nullptr;
      const TileRows* far = k + ahead < tiles ? &ring[(k + ahead) % kRing] : nullptr;
      if (pumping && far == nullptr) {
        // Past the item's end: the tile k + ahead - tiles of the next item.
        if (!claimed) {
          claimed = true;
          following = claim_next();
          if (following != nullptr && !continues_pump(it, *following)) following = nullptr;
        }
        const std::uint32_t j = k + ahead - tiles;
        if (following != nullptr && std::uint64_t{j} * kTile < following->t1 - following->t0) {
          fill_tile(*following, j, carry_);
          far = &carry_;
        }
      }
      if (pumping && far != nullptr) {
        // The rows of the tile `ahead` tiles on, into L2, issued from inside
        // the score and PV loops as they consume this tile's rows.
        start_pump(*far, it.h0, nh, nh * m_per_head);
      }
      tile(cur, next, ta, it.h0, nh, m_per_head, first_limit, s);
      finish_pump();
      if (k + ahead + 1 < tiles) fill_tile(it, k + ahead + 1, ring[(k + ahead + 1) % kRing]);
    }
    const DF df;
    for (std::size_t i = 0; i < total; ++i)
      s.l[i] = ReduceSum(df, hn::Load(df, s.lv.get() + i * kN));
    if (partial == nullptr) {
      write_output(it, s);
    } else {
      std::copy_n(s.mx.begin(), total, partial);
      std::copy_n(s.l.begin(), total, partial + total);
      for (std::size_t i = 0; i < total; ++i)
        unlayout(s.acc.get() + i * s.dimp, 1.0f, partial + 2 * total + i * dim);
    }
  }

 private:
  // Whether the pump may run on from item `it` into `following`: a decode
  // item over the same heads, so that the walk's unit is the same.
  static bool continues_pump(const WorkItem& it, const WorkItem& following) {
    return !following.prefill && following.h0 == it.h0 && following.h1 == it.h1;
  }

  // Whether the probe (AttentionCtx::probe_residency) finds a decode item's
  // rows in the caches: the first line of kProbeRows K and V rows spread
  // over its tokens (never its last token, which a store has just written).
  // Items under kProbeMinTiles tiles and prefill items are not probed (they
  // pump). Once a probe finds rows outside the caches, the runner pumps the
  // call's later items without probing them: a probe of rows in DRAM stalls
  // for about one memory latency, one of cached rows takes ~0.1 us.
  bool rows_resident(const WorkItem& it, std::uint32_t tiles) {
    if (!c_.probe_residency || it.prefill || tiles < kProbeMinTiles || !maybe_resident_) {
      return false;
    }
    const void* lines[kProbeRows];
    const std::uint32_t n = it.t1 - it.t0;
    for (std::uint32_t i = 0; i < kProbeRows; ++i) {
      const auto tok =
          it.t0 + static_cast<std::uint32_t>((std::uint64_t{2 * i + 1} * n) / (2 * kProbeRows));
      lines[i] = row(i % 2 == 0 ? c_.k : c_.v, it.b, tok, it.h0);
    }
    maybe_resident_ = lines_resident(lines, kProbeRows);
    return maybe_resident_;
  }

  // Tiles may span pages (rows are addressed one by one).
  static std::uint32_t tile_end(std::uint32_t ta, std::uint32_t t1) {
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(t1, std::uint64_t{ta} + kTile));
  }

  // K and V row pointers of KV head 0 for the tokens of one tile.
  struct TileRows {
    const T* k[kTile];
    const T* v[kTile];
    std::uint32_t n = 0;
    // Page segments: rows [seg[j], seg[j + 1]) lie in one page (j < nseg).
    std::uint8_t seg[kTile + 1];
    std::uint32_t nseg = 0;
  };

  // rows = the K/V rows of tile k: tokens [t0 + k * kTile, + kTile) of the item.
  void fill_tile(const WorkItem& it, std::uint32_t k, TileRows& rows) const {
    rows.n = 0;
    rows.nseg = 0;
    const std::uint32_t ta = it.t0 + k * kTile;
    append_rows(it.b, ta, tile_end(ta, it.t1), rows);
  }

  // Appends the K/V rows of tokens [ta, tb) (head 0), one page-table lookup
  // per page.
  void append_rows(std::uint32_t b, std::uint32_t ta, std::uint32_t tb, TileRows& rows) const {
    std::uint32_t tok = ta;
    while (tok < tb) {
      rows.seg[rows.nseg++] = static_cast<std::uint8_t>(rows.n);
      const std::uint32_t run_end = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(tb, (std::uint64_t{tok} / c_.page + 1) * c_.page));
      const T* kr = row(c_.k, b, tok, 0);
      const T* vr = row(c_.v, b, tok, 0);
      for (; tok < run_end; ++tok, kr += c_.token_stride, vr += c_.token_stride) {
        rows.k[rows.n] = kr;
        rows.v[rows.n] = vr;
        ++rows.n;
      }
    }
    rows.seg[rows.nseg] = static_cast<std::uint8_t>(rows.n);
  }

  const T* row(const LayerRef& ref, std::uint32_t b, std::uint32_t tok, std::uint32_t h) const {
    const std::uint32_t block = c_.lookup[std::size_t{b} * c_.lookup_stride + tok / c_.page];
    return static_cast<const T*>(ref.blocks) + std::size_t{block} * ref.block_stride +
           std::size_t{tok % c_.page} * c_.token_stride + std::size_t{h} * c_.head_stride;
  }

  void load_queries(const WorkItem& it, Scratch& s) const {
    const std::uint32_t dim = c_.dim;
    const std::size_t q_row = std::size_t{c_.n_q} * dim;
    std::size_t idx = 0;
    for (std::uint32_t h = it.h0; h < it.h1; ++h) {
      for (std::uint32_t r = it.r0; r < it.r1; ++r) {
        for (std::uint32_t g = 0; g < c_.group; ++g, ++idx) {
          const float* src = c_.q + r * q_row + std::size_t{h * c_.group + g} * dim;
          float* q = s.qs.get() + idx * s.dimp;
          ToLayout<T>(src, dim, c_.scale, q);
          if (c_.bf16_inputs) RoundRowToBF16(DF(), q, s.dimp);
          if constexpr (kDotT) {
            if (dot_) PackQuery(q, s.dimp, s.qb.get() + idx * s.dimp / 2);
          }
        }
      }
    }
  }

  // dst[d] = acc[LayoutPos(d)] * scale for d < dim.
  void unlayout(const float* acc, float scale, float* dst) const {
    FromLayout<T>(acc, c_.dim, scale, dst);
  }

  void write_output(const WorkItem& it, const Scratch& s) const {
    const std::uint32_t dim = c_.dim;
    const std::size_t q_row = std::size_t{c_.n_q} * dim;
    std::size_t idx = 0;
    for (std::uint32_t h = it.h0; h < it.h1; ++h) {
      for (std::uint32_t r = it.r0; r < it.r1; ++r) {
        for (std::uint32_t g = 0; g < c_.group; ++g, ++idx) {
          float* dst = c_.out + r * q_row + std::size_t{h * c_.group + g} * dim;
          unlayout(s.acc.get() + idx * s.dimp, 1.0f / s.l[idx], dst);
        }
      }
    }
  }

  // Lines-consumed callback for the loops: the first pass over the tile's
  // rows (K in the score loop, V in the PV loop) drives the pump; later
  // query blocks re-read rows that are already cached.
  // A functor rather than a lambda so that it is inlined into the loops (GCC
  // 12 called the lambda out of line: 6 % of MHA's time from L2).
  struct LinesRead {
    const ItemRunner* runner;
    bool first_pass;
    HWY_INLINE void operator()(std::uint32_t lines) const {
      if (first_pass) runner->pump(lines);
    }
  };
  LinesRead pump_for(bool first_pass) const { return {this, first_pass && pump_active_}; }
  // For loops whose pass does not drive the pump (later query blocks, or
  // no pump at all): reports cost nothing. The loops (pv_rows, score_block,
  // score_pairs, pv_head_pair) are instantiated with it where they would
  // have taken LinesRead{first_pass = false}, whose flag GCC 12 tested on
  // every token of the PV loop and every row of the score loop, and which
  // made it spill the AVX2 4-query score loop (see score_block). Zen 3
  // (AVX2), from L2, 1 thread, 9 rounds each: PV alone GQA 4 1.03-1.09x;
  // then the score loops GQA 4 1.26x (median), MHA 1.14x; DRAM, 2 threads,
  // 0.97-1.06x (docs/PERFORMANCE.md, session 22).
  struct NoLinesRead {
    HWY_INLINE void operator()(std::uint32_t) const {}
  };

  // pv_rows and score_block are forced inline into their loops (GCC 12 had
  // made them out-of-line clones): from L2, 1 thread, GQA 4 1.12x (HND) and
  // 1.10x (NHD), MHA 1.02-1.05x; DRAM, 2 threads, slow memory state, HND
  // GQA 4 0.975x, NHD GQA 4 0.99x, MHA 1.00x, inside the build-to-build
  // noise there (docs/PERFORMANCE.md, session 18).
  template <int kR, std::uint32_t kEvery = 1>
  HWY_INLINE void pv_rows(DF df, float* pr, float* acc, std::size_t dimp, const T* const* vp,
                          std::uint32_t nt, bool first_pass) const {
    const float* p[kR];
    float* a[kR];
    for (int r = 0; r < kR; ++r) {
      p[r] = pr + r * kTile;
      a[r] = acc + r * dimp;
    }
    if constexpr (kDotT) {
      if (dot_) {
        // pairs_ is indexed as probs_ is, two tokens a pair.
        const std::uint32_t* pp[kR];
        for (int r = 0; r < kR; ++r) pp[r] = pairs_ + (p[r] - probs_) / 2;
        return PvRowsDot<kR, kEvery>(pp, a, vp, nt, c_.dim, pump_for(first_pass));
      }
    }
    if (first_pass && pump_active_) {
      PvRows<kR, kEvery>(df, p, a, vp, nt, c_.dim, pump_for(true));
    } else {
      PvRows<kR, kEvery>(df, p, a, vp, nt, c_.dim, NoLinesRead{});
    }
  }

  // One tile (tokens ta .. ta + rows.n) of KV heads [h0, h0 + nh) for the
  // item's m query vectors per head (state index hl * m + j). K and V are
  // read straight from the cache rows, token by token across the heads (a
  // few tokens' rows of every head before the next tokens), so the reads
  // walk each page in address order: on Zen 4 that let the hardware
  // prefetchers work beside the pump (docs/PERFORMANCE.md, session 5).
  void tile(const TileRows& rows, const TileRows* next, std::uint32_t ta, std::uint32_t h0,
            std::uint32_t nh, std::uint32_t m, std::uint32_t first_limit, Scratch& s) const {
    const DF df;
    const std::uint32_t nt = rows.n;
    // One pumping tile in kTimedTileEvery is timed (the TSC costs ~40 cycles
    // a read; timing every tile took MHA from L2 to 0.94x).
    const bool timed = pump_active_ && ++pumped_tiles_ % kTimedTileEvery == 0;
    if (step_l1_ && next != nullptr) prefetch_segment_starts_l2(*next, h0);
    std::uint64_t t[3] = {};
    if (timed) t[0] = ticks();
    score_tile(df, rows, h0, nh, m, s);
    if (timed) t[1] = ticks();
    float* pr = s.probs.get();
    float* acc = s.acc.get();
    for (std::uint32_t hl = 0; hl < nh; ++hl) {
      for (std::uint32_t j = 0; j < m; ++j) {
        const std::size_t idx = std::size_t{hl} * m + j;
        const std::uint32_t limit = first_limit + j / c_.group;
        const std::uint32_t nvalid = limit <= ta ? 0 : std::min(nt, limit - ta);
        float* p = pr + idx * kTile;
        if (c_.bf16_inputs) {
          SoftmaxUpdate<true>(df, p, nt, nvalid, s.mx[idx], s.lv.get() + idx * kN,
                              acc + idx * s.dimp, s.dimp,
                              dot_ ? pairs_ + idx * kTile / 2 : nullptr);
        } else {
          SoftmaxUpdate(df, p, nt, nvalid, s.mx[idx], s.lv.get() + idx * kN, acc + idx * s.dimp,
                        s.dimp);
        }
        if (pump_active_) pump_lines(softmax_pump_lines_);
      }
    }
    if (timed) t[2] = ticks();
    if (head_major()) {
      pv_tile_head_major(df, rows, next, h0, nh, m, s);
    } else {
      pv_tile(df, rows, next, h0, nh, m, s);
    }
    if (timed) time_softmax(t[2] - t[1], ticks() - t[0]);
  }

  // Query blocks of 4 where m allows (each K load feeds 4 queries), else 2;
  // one query per head takes (token, head) pairs.
  void score_tile(DF df, const TileRows& rows, std::uint32_t h0, std::uint32_t nh, std::uint32_t m,
                  Scratch& s) const {
    if constexpr (kN >= 4) {
      if (m % 4 == 0) return score_heads<4>(df, rows, h0, nh, m, s);
    }
    if constexpr (kN >= 2) {
      if (m % 2 == 0) return score_heads<2>(df, rows, h0, nh, m, s);
    }
    if (m == 1 && !head_major()) return score_pairs(df, rows, h0, nh, s);
    score_heads<1>(df, rows, h0, nh, m, s);
  }

  // Scores of every head's m query vectors (m a multiple of kQ) against the
  // tile, kT tokens at a time: token-major (for each block of tokens, every
  // head in turn) for NHD pages, head-major (every block of one head, then
  // the next head) where a head's rows are adjacent (HND).
  template <int kQ>
  void score_heads(DF df, const TileRows& rows, std::uint32_t h0, std::uint32_t nh, std::uint32_t m,
                   Scratch& s) const {
    constexpr std::uint32_t kT = kN / kQ;
    const std::uint32_t nt = rows.n;
    if (head_major()) {
      for (std::uint32_t hl = 0; hl < nh; ++hl) {
        for (std::uint32_t tb = 0; tb < nt; tb += kT) {
          if (step_l1_) prefetch_next_score_block_head_major(rows, tb + kT, h0, hl, nh);
          score_block<kQ>(df, rows, tb, h0, hl, m, s);
        }
      }
      return;
    }
    for (std::uint32_t tb = 0; tb < nt; tb += kT) {
      for (std::uint32_t hl = 0; hl < nh; ++hl) {
        // Head hl's K rows kPrefetchTokensGqa tokens on, past the tile's
        // end its first V rows.
        if (step_l1_) {
          prefetch_head_ahead_l1(rows.k, nt, rows.v, nt, tb + kPrefetchTokensGqa, kT, h0 + hl);
        }
        score_block<kQ>(df, rows, tb, h0, hl, m, s);
      }
    }
  }

  // Scores of head h0 + hl's m query vectors against tokens [tb, tb + kT)
  // of the tile (rows past the tile repeat its last row; their scores land
  // in the probs padding).
  template <int kQ>
  HWY_INLINE void score_block(DF df, const TileRows& rows, std::uint32_t tb, std::uint32_t h0,
                              std::uint32_t hl, std::uint32_t m, Scratch& s) const {
    constexpr int kT = static_cast<int>(kN) / kQ;
    const std::uint32_t nt = rows.n;
    const std::size_t dimp = s.dimp;
    const std::size_t off = std::size_t{h0 + hl} * c_.head_stride;
    const T* kr[kT];
    for (int u = 0; u < kT; ++u) kr[u] = rows.k[std::min<std::uint32_t>(tb + u, nt - 1)] + off;
    HWY_ALIGN float out[kN];
    float* pr = s.probs.get();
    for (std::uint32_t j = 0; j < m; j += kQ) {
      const std::size_t idx = std::size_t{hl} * m + j;
      VF scores;
      if constexpr (kDotT) {
        if (dot_) {
          scores = ScoreBlockDot<kQ, kT>(df, s.qb.get() + idx * dimp / 2, dimp / 2, kr, c_.dim,
                                         pump_for(j == 0));
        }
      }
      if (!dot_) {
        const SharedQuery q{s.qs.get() + idx * dimp};
        // Unswitched on the pump (NoLinesRead): with the flag tested
        // inside, GCC 12 kept the AVX2 4-query loop's counter and query
        // vectors on the stack (8 stores and 5 stack operands a chunk).
        if (j == 0 && pump_active_) {
          scores = ScoreBlock<kQ, kT>(df, q, dimp, kr, c_.dim, pump_for(true));
        } else {
          scores = ScoreBlock<kQ, kT>(df, q, dimp, kr, c_.dim, NoLinesRead{});
        }
      }
      hn::Store(scores, df, out);
      for (int jj = 0; jj < kQ; ++jj)
        std::memcpy(pr + (idx + jj) * kTile + tb, out + jj * kT, kT * sizeof(float));
    }
  }

  // AttentionPrefetch::next_step_l1, head-major score loop: the K rows of
  // the block starting at token tb of head h0 + hl, or at the head's end the
  // next head's first block, or after the last head the first V rows.
  void prefetch_next_score_block_head_major(const TileRows& rows, std::uint32_t tb,
                                            std::uint32_t h0, std::uint32_t hl,
                                            std::uint32_t nh) const {
    const std::uint32_t nt = rows.n;
    constexpr auto kBlock = static_cast<std::uint32_t>(kN);
    if (tb < nt) return prefetch_tokens_l1(rows.k, tb, std::min(nt, tb + kBlock), h0 + hl, 1);
    if (hl + 1 < nh) return prefetch_tokens_l1(rows.k, 0, std::min(nt, kBlock), h0 + hl + 1, 1);
    prefetch_tokens_l1(rows.v, 0, std::min(nt, kBlock), h0, 1);
  }

  // One query vector per head (m == 1): kN (token, head) pairs per score
  // block in token-major order, each with its head's query.
  void score_pairs(DF df, const TileRows& rows, std::uint32_t h0, std::uint32_t nh,
                   Scratch& s) const {
    constexpr int kT = static_cast<int>(kN);
    constexpr std::uint32_t kSkip = ~0u;
    const std::uint32_t pairs = rows.n * nh;
    float* pr = s.probs.get();
    HWY_ALIGN float out[kN];
    std::uint32_t tn = 0, hn_ = 0;  // the next pair to assign
    for (std::uint32_t p0 = 0; p0 < pairs; p0 += kT) {
      if (step_l1_) {
        if (p0 + kT < pairs) {
          const std::uint32_t last = std::min(pairs, p0 + 2 * kT) - 1;
          prefetch_tokens_l1(rows.k, (p0 + kT) / nh, last / nh + 1, h0, nh);
        } else {
          prefetch_tokens_l1(rows.v, 0, std::min(rows.n, kPvTokensStepL1), h0, nh);
        }
      }
      const T* kr[kT];
      const float* qp[kT];
      std::uint32_t slot[kT];
      for (int u = 0; u < kT; ++u) {
        if (p0 + u < pairs) {
          kr[u] = rows.k[tn] + std::size_t{h0 + hn_} * c_.head_stride;
          qp[u] = s.qs.get() + std::size_t{hn_} * s.dimp;
          slot[u] = hn_ * kTile + tn;
          if (++hn_ == nh) {
            hn_ = 0;
            ++tn;
          }
        } else {  // past the last pair (u >= 1 here): repeat it, drop the score
          // The guard is for GCC's -Warray-bounds, which cannot see that
          // u >= 1 here and warned of kr[-1] for kT == 1.
          const int prev = u > 0 ? u - 1 : 0;
          kr[u] = kr[prev];
          qp[u] = qp[prev];
          slot[u] = kSkip;
        }
      }
      const QueryPerRow q{qp};
      const VF scores = pump_active_ ? ScoreBlock<1, kT>(df, q, s.dimp, kr, c_.dim, pump_for(true))
                                     : ScoreBlock<1, kT>(df, q, s.dimp, kr, c_.dim, NoLinesRead{});
      hn::Store(scores, df, out);
      for (int u = 0; u < kT; ++u) {
        if (slot[u] != kSkip) pr[slot[u]] = out[u];
      }
    }
  }

  // acc += p . V over the tile kPvTokens (with next_step_l1
  // kPvTokensStepL1, or kPvTokensStepL1Gqa for m > 1) tokens at a time: for
  // each group of tokens, every head in turn (accumulators reloaded per
  // group).
  void pv_tile(DF df, const TileRows& rows, const TileRows* next, std::uint32_t h0,
               std::uint32_t nh, std::uint32_t m, Scratch& s) const {
    if (step_l1_) {
      if (m > 1) {
        return pv_tile_steps<kPvTokensStepL1Gqa, StepPrefetch::per_head>(df, rows, next, h0, nh, m,
                                                                         s);
      }
      return pv_tile_steps<kPvTokensStepL1, StepPrefetch::whole_step>(df, rows, next, h0, nh, m, s);
    }
    pv_tile_steps<kPvTokens, StepPrefetch::none>(df, rows, next, h0, nh, m, s);
  }

  // How the PV steps of next_step_l1 prefetch: none (other strategies); the
  // next step's V rows of every head at the step's start (past the tile's
  // end the next tile's first K rows), MHA; or head by head, each head's V
  // rows kPrefetchTokensGqa tokens on just before its part of the step
  // (past the tile's end the next tile's K rows), items with m > 1 query
  // vectors per head (see kPvTokensStepL1Gqa).
  enum class StepPrefetch { none, whole_step, per_head };

  template <std::uint32_t kStep, StepPrefetch kPrefetch>
  void pv_tile_steps(DF df, const TileRows& rows, const TileRows* next, std::uint32_t h0,
                     std::uint32_t nh, std::uint32_t m, Scratch& s) const {
    const std::uint32_t nt = rows.n;
    const std::size_t dimp = s.dimp;
    const T* const* next_k = next != nullptr ? next->k : nullptr;
    const std::uint32_t next_n = next != nullptr ? next->n : 0;
    for (std::uint32_t tg = 0; tg < nt; tg += kStep) {
      const std::uint32_t n = std::min(kStep, nt - tg);
      if constexpr (kPrefetch == StepPrefetch::whole_step) {
        if (tg + kStep < nt) {
          prefetch_tokens_l1(rows.v, tg + kStep, std::min(nt, tg + 2 * kStep), h0, nh);
        } else if (next != nullptr) {
          prefetch_tokens_l1(next->k, 0, std::min(next->n, kStep), h0, nh);
        }
      }
      std::uint32_t hl = 0;
      if (m == 1 && c_.dim % kC == 0) {
        for (; hl + 2 <= nh; hl += 2) pv_head_pair(df, rows, tg, n, h0, hl, s);
      }
      for (; hl < nh; ++hl) {
        if constexpr (kPrefetch == StepPrefetch::per_head) {
          prefetch_head_ahead_l1(rows.v, nt, next_k, next_n, tg + kPrefetchTokensGqa, kStep,
                                 h0 + hl);
        }
        const std::size_t off = std::size_t{h0 + hl} * c_.head_stride;
        const T* vp[kStep];
        for (std::uint32_t i = 0; i < n; ++i) vp[i] = rows.v[tg + i] + off;
        pv_head(df, s.probs.get() + std::size_t{hl} * m * kTile + tg,
                s.acc.get() + std::size_t{hl} * m * dimp, dimp, vp, n, m);
      }
    }
  }

  // Into L1: head h's rows of tokens [a, a + n) of the sequence made of
  // `first` (tokens [0, nfirst)) followed by `then` (tokens [0, nthen);
  // null: none).
  void prefetch_head_ahead_l1(const T* const* first, std::uint32_t nfirst, const T* const* then,
                              std::uint32_t nthen, std::uint32_t a, std::uint32_t n,
                              std::uint32_t h) const {
    const std::uint32_t b = a + n;
    if (a < nfirst) prefetch_tokens_l1(first, a, std::min(b, nfirst), h, 1);
    if (b > nfirst && then != nullptr) {
      const std::uint32_t ta = a > nfirst ? a - nfirst : 0;
      prefetch_tokens_l1(then, std::min(ta, nthen), std::min(b - nfirst, nthen), h, 1);
    }
  }

  // acc += p . V over the tile head by head: a head's rows are adjacent in
  // an HND page, so each head's V is read in address order.
  void pv_tile_head_major(DF df, const TileRows& rows, const TileRows* next, std::uint32_t h0,
                          std::uint32_t nh, std::uint32_t m, Scratch& s) const {
    const std::uint32_t nt = rows.n;
    const std::size_t dimp = s.dimp;
    const T* vp[kTile];
    for (std::uint32_t hl = 0; hl < nh; ++hl) {
      if (step_l1_) {
        if (hl + 1 < nh) {
          prefetch_tokens_l1(rows.v, 0, std::min<std::uint32_t>(nt, kN), h0 + hl + 1, 1);
        } else if (next != nullptr) {
          prefetch_tokens_l1(next->k, 0, std::min<std::uint32_t>(next->n, kN), h0, 1);
        }
      }
      const std::size_t off = std::size_t{h0 + hl} * c_.head_stride;
      for (std::uint32_t i = 0; i < nt; ++i) vp[i] = rows.v[i] + off;
      // Blocks of up to four query vectors keep their accumulators in
      // registers over the whole tile, each block reading the tile's V rows
      // (from L1 after the first). From L2, against 4-token groups: GQA 4
      // 1.12x; GQA 8 1.23x of 8 query vectors per V load (DRAM, 2 threads:
      // HND 1.15x, NHD 1.07x; docs/PERFORMANCE.md, session 11).
      pv_head(df, s.probs.get() + std::size_t{hl} * m * kTile,
              s.acc.get() + std::size_t{hl} * m * dimp, dimp, vp, nt, m);
    }
  }

  // One head's m query vectors (probabilities pr, stride kTile; accumulators
  // acc, stride dimp) over its V rows vp[0, n): up to 4 query vectors per V
  // load.
  void pv_head(DF df, float* pr, float* acc, std::size_t dimp, const T* const* vp, std::uint32_t n,
               std::uint32_t m) const {
    std::uint32_t i = 0;
    // The first block is the one that drives the pump (first_pass); on HND
    // heads with many query vectors it reports every kPvRowsPerReportMany rows.
    if (m >= kPvManyQueries && !heads_contiguous()) {
      pv_rows<4, kPvRowsPerReportMany>(df, pr, acc, dimp, vp, n, true);
      i = 4;
    }
    for (; i + 4 <= m; i += 4) pv_rows<4>(df, pr + i * kTile, acc + i * dimp, dimp, vp, n, i == 0);
    for (; i + 2 <= m; i += 2) pv_rows<2>(df, pr + i * kTile, acc + i * dimp, dimp, vp, n, i == 0);
    for (; i < m; ++i) pv_rows<1>(df, pr + i * kTile, acc + i * dimp, dimp, vp, n, i == 0);
  }

  // One query per head (m == 1), dim a multiple of kC: heads hl and hl + 1
  // (local) over tokens [tg, tg + n) of the tile, each token's two rows read
  // side by side; the accumulators of both heads stay in registers.
  void pv_head_pair(DF df, const TileRows& rows, std::uint32_t tg, std::uint32_t n,
                    std::uint32_t h0, std::uint32_t hl, Scratch& s) const {
    constexpr int kH = 2;
    const T* vp[kH][kPvTokens];
    const T* const* vr[kH];
    const float* p[kH];
    float* acc[kH];
    for (int h = 0; h < kH; ++h) {
      const std::size_t off = std::size_t{h0 + hl + h} * c_.head_stride;
      for (std::uint32_t i = 0; i < n; ++i) vp[h][i] = rows.v[tg + i] + off;
      vr[h] = vp[h];
      p[h] = s.probs.get() + std::size_t{hl + h} * kTile + tg;
      acc[h] = s.acc.get() + std::size_t{hl + h} * s.dimp;
    }
    if (pump_active_) {
      pv_heads_blocks<kH>(df, p, acc, vr, n, pump_for(true));
    } else {
      pv_heads_blocks<kH>(df, p, acc, vr, n, NoLinesRead{});
    }
  }

  // PvHeads over the whole row in register blocks as wide as the
  // accumulator budget allows, then narrower ones.
  template <int kH, class Pump>
  HWY_INLINE void pv_heads_blocks(DF df, const float* const* p, float* const* acc,
                                  const T* const* const* vr, std::uint32_t n,
                                  const Pump& pump) const {
    constexpr int kChMax = kAccRegs / (2 * kH) > 0 ? kAccRegs / (2 * kH) : 1;
    const std::size_t full = c_.dim;
    std::size_t d = PvHeads<kH, kChMax>(df, p, acc, vr, n, 0, full, pump);
    if constexpr (kChMax > 2) d = PvHeads<kH, 2>(df, p, acc, vr, n, d, full, pump);
    if constexpr (kChMax > 1) d = PvHeads<kH, 1>(df, p, acc, vr, n, d, full, pump);
  }

  // AttentionPrefetch::next_step_l1: the first lines of each page segment
  // of the next tile (K and V, from head h0 on) into L2, a tile ahead: the
  // step prefetches reach one block ahead, which leaves the first reads of
  // a shuffled page, where the hardware prefetcher has no stream to follow,
  // waiting a full memory latency. At most 16 lines of K and of V a tile.
  // Zen 3, DRAM, 2 threads, NHD, 10 alternated rounds: paged over
  // continuous 0.954 -> 0.968 (MHA), 0.963 -> 0.977 (GQA 4); fraction of
  // stream 0.605 -> 0.625, 0.47 -> 0.48 (docs/PERFORMANCE.md, session 25).
  void prefetch_segment_starts_l2(const TileRows& rows, std::uint32_t h0) const {
    const std::uint32_t lines = std::max<std::uint32_t>(1, 16 / rows.nseg);
    for (std::uint32_t j = 0; j < rows.nseg; ++j) {
      const std::uint32_t t = rows.seg[j];
      const char* k = reinterpret_cast<const char*>(rows.k[t] + std::size_t{h0} * c_.head_stride);
      const char* v = reinterpret_cast<const char*>(rows.v[t] + std::size_t{h0} * c_.head_stride);
      for (std::uint32_t l = 0; l < lines; ++l) {
        prefetch_l2(k + 64 * l);
        prefetch_l2(v + 64 * l);
      }
    }
  }

  // AttentionPrefetch::next_step_l1: tokens [t0, t1) of heads [h0, h0 + nh)
  // into L1 (rows are head-0 pointers).
  void prefetch_tokens_l1(const T* const* rows, std::uint32_t t0, std::uint32_t t1,
                          std::uint32_t h0, std::uint32_t nh) const {
    const std::size_t bytes = std::size_t{c_.dim} * sizeof(T);
    for (std::uint32_t t = t0; t < t1; ++t) {
      for (std::uint32_t hl = 0; hl < nh; ++hl)
        prefetch_range_l1(rows[t] + std::size_t{h0 + hl} * c_.head_stride, bytes);
    }
  }

  // AttentionPrefetch::next_tile_l2. The tile kPrefetchTilesAhead on is
  // not issued at once: the score and PV loops report the lines they
  // consume and pump(lines) issues as many lines of the far tile, so
  // prefetches leave at the rate the loops read. A burst of ~256 prefetches per step
  // stalled the core on Zen 4 until misses drained (compute and memory did
  // not overlap): spreading them took decode from 11.1 to 14.6 GB/s (MHA)
  // and 7.1 to 12.0 (GQA 4) on one thread; matching the rate to the reads
  // instead of spreading evenly over the loop iterations (the score loop
  // had pumped 2 of MHA's 34 calls per step while reading half its rows)
  // gained again (docs/PERFORMANCE.md, session 5).
  //
  // The pump walks the far tile as a sequence of ranges, all K ranges
  // before the V ones, each a page segment's rows of one unit: one head on
  // HND pages, all heads on NHD pages (a segment of whole token rows is one
  // run there). In DRAM, 2 threads, NHD decode against K and V lines
  // alternately row by row (what an item with only some of the heads
  // still uses, range_.q the V line beside range_.p): MHA 0.98-1.09x, GQA 2
  // 1.12x, GQA 4 1.09x, GQA 8 1.19x (docs/PERFORMANCE.md, session 11). The
  // same walk in address order on HND pages (every head of a page, then the
  // next page) measured 0.95-0.97x: it wants the order the loops read in.
  // PumpCursor says which range is next; range_ holds the lines of the
  // current one still to issue.
  //
  // Past an item's last tile the far tile is the first one of the item the
  // runner will run next (claimed early, see run()): an item's first tile
  // was not prefetched and its last pumped nothing. DRAM, 2 threads, 16
  // items of 64 tiles: 1.00-1.03x, GQA 8 1.02x (docs/PERFORMANCE.md,
  // session 13).
  //
  // The online softmax reads nothing, so with every prefetch tied to the
  // lines the loops read, memory idled through it. The softmax now sends
  // out its share s of the tile's time in prefetches (s measured on one
  // tile in kTimedTileEvery), and the loops (1 - s) per line they read.
  // DRAM, 2 threads, against the session-11 pump: HND GQA 4 1.10x, NHD GQA
  // 4 1.03x, f16 GQA 4 1.05-1.11x, MHA 1.00-1.07x, HND GQA 8 0.97x; from L2
  // MHA 0.90-0.94x, GQA 4 0.97x (the scaling in every report). Measured and
  // dropped: the same lines sent out early in the loops, with no softmax
  // share (0.94-0.96x: the idle time moves, it does not shrink); the loops'
  // share taken out at range ends instead of per report, as skipped or
  // repeated lines (1.02-1.04x for HND GQA 4 against 1.07-1.10x, MHA none);
  // a walk at a stride under 64 bytes (the same); see docs/PERFORMANCE.md,
  // session 12.
  struct PumpCursor {
    const TileRows* rows = nullptr;
    std::uint32_t h0 = 0;        // the item's first head
    std::uint32_t units = 0;     // runs per page segment (heads on HND, 1 on NHD)
    std::size_t unit_bytes = 0;  // bytes of one row of a unit
    // Segments: unit (from h0), page segment. Pairs: the row (inner unused).
    std::uint32_t outer = 0, inner = 0;
    std::uint32_t phase = 0;  // segments: 0 K, 1 V
    bool done = true;
  };
  struct PumpRange {
    const char* p = nullptr;    // next line
    const char* q = nullptr;    // pairs: the V line beside p; else null
    const char* end = nullptr;  // end of p's range (whole lines)
  };

  // Starts pumping the tile `rows` (heads [h0, h0 + nh)) while the current
  // tile runs with `softmax_calls` softmax updates.
  void start_pump(const TileRows& rows, std::uint32_t h0, std::uint32_t nh,
                  std::uint32_t softmax_calls) const {
    // NHD: one unit, the item's heads of a row; HND: one unit per head.
    const std::size_t row_bytes = std::size_t{c_.dim} * sizeof(T);
    const bool nhd = heads_contiguous();
    const std::uint32_t units = nhd ? 1 : nh;
    const std::size_t unit_bytes = nhd ? nh * row_bytes : row_bytes;
    pump_ = {&rows, h0, units, unit_bytes, 0, 0, 0, rows.n == 0};
    // The softmax sends out its share of the tile's time in lines, the loops
    // the rest in step with what they read.
    const auto lines = static_cast<float>(pump_tile_lines(rows, unit_bytes, units));
    softmax_pump_lines_ =
        static_cast<std::uint32_t>(lines * softmax_share_ / static_cast<float>(softmax_calls));
    pump_scale_ = static_cast<std::uint32_t>((1.0f - softmax_share_) * kPumpOne);
    pump_frac_ = 0;
    pump_active_ = true;
    next_pump_range();
  }

  // Averages a timed tile's softmax share (its softmax took `softmax` ticks
  // of the tile's `whole`) into the estimate.
  void time_softmax(std::uint64_t softmax, std::uint64_t whole) const {
    if (whole == 0) return;
    const float share = static_cast<float>(softmax) / static_cast<float>(whole);
    softmax_share_ = std::min(kSoftmaxShareMax, 0.5f * (softmax_share_ + share));
  }

  // Lines the pump issues for a tile: each range rounded up to whole lines.
  std::uint32_t pump_tile_lines(const TileRows& rows, std::size_t unit_bytes,
                                std::uint32_t units) const {
    std::size_t lines = 0;
    if (pump_pairs_) {
      lines = std::size_t{rows.n} * 2 * ((unit_bytes + 63) / 64);
    } else {
      for (std::uint32_t j = 0; j < rows.nseg; ++j)
        lines += ((rows.seg[j + 1] - rows.seg[j]) * unit_bytes + 63) / 64;
      lines *= 2 * std::size_t{units};
    }
    return static_cast<std::uint32_t>(lines);
  }

  // Issues what the loops left.
  void finish_pump() const {
    pump_lines(~0u);
    pump_.done = true;
    range_ = {};
    softmax_pump_lines_ = 0;
    pump_active_ = false;
  }

  // The loops' reports of `lines` read: pump_scale_ / kPumpOne as many
  // prefetches (the softmax issues the rest). Branching around the scaling
  // where it is 1 grew the loops (MHA from L2 0.75x); a countdown that
  // skipped every n-th report cost 0.92x.
  HWY_INLINE void pump(std::uint32_t lines) const {
    const std::uint64_t owed = std::uint64_t{lines} * pump_scale_ + pump_frac_;
    pump_lines(static_cast<std::uint32_t>(owed / kPumpOne));
    pump_frac_ = static_cast<std::uint32_t>(owed % kPumpOne);
  }

  // Up to `lines` prefetches from the current range on. Inlined into the
  // loops: per call a compare or two and the prefetches; finding the next
  // range happens once per range. The pump that found its place anew on
  // every call (out of line) took 27 % of MHA's time from L2 with
  // head-major loops, and cost token-major MHA 17-26 % there
  // (docs/PERFORMANCE.md, session 9). Finding the next range is inlined
  // too: a call in the loops clobbers every vector register, and GCC 12
  // saved and restored the PV loop's accumulators around every report
  // (per token for MHA). Inlined, from L2, 1 thread: pumped HND MHA 1.28x,
  // NHD MHA 1.09x, GQA 4 1.05-1.09x; unpumped GQA 4 1.05-1.085x; DRAM in
  // the slow memory state 0.97-1.01x (docs/PERFORMANCE.md, session 20).
  HWY_INLINE void pump_lines(std::uint32_t lines) const {
    if (pump_pairs_) {
      if (pump_l1_) return pump_ranges<true, true>(lines);
      pump_ranges<true, false>(lines);
    } else {
      if (pump_l1_) return pump_ranges<false, true>(lines);
      pump_ranges<false, false>(lines);
    }
  }

  // One line of the pump: prefetcht0 (next_tile_l1) or prefetcht1 (next_tile_l2).
  template <bool kL1>
  static HWY_INLINE void pump_line(const char* p) {
    if constexpr (kL1) {
      prefetch_l1(p);
    } else {
      prefetch_l2(p);
    }
  }

  // kPair: each range is a K run with its V run beside it (range_.q).
  // kL1: the lines are requested with prefetcht0 (next_tile_l1), though they
  // are wanted a tile later: on Zen 5, in DRAM, 2 threads, slow memory
  // state, against prefetcht1: MHA 1.02-1.10x, GQA 4 1.02-1.045x, batch 1
  // at 32k 1.055x; prefetchnta 0.99-1.07x, prefetcht2 0.91-1.02x. In the
  // fast state it cost the compute-bound GQA 4 6 % until the range walk
  // below was inlined (then 1.00x); with it, prefetcht1 read 0.91x for NHD
  // MHA (docs/PERFORMANCE.md, session 20). The lines still land in L2; most
  // have left L1 by the time the loops read them. On Zen 4 prefetcht0 barely
  // got ahead of memory and prefetcht1 read 1.3-2.0x of it (session 30).
  template <bool kPair, bool kL1>
  HWY_INLINE void pump_ranges(std::uint32_t lines) const {
    while (range_.p != nullptr) {
      const std::size_t avail = static_cast<std::size_t>(range_.end - range_.p) / 64;
      if constexpr (kPair) {
        const std::size_t n = std::min<std::size_t>((std::size_t{lines} + 1) / 2, avail);
        for (std::size_t i = 0; i < n; ++i) {
          pump_line<kL1>(range_.p + 64 * i);
          pump_line<kL1>(range_.q + 64 * i);
        }
        range_.p += 64 * n;
        range_.q += 64 * n;
        lines = lines > 2 * n ? lines - static_cast<std::uint32_t>(2 * n) : 0;
      } else {
        const std::size_t n = std::min<std::size_t>(lines, avail);
        for (std::size_t i = 0; i < n; ++i) pump_line<kL1>(range_.p + 64 * i);
        range_.p += 64 * n;
        lines -= static_cast<std::uint32_t>(n);
      }
      if (lines == 0) return;
      next_pump_range();
    }
  }

  // Loads the next range into range_ (p == nullptr once the tile is done)
  // and advances the cursor.
  HWY_INLINE void next_pump_range() const {
    PumpCursor& c = pump_;
    if (c.done) {
      range_ = {};
      return;
    }
    const TileRows& rows = *c.rows;
    if (!pump_pairs_) {
      const std::uint32_t r0 = rows.seg[c.inner];
      const T* first = c.phase == 0 ? rows.k[r0] : rows.v[r0];
      const std::size_t bytes = (rows.seg[c.inner + 1] - r0) * c.unit_bytes;
      range_.p =
          reinterpret_cast<const char*>(first + std::size_t{c.h0 + c.outer} * c_.head_stride);
      range_.q = nullptr;
      range_.end = range_.p + (bytes + 63) / 64 * 64;
      if (++c.inner == rows.nseg) {
        c.inner = 0;
        if (++c.outer == c.units) {
          c.outer = 0;
          c.done = ++c.phase == 2;
        }
      }
      return;
    }
    // Pairs (NHD, some of the heads): the item's heads of row `outer` are one run.
    const std::size_t off = std::size_t{c.h0} * c_.head_stride;
    const std::size_t bytes = c.unit_bytes;
    range_.p = reinterpret_cast<const char*>(rows.k[c.outer] + off);
    range_.q = reinterpret_cast<const char*>(rows.v[c.outer] + off);
    range_.end = range_.p + (bytes + 63) / 64 * 64;
    c.done = ++c.outer == rows.n;
  }

  // NHD: a token's heads are one contiguous run; HND: one run per head.
  bool heads_contiguous() const { return c_.head_stride == c_.dim; }
  // Whether the call pumps the next tile (next_tile_l2 or next_tile_l1).
  bool pump_chosen() const {
    return c_.prefetch == AttentionPrefetch::next_tile_l2 ||
           c_.prefetch == AttentionPrefetch::next_tile_l1;
  }
  // Whether the tile loops go head by head rather than token-major: where a
  // head's rows are adjacent (HND), and on NHD pages from
  // kNhdHeadMajorVectors query vectors per head on, or when the probe found
  // the item's rows in the caches (token-major order only helps the hardware
  // prefetchers fetch from DRAM). DRAM, 2 threads, against token-major on the
  // same HND pages: MHA 1.30x, GQA 2 1.28x, GQA 4 1.08x; GQA 8 1.12x of NHD
  // (docs/PERFORMANCE.md, session 9). NHD rows from L2, 1 thread: MHA
  // 1.16-1.21x, GQA 4 1.09-1.11x (session 18).
  bool head_major() const { return head_major_; }

  // Whether bf16 pair products can serve this element type.
  static constexpr bool kDotT = kHaveDotBF16 && std::is_same_v<T, hwy::bfloat16_t>;
  const AttentionCtx& c_;
  // AttentionPrecision::bf16 by pair products (vdpbf16ps), see kHaveDotBF16:
  // possible for this call, and chosen for the current item.
  const bool dot_capable_;
  bool dot_ = false;
  // The worker's probability rows and their packed pairs (Scratch).
  const float* probs_ = nullptr;
  std::uint32_t* pairs_ = nullptr;
  mutable PumpCursor pump_;
  mutable PumpRange range_;
  // Pacing (start_pump): prefetches per line the loops read, in 1/kPumpOne,
  // the fraction owed, lines per softmax update, whether a far tile is being
  // pumped, the softmax's share of a tile's time, and the tiles pumped.
  static constexpr std::uint32_t kPumpOne = 1u << 16;
  mutable std::uint32_t pump_scale_ = kPumpOne, pump_frac_ = 0;
  mutable std::uint32_t softmax_pump_lines_ = 0;
  mutable bool pump_active_ = false;
  mutable float softmax_share_ = kSoftmaxShareGuess;
  mutable std::uint32_t pumped_tiles_ = 0;
  // Residency probe (rows_resident): false once a probe in this call found
  // rows outside the caches.
  static constexpr std::uint32_t kProbeRows = 16;
  static constexpr std::uint32_t kProbeMinTiles = 4;
  bool maybe_resident_ = true;
  // Per item; read in the inlined loops and pump.
  bool head_major_ = false;
  // The pump's lines go out as prefetcht0 (next_tile_l1), else prefetcht1.
  const bool pump_l1_ = c_.prefetch == AttentionPrefetch::next_tile_l1;
  bool step_l1_ = false;     // AttentionPrefetch::next_step_l1 for this item
  bool pump_pairs_ = false;  // pump K and V lines of a row alternately
  // Rows of the next item's tile that the pump walks past an item's end
  // (last: the members above are read in the loops, at short offsets).
  TileRows carry_;
};

// Combines a group's partials (max, sum, acc per query vector) into out.
inline void MergeGroupOutput(const AttentionCtx& c, const MergeGroup& g, const float* partials,
                             std::size_t stride) {
  const WorkItem& it = c.plan->items[g.first];
  const std::uint32_t dim = c.dim;
  const std::size_t total = std::size_t{it.h1 - it.h0} * (it.r1 - it.r0) * c.group;
  const std::size_t q_row = std::size_t{c.n_q} * dim;
  std::size_t idx = 0;
  for (std::uint32_t h = it.h0; h < it.h1; ++h) {
    for (std::uint32_t r = it.r0; r < it.r1; ++r) {
      for (std::uint32_t gq = 0; gq < c.group; ++gq, ++idx) {
        float m = -std::numeric_limits<float>::infinity();
        for (std::uint32_t s = 0; s < g.count; ++s)
          m = std::max(m, partials[(g.first + s) * stride + idx]);
        float* dst = c.out + r * q_row + std::size_t{h * c.group + gq} * dim;
        std::fill(dst, dst + dim, 0.0f);
        float l = 0.0f;
        for (std::uint32_t s = 0; s < g.count; ++s) {
          const float* p = partials + (g.first + s) * stride;
          if (p[idx] == -std::numeric_limits<float>::infinity()) continue;
          const float w = std::exp(p[idx] - m);
          l += w * p[total + idx];
          const float* a = p + 2 * total + idx * dim;
          for (std::uint32_t d = 0; d < dim; ++d) dst[d] += w * a[d];
        }
        const float inv = 1.0f / l;
        for (std::uint32_t d = 0; d < dim; ++d) dst[d] *= inv;
      }
    }
  }
}

// Runs fn(worker) on up to `want` workers of the pool (or inline).
template <class F>
void OnWorkers(ThreadPool* pool, std::size_t want, const F& fn) {
  const std::size_t workers = pool == nullptr ? 1 : std::min(pool->num_threads(), want);
  if (workers <= 1) {
    fn(0);
    return;
  }
  pool->parallel_for(workers, fn);
}

template <class T>
void RunAttention(const AttentionCtx& c) {
  const AttentionPlan& plan = *c.plan;
  const std::size_t n_items = plan.items.size();
  std::size_t max_total = 0;
  for (std::size_t i = 0; i < plan.split_items; ++i) {
    const WorkItem& it = plan.items[i];
    max_total =
        std::max<std::size_t>(max_total, std::size_t{it.h1 - it.h0} * (it.r1 - it.r0) * c.group);
  }
  const std::size_t stride = max_total * (c.dim + 2);
  std::vector<float> partials(plan.split_items * stride);
  std::atomic<std::size_t> next{0};
  OnWorkers(c.pool, n_items, [&](std::size_t) {
    Scratch s;
    prefill::Buffers pb;
    ItemRunner<T> runner(c);
    std::size_t i = next.fetch_add(1);
    while (i < n_items) {
      const WorkItem& it = plan.items[i];
      // The runner may claim its next item early, to prefetch into it.
      std::size_t following = n_items;
      bool claimed = false;
      const auto claim_next = [&]() -> const WorkItem* {
        claimed = true;
        following = next.fetch_add(1);
        return following < n_items ? &plan.items[following] : nullptr;
      };
      if (it.prefill && (it.r1 - it.r0) * c.group <= prefill::max_query_vectors()) {
        prefill::RunItem<T>(c, it, pb);
      } else {
        runner.run(it, s, i < plan.split_items ? partials.data() + i * stride : nullptr,
                   claim_next);
      }
      i = claimed ? following : next.fetch_add(1);
    }
  });
  if (plan.groups.empty()) return;
  std::atomic<std::size_t> next_group{0};
  OnWorkers(c.pool, plan.groups.size(), [&](std::size_t) {
    for (std::size_t g = next_group.fetch_add(1); g < plan.groups.size();
         g = next_group.fetch_add(1)) {
      MergeGroupOutput(c, plan.groups[g], partials.data(), stride);
    }
  });
}

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_ATTENTION_CPU_INL_H_ (per target)
