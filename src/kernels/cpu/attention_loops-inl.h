// The f32 score and PV loops of the CPU attention kernel, per Highway target
// (included through attention_cpu-inl.h): blocks of query vectors against
// blocks of K rows (ScoreBlock), and probabilities times V rows into the
// accumulators (PvRows, PvHeads). Each loop reports the lines it reads to a
// `stream` callback (the prefetch stream, or NoLinesRead).
#if defined(KVCACHE_KERNELS_CPU_ATTENTION_LOOPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ATTENTION_LOOPS_INL_H_
#undef KVCACHE_KERNELS_CPU_ATTENTION_LOOPS_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ATTENTION_LOOPS_INL_H_
#endif

#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "kernels/cpu/attention_blocks-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Scores of kQ query vectors (layout order, stride dimp, zero padded) against
// kT key rows, kQ * kT == kN: lane j * kT + u = q_j . k_u. Each K chunk load
// feeds 2 * kQ FMAs; one transpose-add tree per kN scores.
template <int kQ, int kT, bool kTail, class T, class Query, class Stream>
HWY_INLINE void ScoreChunks(DF df, const Query& q, std::size_t dimp, const T* const* kr,
                            std::size_t d0, std::size_t d1, std::size_t dim, VF* a,
                            const Stream& stream) {
  // Report the lines read about kStreamReportLines at a time (the stream's per-call
  // cost is ~20 instructions).
  constexpr std::uint32_t kLines = ChunksLines<T>(kT);
  constexpr std::uint32_t kEvery = kLines >= kStreamReportLines ? 1 : kStreamReportLines / kLines;
  std::uint32_t n = 0;
  for (std::size_t d = d0; d < d1; d += kC) {
    if (++n == kEvery) {
      stream(kEvery * kLines);
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
  if (n != 0) stream(n * kLines);
}

// As ScoreChunks for one query vector per row (kQ == 1), but each row read
// whole before the next: the (token, head) rows of a block are adjacent in an
// NHD page, so the loads walk it in address order. Against chunk-major order
// (chunk c of all kT rows, then c + 1): MHA from L2 +10-17 %, DRAM on one
// thread 0.49-0.64 -> 0.60-0.65 of stream, two threads unchanged
// (a variant that also unrolled the row lost on one thread).
template <int kT, bool kTail, class T, class Query, class Stream>
HWY_INLINE void ScoreRows(DF df, const Query& q, const T* const* kr, std::size_t d0, std::size_t d1,
                          std::size_t dim, VF* a, const Stream& stream) {
  const std::uint32_t row_lines = ChunksLines<T>((d1 - d0) / kC);
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
    stream(row_lines);  // every row: DRAM 1.11x of every 4 rows for HND MHA
  }
}

// ScoreRows for one query shared by every row and rows of exactly 2-4
// whole chunks (head dims 64, 96, 128 on AVX-512): the query held in
// registers, each row's chunks unrolled, so a chunk costs its load, the bf16
// split and two FMAs (the loop had 8 instructions a chunk, 3 loads). MHA
// from L2, 1 thread: HND 1.15x, NHD (head-major when cached) 1.13x; from L3,
// 2 threads: 1.055-1.07x; DRAM HND MHA (same binary, switched by an
// environment hook): 0.975x by gbps, 0.814 against 0.812 of stream, inside
// this VM's noise. AVX2 (head dims 32-64
// there): dim 64 1.21x from L2; SSE4 and others keep ScoreRows.
constexpr bool kQueryInRegisters = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2;
template <int kT, int kChunks, class T, class Stream>
HWY_INLINE void ScoreRowsFixed(DF df, const float* q, const T* const* kr, VF* a,
                               const Stream& stream) {
  constexpr std::uint32_t kRowLines = ChunksLines<T>(kChunks);
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
    stream(kRowLines);
  }
}

template <int kQ, int kT, class T, class Query, class Stream>
HWY_INLINE VF ScoreBlock(DF df, const Query& q, std::size_t dimp, const T* const* kr,
                         std::size_t dim, const Stream& stream) {
  static_assert(kQ * kT == static_cast<int>(kN), "one score vector per block");
  VF a[kN];
#pragma GCC unroll 16
  for (std::size_t u = 0; u < kN; ++u) a[u] = hn::Zero(df);
  const std::size_t full = dim / kC * kC;
  if constexpr (kQ == 1 && kQueryInRegisters && std::is_same_v<Query, SharedQuery>) {
    // Each case reduces on its own: the same code as an if-chain with one
    // ReduceTokens after it compiled slower under GCC 12 (HND MHA from L2,
    // 1 thread, 0.87-0.89x; not examined further).
    if (full == dim) {
      switch (dim / kC) {
        case 2:
          ScoreRowsFixed<kT, 2>(df, q.q, kr, a, stream);
          return ReduceTokens(df, a);
        case 3:
          ScoreRowsFixed<kT, 3>(df, q.q, kr, a, stream);
          return ReduceTokens(df, a);
        case 4:
          ScoreRowsFixed<kT, 4>(df, q.q, kr, a, stream);
          return ReduceTokens(df, a);
        default:
          break;
      }
    }
  }
  if constexpr (kQ == 1) {
    ScoreRows<kT, false>(df, q, kr, 0, full, dim, a, stream);
    if (full < dim) ScoreRows<kT, true>(df, q, kr, full, full + kC, dim, a, stream);
  } else {
    ScoreChunks<kQ, kT, false>(df, q, dimp, kr, 0, full, dim, a, stream);
    if (full < dim) ScoreChunks<kQ, kT, true>(df, q, dimp, kr, full, full + kC, dim, a, stream);
  }
  return ReduceTokens(df, a);
}

