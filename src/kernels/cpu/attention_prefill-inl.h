// Prefill work items of the CPU attention kernel, per Highway target
// (included by attention_cpu-inl.h once per target).
//
// A prefill item is one KV head and a block of query rows: m query vectors
// (rows x GQA group, m <= 4 vectors' worth of lanes) against the item's
// context. Everything runs in "query lanes" form, so no horizontal sums are
// needed anywhere:
//   Q^T [dim][W]      scaled queries, lane j = query vector j (W = lanes of
//                     nv vectors; unused lanes zero)
//   S^T [token][W]    scores of a tile: for each dim d, one broadcast K
//                     element times a Q^T row (kT tokens x nv vectors of
//                     accumulators in registers)
//   online softmax    per lane, vectorised over query vectors (causal limits
//                     per lane)
//   O^T [dim][W]      output accumulators: for each token, one broadcast V
//                     element times a P^T row (kD dims x nv vectors in
//                     registers), rescaled by the softmax correction once per
//                     tile.
// f32 and bf16 rows (even head dims) are not converted per tile: the score
// blocks broadcast K elements straight from the page (bf16: a 32-bit pair of
// elements widened by a shift or a mask; the even dims of the pairs first,
// then the odd ones), and V rows are copied as stored into one packed tile
// (the NHD rows of one head lie 2 KiB and more apart and share a few L1
// sets, so the dim blocks of accumulate() would miss on every row read in
// place). f16 rows and odd head dims are converted to f32 once per tile
// (kTileTokens tokens) instead. On Zen 3 (AVX2) the packed bf16 path
// measured 1.26x the converting one.
#if defined(KVCACHE_KERNELS_CPU_ATTENTION_PREFILL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ATTENTION_PREFILL_INL_H_
#undef KVCACHE_KERNELS_CPU_ATTENTION_PREFILL_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ATTENTION_PREFILL_INL_H_
#endif

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "hwy/aligned_allocator.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/cpu/exp_scores-inl.h"
#include "kernels/cpu/kernel_common.h"
#include "kernels/cpu/round_bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace prefill {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;

constexpr std::size_t kLanes = HWY_LANES(float);
constexpr std::uint32_t kTileTokens = 32;
// Accumulator registers of one register block (32 vector registers on
// AVX-512, 16 elsewhere; the rest hold the row vectors and the broadcast).
constexpr int kAccRegs = kLanes >= 16 ? 24 : 12;
// Most query-lane vectors an item may use.
constexpr int kMaxVectors = 4;

// Query vectors of an item that this path handles.
constexpr std::uint32_t max_query_vectors() {
  return kLanes >= 4 ? static_cast<std::uint32_t>(kMaxVectors * kLanes) : 0;
}

HWY_INLINE VF ToF32(DF df, const float* p) { return hn::LoadU(df, p); }
HWY_INLINE VF ToF32(DF df, const hwy::bfloat16_t* p) {
  return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::bfloat16_t, DF>(), p));
}
HWY_INLINE VF ToF32(DF df, const hwy::float16_t* p) {
  return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), p));
}

// dst[0, dim) = row converted to f32 (dim elements; the tail one by one).
template <class T>
HWY_INLINE void RowToF32(const T* row, std::uint32_t dim, float* dst) {
  const DF df;
  std::uint32_t d = 0;
  for (; d + kLanes <= dim; d += kLanes) hn::StoreU(ToF32(df, row + d), df, dst + d);
  for (; d < dim; ++d) {
    HWY_ALIGN T one[kLanes] = {};
    one[0] = row[d];
    HWY_ALIGN float f[kLanes];
    hn::Store(ToF32(df, one), df, f);
    dst[d] = f[0];
  }
}

// Element 2 * i + kOdd of a row, broadcast to every lane as f32. A bf16
// element is the high half of its f32 (little-endian pairs: the even
// element is the low 16 bits).
template <int kOdd>
HWY_INLINE VF BroadcastHalf(DF df, const float* row, std::size_t i) {
  return hn::Set(df, row[2 * i + kOdd]);
}
template <int kOdd>
HWY_INLINE VF BroadcastHalf(DF df, const hwy::bfloat16_t* row, std::size_t i) {
  const hn::RebindToUnsigned<DF> du;
  std::uint32_t pair;
  std::memcpy(&pair, row + 2 * i, sizeof(pair));
  const auto v = hn::Set(du, pair);
  if constexpr (kOdd == 0) {
    return hn::BitCast(df, hn::ShiftLeft<16>(v));
  } else {
    return hn::BitCast(df, hn::And(v, hn::Set(du, 0xFFFF0000u)));
  }
}

