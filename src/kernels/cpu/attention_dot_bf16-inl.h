// The bf16 pair-product (vdpbf16ps) score and PV loops of the CPU attention
// kernel for AttentionPrecision::bf16 on AVX512-BF16, per Highway target
// (included through attention_cpu-inl.h). Elsewhere only declared: the
// callers' branches are discarded by kHaveDotBF16.
#if defined(KVCACHE_KERNELS_CPU_ATTENTION_DOT_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ATTENTION_DOT_BF16_INL_H_
#undef KVCACHE_KERNELS_CPU_ATTENTION_DOT_BF16_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ATTENTION_DOT_BF16_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"
#include "kernels/cpu/attention_blocks-inl.h"
#include "kernels/cpu/attention_loops-inl.h"
#include "kernels/cpu/round_bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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
// has 2 or more query vectors per KV head and is not streamed (ItemRunner::run sets dot_);
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
template <int kT, int kChunks, class Stream>
HWY_INLINE void ScoreRowsDotFixed(const std::uint32_t* q, const hwy::bfloat16_t* const* kr, VF* a,
                                  const Stream& stream) {
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
    stream(kRowLines);
  }
}

// One query vector shared by the rows, rows of any number of chunks, each
// read whole.
template <int kT, class Stream>
HWY_INLINE void ScoreRowsDot(const std::uint32_t* q, const hwy::bfloat16_t* const* kr,
                             std::size_t chunks, VF* a, const Stream& stream) {
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
    stream(row_lines);
  }
}

// ScoreBlock by bf16 pair products: kQ query vectors of one KV head (packed
// pairs from q, qstride u32 apart) against kT rows of dim = whole chunks;
// lane j * kT + u = q_j . k_u.
template <int kQ, int kT, class Stream>
HWY_INLINE VF ScoreBlockDot(DF df, const std::uint32_t* q, std::size_t qstride,
                            const hwy::bfloat16_t* const* kr, std::size_t dim,
                            const Stream& stream) {
  static_assert(kQ * kT == static_cast<int>(kN), "one score vector per block");
  VF a[kN];
#pragma GCC unroll 16
  for (std::size_t u = 0; u < kN; ++u) a[u] = hn::Zero(df);
  const std::size_t chunks = dim / kC;
  if constexpr (kQ == 1) {
    switch (chunks) {
      case 2:
        ScoreRowsDotFixed<kT, 2>(q, kr, a, stream);
        return ReduceTokens(df, a);
      case 4:
        ScoreRowsDotFixed<kT, 4>(q, kr, a, stream);
        return ReduceTokens(df, a);
      case 8:
        ScoreRowsDotFixed<kT, 8>(q, kr, a, stream);
        return ReduceTokens(df, a);
      default:
        break;
    }
    ScoreRowsDot<kT>(q, kr, chunks, a, stream);
  } else {
    const DU du;
    constexpr std::uint32_t kLines = kT * kChunkLines<hwy::bfloat16_t>;
    constexpr std::uint32_t kEvery = kLines >= kStreamReportLines ? 1 : kStreamReportLines / kLines;
    std::uint32_t n = 0;
    for (std::size_t c = 0; c < chunks; ++c) {
      if (++n == kEvery) {
        stream(kEvery * kLines);
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
    if (n != 0) stream(n * kLines);
  }
  return ReduceTokens(df, a);
}

// PvChunks by bf16 pair products over two tokens at a time: pp[r][i] holds
// the probabilities of tokens 2i and 2i + 1 of query vector r (an odd last
// token pairs with probability 0 and its own row).
template <int kR, int kCh, std::uint32_t kEvery, class Stream>
HWY_INLINE void PvChunksDot(const std::uint32_t* const* pp, float* const* acc,
                            const hwy::bfloat16_t* const* vr, std::uint32_t nt, std::size_t d0,
                            std::size_t d1, const Stream& stream) {
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
        stream(n * kLines);
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
    if (n != 0) stream(n * kLines);
#pragma GCC unroll 16
    for (int r = 0; r < kR; ++r)
#pragma GCC unroll 16
      for (int i = 0; i < 2 * kCh; ++i) hn::Store(a[r][i], df, acc[r] + d + i * kN);
  }
}

// PvChunksDot over [d0, d1 rounded down to kCh chunks); returns the end.
template <int kR, int kCh, std::uint32_t kEvery, class Stream>
HWY_INLINE std::size_t PvBlocksDot(const std::uint32_t* const* pp, float* const* acc,
                                   const hwy::bfloat16_t* const* vr, std::uint32_t nt,
                                   std::size_t d0, std::size_t d1, const Stream& stream) {
  const std::size_t end = d0 + (d1 - d0) / (kCh * kC) * (kCh * kC);
  PvChunksDot<kR, kCh, kEvery>(pp, acc, vr, nt, d0, end, stream);
  return end;
}

// PvRows by bf16 pair products (dim whole chunks).
template <int kR, std::uint32_t kEvery, class Stream>
HWY_INLINE void PvRowsDot(const std::uint32_t* const* pp, float* const* acc,
                          const hwy::bfloat16_t* const* vr, std::uint32_t nt, std::size_t dim,
                          const Stream& stream) {
  constexpr int kChMax = kAccRegs / (2 * kR) > 0 ? kAccRegs / (2 * kR) : 1;
  std::size_t d = PvBlocksDot<kR, kChMax, kEvery>(pp, acc, vr, nt, 0, dim, stream);
  if constexpr (kChMax > 4) d = PvBlocksDot<kR, 4, kEvery>(pp, acc, vr, nt, d, dim, stream);
  if constexpr (kChMax > 2) d = PvBlocksDot<kR, 2, kEvery>(pp, acc, vr, nt, d, dim, stream);
  if constexpr (kChMax > 1) PvBlocksDot<kR, 1, kEvery>(pp, acc, vr, nt, d, dim, stream);
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
template <int kQ, int kT, class Stream>
VF ScoreBlockDot(DF df, const std::uint32_t* q, std::size_t qstride,
                 const hwy::bfloat16_t* const* kr, std::size_t dim, const Stream& stream);
template <int kR, std::uint32_t kEvery, class Stream>
void PvRowsDot(const std::uint32_t* const* pp, float* const* acc, const hwy::bfloat16_t* const* vr,
               std::uint32_t nt, std::size_t dim, const Stream& stream);
#endif

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_ATTENTION_DOT_BF16_INL_H_ (per target)