// acc_r += sum_t p_r[t] * v_t for kR query vectors over chunks [d0, d1),
// kCh chunks per register block, so each V chunk load feeds 2 * kR FMAs.
template <int kR, int kCh, bool kTail, std::uint32_t kEvery, class T, class Stream>
HWY_INLINE void PvChunks(DF df, const float* const* p, float* const* acc, const T* const* vr,
                         std::uint32_t nt, std::size_t d0, std::size_t d1, std::size_t dim,
                         const Stream& stream) {
  // The stream hears of the rows read every kEvery rows, however many query
  // vectors share them (told once per block of tokens, 32-token groups had
  // read 0.93 of 4-token ones for GQA 4 in DRAM; docs/PERFORMANCE.md,
  // sessions 9 and 10; kEvery: see kPvRowsPerReportMany).
  constexpr std::uint32_t kLines = ChunksLines<T>(kCh);
  for (std::size_t d = d0; d + kCh * kC <= d1; d += kCh * kC) {
    VF a[kR][2 * kCh];
#pragma GCC unroll 16
    for (int r = 0; r < kR; ++r)
#pragma GCC unroll 16
      for (int i = 0; i < 2 * kCh; ++i) a[r][i] = hn::Load(df, acc[r] + d + i * kN);
    std::uint32_t n = 0;
    for (std::uint32_t t = 0; t < nt; ++t) {
      if (++n == kEvery) {
        stream(kEvery * kLines);
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
    if (n != 0) stream(n * kLines);
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
template <int kH, int kCh, class T, class Stream>
HWY_INLINE std::size_t PvHeads(DF df, const float* const* p, float* const* acc,
                               const T* const* const* vr, std::uint32_t nt, std::size_t d0,
                               std::size_t full, const Stream& stream) {
  std::size_t d = d0;
  for (; d + kCh * kC <= full; d += kCh * kC) {
    VF a[kH][2 * kCh];
#pragma GCC unroll 16
    for (int h = 0; h < kH; ++h)
#pragma GCC unroll 16
      for (int i = 0; i < 2 * kCh; ++i) a[h][i] = hn::Load(df, acc[h] + d + i * kN);
    for (std::uint32_t t = 0; t < nt; ++t) {
      stream(ChunksLines<T>(kH * kCh));
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
template <int kR, int kCh, std::uint32_t kEvery, class T, class Stream>
HWY_INLINE std::size_t PvBlocks(DF df, const float* const* p, float* const* acc, const T* const* vr,
                                std::uint32_t nt, std::size_t d0, std::size_t d1, std::size_t dim,
                                const Stream& stream) {
  const std::size_t end = d0 + (d1 - d0) / (kCh * kC) * (kCh * kC);
  PvChunks<kR, kCh, false, kEvery>(df, p, acc, vr, nt, d0, end, dim, stream);
  return end;
}

// V rows read between the PV loop's reports to the stream where an HND head
// has at least kPvManyQueries query vectors (its first block of 4 reports;
// every row elsewhere). Against every row, HND GQA 8: from L2 1.06-1.08x,
// DRAM 1.04-1.06x; the same read 0.95-0.97x for NHD GQA 8 and 0.96-0.98x
// for GQA 4 in DRAM (though 1.03-1.05x from L2), and every 4 rows cost MHA
// 0.94-0.96x in DRAM.
constexpr std::uint32_t kPvManyQueries = 8;
constexpr std::uint32_t kPvRowsPerReportMany = 4;

// Register blocks as wide as the accumulator budget allows, then narrower
// ones for what is left (enough independent FMA chains even for one query);
// the stream is told every kEvery rows.
template <int kR, std::uint32_t kEvery, class T, class Stream>
HWY_INLINE void PvRows(DF df, const float* const* p, float* const* acc, const T* const* vr,
                       std::uint32_t nt, std::size_t dim, const Stream& stream) {
  constexpr int kChMax = kAccRegs / (2 * kR) > 0 ? kAccRegs / (2 * kR) : 1;
  const std::size_t full = dim / kC * kC;
  std::size_t d = PvBlocks<kR, kChMax, kEvery>(df, p, acc, vr, nt, 0, full, dim, stream);
  if constexpr (kChMax > 4) d = PvBlocks<kR, 4, kEvery>(df, p, acc, vr, nt, d, full, dim, stream);
  if constexpr (kChMax > 2) d = PvBlocks<kR, 2, kEvery>(df, p, acc, vr, nt, d, full, dim, stream);
  if constexpr (kChMax > 1) d = PvBlocks<kR, 1, kEvery>(df, p, acc, vr, nt, d, full, dim, stream);
  if (full < dim) PvChunks<kR, 1, true, kEvery>(df, p, acc, vr, nt, full, full + kC, dim, stream);
}

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_ATTENTION_LOOPS_INL_H_ (per target)