// Element types whose rows the register blocks read in place.
template <class T>
constexpr bool kReadsInPlace = (std::is_same_v<T, float> ||
                                std::is_same_v<T, hwy::bfloat16_t>)&&std::endian::native
                               == std::endian::little;

struct Buffers {
  std::uint32_t dim = 0, dim_o = 0, width = 0, rows_k = 0;
  hwy::AlignedFreeUniquePtr<float[]> qt, kf, vf, st, ot, mx, l, alpha;
  // AttentionPrecision::bf16 by pair products: Q^T as bf16 pairs of
  // consecutive dims, [dim / 2][lanes].
  hwy::AlignedFreeUniquePtr<std::uint32_t[]> qtp;
  hwy::AlignedFreeUniquePtr<std::int32_t[]> limit;
  // A tile's V rows as stored (any element type up to 4 bytes).
  hwy::AlignedFreeUniquePtr<std::uint8_t[]> vs;

  static hwy::AlignedFreeUniquePtr<float[]> Zeroed(std::size_t n) {
    auto p = hwy::AllocateAligned<float>(n);
    std::fill(p.get(), p.get() + n, 0.0f);
    return p;
  }
  // (Re)allocates for a head dim, padded dim of O^T, lane width and K rows.
  void ensure(std::uint32_t d, std::uint32_t d_o, std::uint32_t w, std::uint32_t rk) {
    if (d == dim && d_o == dim_o && w == width && rk == rows_k) return;
    dim = d, dim_o = d_o, width = w, rows_k = rk;
    qt = Zeroed(std::size_t{d} * w);
    kf = Zeroed(std::size_t{rk} * d);
    vf = Zeroed(std::size_t{kTileTokens} * d_o);
    st = Zeroed(std::size_t{rk} * w);
    ot = Zeroed(std::size_t{d_o} * w);
    mx = Zeroed(w);
    l = Zeroed(w);
    alpha = Zeroed(w);
    limit = hwy::AllocateAligned<std::int32_t>(w);
    vs = hwy::AllocateAligned<std::uint8_t>(std::size_t{kTileTokens} * d * sizeof(float));
    qtp = hwy::AllocateAligned<std::uint32_t>(std::size_t{(d + 1) / 2} * w);
  }
};

template <class T, int kV>
class Runner {
 public:
  static constexpr int kT = kAccRegs / kV;  // tokens per score block
  static constexpr int kD = kAccRegs / kV;  // dims per output block
  static constexpr std::uint32_t kW = static_cast<std::uint32_t>(kV * kLanes);

  Runner(const AttentionCtx& c, Buffers& b)
      : c_(c),
        b_(b),
        dot_(kHaveDotBF16 && std::is_same_v<T, hwy::bfloat16_t> && c.bf16_inputs &&
             c.dim % 2 == 0 && cpu_has_avx512_bf16()),
        in_place_(kReadsInPlace<T> && c.dim % 2 == 0) {}

  void run(const WorkItem& it) {
    const std::uint32_t dim = c_.dim;
    const std::uint32_t dim_o = (dim + kD - 1) / kD * kD;
    b_.ensure(dim, dim_o, kW, kTileTokens + kT);
    m_ = (it.r1 - it.r0) * c_.group;
    load_queries(it);
    const std::uint32_t first_limit = c_.cache_lengths[it.b] + (it.r0 - c_.row_offsets[it.b]) + 1;
    for (std::uint32_t j = 0; j < kW; ++j) {
      b_.limit[j] = j < m_ ? static_cast<std::int32_t>(first_limit + j / c_.group) : 0;
      b_.mx[j] = -std::numeric_limits<float>::infinity();
      b_.l[j] = 0.0f;
    }
    std::fill(b_.ot.get(), b_.ot.get() + std::size_t{dim_o} * kW, 0.0f);
    for (std::uint32_t ta = it.t0; ta < it.t1; ta += kTileTokens) {
      const std::uint32_t nt = std::min(kTileTokens, it.t1 - ta);
      load_tile(it.b, ta, nt, it.h0);
      if (ta + nt < it.t1)
        prefetch_tile(it.b, ta + nt, std::min(kTileTokens, it.t1 - ta - nt), it.h0);
      scores(nt);
      softmax(ta, nt);
      accumulate(nt);
    }
    write_output(it);
  }

