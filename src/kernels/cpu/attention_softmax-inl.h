// Per-worker buffers (Scratch) and the online softmax update of the CPU
// attention kernel's decode path, per Highway target (included through
// attention_cpu-inl.h).
#if defined(KVCACHE_KERNELS_CPU_ATTENTION_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ATTENTION_SOFTMAX_INL_H_
#undef KVCACHE_KERNELS_CPU_ATTENTION_SOFTMAX_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ATTENTION_SOFTMAX_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "kernels/cpu/attention_blocks-inl.h"
#include "kernels/cpu/attention_dot_bf16-inl.h"
#include "kernels/cpu/exp_scores-inl.h"
#include "kernels/cpu/round_bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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
// From L2, 1 thread: GQA 4 1.04-1.05x, MHA 1.005-1.02x. The
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

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_ATTENTION_SOFTMAX_INL_H_ (per target)