 private:
  void load_queries(const WorkItem& it) {
    const std::uint32_t dim = c_.dim;
    const std::size_t q_row = std::size_t{c_.n_q} * dim;
    float* qt = b_.qt.get();
    std::fill(qt, qt + std::size_t{dim} * kW, 0.0f);
    for (std::uint32_t j = 0; j < m_; ++j) {
      const std::uint32_t r = it.r0 + j / c_.group, g = j % c_.group;
      const float* src = c_.q + r * q_row + std::size_t{it.h0 * c_.group + g} * dim;
      for (std::uint32_t d = 0; d < dim; ++d) qt[std::size_t{d} * kW + j] = src[d] * c_.scale;
    }
    if (c_.bf16_inputs) RoundRowToBF16(DF(), qt, std::size_t{dim} * kW);
    if (dot_) {
      // Lane j of qtp[i]: q_j[2i] | q_j[2i + 1] << 16 (both rounded).
      const DF df;
      const hn::RebindToUnsigned<DF> du;
      for (std::uint32_t i = 0; i < dim / 2; ++i) {
        for (std::uint32_t l = 0; l < kW; l += kLanes) {
          const auto lo = hn::BitCast(du, hn::Load(df, qt + std::size_t{2 * i} * kW + l));
          const auto hi = hn::BitCast(du, hn::Load(df, qt + std::size_t{2 * i + 1} * kW + l));
          hn::Store(hn::Or(hn::ShiftRight<16>(lo), hi), du, b_.qtp.get() + std::size_t{i} * kW + l);
        }
      }
    }
  }

  const T* row(const LayerRef& ref, std::uint32_t b, std::uint32_t tok, std::uint32_t h) const {
    const std::uint32_t block = c_.lookup[std::size_t{b} * c_.lookup_stride + tok / c_.page];
    return static_cast<const T*>(ref.blocks) + std::size_t{block} * ref.block_stride +
           std::size_t{tok % c_.page} * c_.token_stride + std::size_t{h} * c_.head_stride;
  }

  // In place (in_place_): krow_ / vrow_ point at the tile's rows (K rows
  // past nt repeat the last one; their scores are masked). Otherwise K rows
  // go into kf [token][dim] (unless dot_ reads K as stored) and V rows into
  // vf [token][dim_o].
  void load_tile(std::uint32_t b, std::uint32_t ta, std::uint32_t nt, std::uint32_t h) {
    const bool k_in_place = dot_ || in_place_;
    for (std::uint32_t t = 0; t < nt; ++t) {
      if (k_in_place) {
        krow_[t] = row(c_.k, b, ta + t, h);
      } else {
        RowToF32(row(c_.k, b, ta + t, h), c_.dim, b_.kf.get() + std::size_t{t} * c_.dim);
      }
      if (in_place_) {
        // V rows as stored, packed: the NHD rows of one head lie 2 KiB and
        // more apart, so a tile's rows share a few L1 sets, and the dim
        // blocks of accumulate() would miss on every row.
        T* dst = reinterpret_cast<T*>(b_.vs.get()) + std::size_t{t} * c_.dim;
        std::memcpy(dst, row(c_.v, b, ta + t, h), std::size_t{c_.dim} * sizeof(T));
        vrow_[t] = dst;
      } else {
        RowToF32(row(c_.v, b, ta + t, h), c_.dim, b_.vf.get() + std::size_t{t} * b_.dim_o);
      }
    }
    if (k_in_place) std::fill(krow_ + nt, krow_ + nt + kT, krow_[nt - 1]);
  }

  // The next tile's K and V rows into L2 (L1 holds this tile's buffers)
  // while this tile is computed.
  void prefetch_tile(std::uint32_t b, std::uint32_t ta, std::uint32_t nt, std::uint32_t h) const {
    const std::size_t bytes = std::size_t{c_.dim} * sizeof(T);
    for (std::uint32_t t = 0; t < nt; ++t) {
      const char* k = reinterpret_cast<const char*>(row(c_.k, b, ta + t, h));
      const char* v = reinterpret_cast<const char*>(row(c_.v, b, ta + t, h));
      for (std::size_t o = 0; o < bytes; o += 64) {
        prefetch_l2(k + o);
        prefetch_l2(v + o);
      }
    }
  }

  // S^T [t][lanes] for t < nt rounded up to kT (rows past nt are masked later).
  void scores(std::uint32_t nt) {
    if constexpr (kHaveDotBF16 && std::is_same_v<T, hwy::bfloat16_t>) {
      if (dot_) return scores_dot(nt);
    }
    if constexpr (kReadsInPlace<T>) {
      if (in_place_) return scores_in_place(nt);
    }
    const DF df;
    const std::uint32_t dim = c_.dim;
    const float* qt = b_.qt.get();
    for (std::uint32_t t0 = 0; t0 < nt; t0 += kT) {
      VF acc[kT][kV];
#pragma GCC unroll 32
      for (int u = 0; u < kT; ++u)
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) acc[u][v] = hn::Zero(df);
      const float* kf = b_.kf.get() + std::size_t{t0} * dim;
      for (std::uint32_t d = 0; d < dim; ++d) {
        VF q[kV];
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) q[v] = hn::Load(df, qt + std::size_t{d} * kW + v * kLanes);
#pragma GCC unroll 32
        for (int u = 0; u < kT; ++u) {
          const VF k = hn::Set(df, kf[static_cast<std::size_t>(u) * dim + d]);
#pragma GCC unroll 4
          for (int v = 0; v < kV; ++v) acc[u][v] = hn::MulAdd(k, q[v], acc[u][v]);
        }
      }
      float* st = b_.st.get() + std::size_t{t0} * kW;
#pragma GCC unroll 32
      for (int u = 0; u < kT; ++u)
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) hn::Store(acc[u][v], df, st + u * kW + v * kLanes);
    }
  }

  // scores() on K rows as stored: the even dims of every pair, then the
  // odd ones (one broadcast of a pair per token and dim either way).
  void scores_in_place(std::uint32_t nt) {
    const DF df;
    for (std::uint32_t t0 = 0; t0 < nt; t0 += kT) {
      VF acc[kT][kV];
#pragma GCC unroll 32
      for (int u = 0; u < kT; ++u)
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) acc[u][v] = hn::Zero(df);
      scores_half<0>(krow_ + t0, acc);
      scores_half<1>(krow_ + t0, acc);
      float* st = b_.st.get() + std::size_t{t0} * kW;
#pragma GCC unroll 32
      for (int u = 0; u < kT; ++u)
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) hn::Store(acc[u][v], df, st + u * kW + v * kLanes);
    }
  }

  template <int kOdd>
  HWY_INLINE void scores_half(const T* const* kr, VF (&acc)[kT][kV]) const {
    const DF df;
    const std::uint32_t pairs = c_.dim / 2;
    const float* qt = b_.qt.get() + std::size_t{kOdd} * kW;
    for (std::uint32_t i = 0; i < pairs; ++i) {
      VF q[kV];
#pragma GCC unroll 4
      for (int v = 0; v < kV; ++v) q[v] = hn::Load(df, qt + std::size_t{2 * i} * kW + v * kLanes);
#pragma GCC unroll 32
      for (int u = 0; u < kT; ++u) {
        const VF k = BroadcastHalf<kOdd>(df, kr[u], i);
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) acc[u][v] = hn::MulAdd(k, q[v], acc[u][v]);
      }
    }
  }

  // scores() by bf16 pair products: for each pair of dims, one broadcast
  // pair of a K row (as stored) against a row of Q^T pairs.
  void scores_dot(std::uint32_t nt) {
    if constexpr (kHaveDotBF16 && std::is_same_v<T, hwy::bfloat16_t>) {
      const DF df;
      const hn::RebindToUnsigned<DF> du;
      const std::uint32_t pairs = c_.dim / 2;
      const std::uint32_t* qtp = b_.qtp.get();
      for (std::uint32_t t0 = 0; t0 < nt; t0 += kT) {
        VF acc[kT][kV];
#pragma GCC unroll 32
        for (int u = 0; u < kT; ++u)
#pragma GCC unroll 4
          for (int v = 0; v < kV; ++v) acc[u][v] = hn::Zero(df);
        const std::uint32_t* kp[kT];
#pragma GCC unroll 32
        for (int u = 0; u < kT; ++u) kp[u] = reinterpret_cast<const std::uint32_t*>(krow_[t0 + u]);
        for (std::uint32_t i = 0; i < pairs; ++i) {
          hn::Vec<decltype(du)> q[kV];
#pragma GCC unroll 4
          for (int v = 0; v < kV; ++v) q[v] = hn::Load(du, qtp + std::size_t{i} * kW + v * kLanes);
#pragma GCC unroll 32
          for (int u = 0; u < kT; ++u) {
            const auto k = hn::Set(du, kp[u][i]);
#pragma GCC unroll 4
            for (int v = 0; v < kV; ++v) acc[u][v] = DotBF16(acc[u][v], k, q[v]);
          }
        }
        float* st = b_.st.get() + std::size_t{t0} * kW;
#pragma GCC unroll 32
        for (int u = 0; u < kT; ++u)
#pragma GCC unroll 4
          for (int v = 0; v < kV; ++v) hn::Store(acc[u][v], df, st + u * kW + v * kLanes);
      }
    } else {
      (void)nt;
    }
  }

  // Online softmax per lane over the tile's visible tokens: S^T becomes P^T,
  // mx / l advance, alpha holds each lane's correction of O^T.
  void softmax(std::uint32_t ta, std::uint32_t nt) {
    const DF df;
    const DI di;
    const VF neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
    const VF floor = hn::Set(df, -88.0f);  // exp(-88) ~ 6e-39: clamps -inf / NaN-free
    float* st = b_.st.get();
    for (int v = 0; v < kV; ++v) {
      const auto lim = hn::Load(di, b_.limit.get() + v * kLanes);
      const VF m_old = hn::Load(df, b_.mx.get() + v * kLanes);
      VF m_new = m_old;
      for (std::uint32_t t = 0; t < nt; ++t) {
        const auto visible =
            hn::RebindMask(df, hn::Lt(hn::Set(di, static_cast<std::int32_t>(ta + t)), lim));
        const VF s = hn::Load(df, st + std::size_t{t} * kW + v * kLanes);
        m_new = hn::Max(m_new, hn::IfThenElse(visible, s, neg_inf));
      }
      // Lanes with nothing visible yet keep -inf; subtract 0 there instead.
      const VF m_safe = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
      VF sum = hn::Zero(df);
      for (std::uint32_t t = 0; t < nt; ++t) {
        const auto visible =
            hn::RebindMask(df, hn::Lt(hn::Set(di, static_cast<std::int32_t>(ta + t)), lim));
        float* p = st + std::size_t{t} * kW + v * kLanes;
        const VF e = ExpScores(df, hn::Max(hn::Sub(hn::Load(df, p), m_safe), floor));
        const VF pv = hn::IfThenElseZero(visible, e);
        // AttentionPrecision::bf16: V meets the rounded probability; the
        // denominator sums the exact one, as the reference does.
        hn::Store(c_.bf16_inputs ? RoundToBF16(df, pv) : pv, df, p);
        sum = hn::Add(sum, pv);
      }
      const VF alpha = hn::Exp(df, hn::Max(hn::Sub(m_old, m_safe), floor));
      const VF l = hn::Load(df, b_.l.get() + v * kLanes);
      hn::Store(hn::MulAdd(l, alpha, sum), df, b_.l.get() + v * kLanes);
      hn::Store(m_new, df, b_.mx.get() + v * kLanes);
      hn::Store(alpha, df, b_.alpha.get() + v * kLanes);
    }
  }

  // O^T = O^T * alpha + V^T P^T over the tile's tokens, kD dims at a time.
  void accumulate(std::uint32_t nt) {
    if constexpr (kReadsInPlace<T>) {
      if (in_place_) return accumulate_in_place(nt);
    }
    const DF df;
    const std::uint32_t dim_o = b_.dim_o;
    VF alpha[kV];
#pragma GCC unroll 4
    for (int v = 0; v < kV; ++v) alpha[v] = hn::Load(df, b_.alpha.get() + v * kLanes);
    const float* st = b_.st.get();
    for (std::uint32_t d0 = 0; d0 < dim_o; d0 += kD) {
      float* ot = b_.ot.get() + std::size_t{d0} * kW;
      VF acc[kD][kV];
#pragma GCC unroll 32
      for (int dd = 0; dd < kD; ++dd)
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v)
          acc[dd][v] = hn::Mul(hn::Load(df, ot + dd * kW + v * kLanes), alpha[v]);
      const float* vf = b_.vf.get() + d0;
      for (std::uint32_t t = 0; t < nt; ++t) {
        VF p[kV];
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) p[v] = hn::Load(df, st + std::size_t{t} * kW + v * kLanes);
        const float* vrow = vf + std::size_t{t} * dim_o;
#pragma GCC unroll 32
        for (int dd = 0; dd < kD; ++dd) {
          const VF x = hn::Set(df, vrow[dd]);
#pragma GCC unroll 4
          for (int v = 0; v < kV; ++v) acc[dd][v] = hn::MulAdd(x, p[v], acc[dd][v]);
        }
      }
#pragma GCC unroll 32
      for (int dd = 0; dd < kD; ++dd)
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) hn::Store(acc[dd][v], df, ot + dd * kW + v * kLanes);
    }
  }

  // accumulate() on V rows as stored: blocks of kD even dims (pairs i0 ..
  // i0 + kD - 1), then the same for the odd dims.
  void accumulate_in_place(std::uint32_t nt) {
    const DF df;
    VF alpha[kV];
#pragma GCC unroll 4
    for (int v = 0; v < kV; ++v) alpha[v] = hn::Load(df, b_.alpha.get() + v * kLanes);
    const std::uint32_t pairs = c_.dim / 2;
    std::uint32_t i0 = 0;
    for (; i0 + kD <= pairs; i0 += kD) {
      accumulate_block<0, kD>(i0, nt, alpha);
      accumulate_block<1, kD>(i0, nt, alpha);
    }
    for (; i0 < pairs; ++i0) {
      accumulate_block<0, 1>(i0, nt, alpha);
      accumulate_block<1, 1>(i0, nt, alpha);
    }
  }

  // O^T rows 2 * (i0 + p) + kOdd, p < kP.
  template <int kOdd, int kP>
  HWY_INLINE void accumulate_block(std::uint32_t i0, std::uint32_t nt, const VF (&alpha)[kV]) {
    const DF df;
    float* ot = b_.ot.get() + std::size_t{2 * i0 + kOdd} * kW;
    const float* st = b_.st.get();
    VF acc[kP][kV];
#pragma GCC unroll 32
    for (int p = 0; p < kP; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < kV; ++v)
        acc[p][v] = hn::Mul(hn::Load(df, ot + 2 * p * kW + v * kLanes), alpha[v]);
    for (std::uint32_t t = 0; t < nt; ++t) {
      VF pr[kV];
#pragma GCC unroll 4
      for (int v = 0; v < kV; ++v) pr[v] = hn::Load(df, st + std::size_t{t} * kW + v * kLanes);
      const T* vr = vrow_[t];
#pragma GCC unroll 32
      for (int p = 0; p < kP; ++p) {
        const VF x = BroadcastHalf<kOdd>(df, vr, i0 + p);
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) acc[p][v] = hn::MulAdd(x, pr[v], acc[p][v]);
      }
    }
#pragma GCC unroll 32
    for (int p = 0; p < kP; ++p)
#pragma GCC unroll 4
      for (int v = 0; v < kV; ++v) hn::Store(acc[p][v], df, ot + 2 * p * kW + v * kLanes);
  }

  void write_output(const WorkItem& it) const {
    const std::uint32_t dim = c_.dim;
    const std::size_t q_row = std::size_t{c_.n_q} * dim;
    const float* ot = b_.ot.get();
    for (std::uint32_t j = 0; j < m_; ++j) {
      const std::uint32_t r = it.r0 + j / c_.group, g = j % c_.group;
      float* dst = c_.out + r * q_row + std::size_t{it.h0 * c_.group + g} * dim;
      const float inv = 1.0f / b_.l[j];
      for (std::uint32_t d = 0; d < dim; ++d) dst[d] = ot[std::size_t{d} * kW + j] * inv;
    }
  }

  const AttentionCtx& c_;
  Buffers& b_;
  // AttentionPrecision::bf16 by pair products in the score loop (the PV
  // loop multiplies the rounded probabilities with f32 FMAs).
  const bool dot_;
  // K and V rows are read as stored (f32 / bf16 and an even head dim).
  const bool in_place_;
  const T* krow_[kTileTokens + kAccRegs];
  const T* vrow_[kTileTokens];
  std::uint32_t m_ = 0;
};

// Runs a prefill item (one KV head, m <= max_query_vectors() query vectors).
template <class T>
void RunItem(const AttentionCtx& c, const WorkItem& it, Buffers& b) {
  const std::uint32_t m = (it.r1 - it.r0) * c.group;
  const std::uint32_t vectors = static_cast<std::uint32_t>((m + kLanes - 1) / kLanes);
  if constexpr (kLanes >= 4) {
    switch (vectors) {
      case 1:
        Runner<T, 1>(c, b).run(it);
        return;
      case 2:
        Runner<T, 2>(c, b).run(it);
        return;
      case 3:
        Runner<T, 3>(c, b).run(it);
        return;
      default:
        Runner<T, 4>(c, b).run(it);
        return;
    }
  } else {
    (void)vectors;
    (void)b;
  }
}

}  // namespace prefill
}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
