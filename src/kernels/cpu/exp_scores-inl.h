// e^x for the online softmax of the CPU attention kernels, per Highway
// target (included by attention_cpu-inl.h and attention_prefill-inl.h).
//
// ExpScores(df, x): e^x for x below ~88 (the kernels pass x <= 8), 0 below
// -104 and for NaN, as hn::Exp. The same reduction and polynomial as
// Highway's Exp (x = n ln2 + r, |r| <= ln2 / 2; e^r = 1 + r + r^2 P(r), its
// coefficients) evaluated by Horner, with 2^n applied in one step instead
// of two exponent-field multiplies:
//  - AVX-512: one vscalefps, 14 vector operations against ~26. Within 0.99
//    ulp of exp over every float in [-87, 9] (a one-off exhaustive check
//    against std::exp in double). Decode from L2, 1 thread: GQA 4
//    1.03-1.04x, MHA 1.026x; prefill (2048 tokens, GQA 4, 2 threads):
//    1.04x, 0.65 -> 0.67-0.68 of the FMA peak.
//  - AVX2: n << 23 added to the exponent field of the polynomial (an
//    integer add), 16 operations. Results whose exponent that would take
//    below the normal range (n < -125, x below about -86.99) are 0 instead
//    of e^x < 2^-125: in a softmax they meet a sum >= 1 and vanish anyway.
//    Within 1 ulp of exp above that (tests/kernels/exp_scores_test.cpp).
// Elsewhere hn::Exp.
#if defined(KVCACHE_KERNELS_CPU_EXP_SCORES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_EXP_SCORES_INL_H_
#undef KVCACHE_KERNELS_CPU_EXP_SCORES_INL_H_
#else
#define KVCACHE_KERNELS_CPU_EXP_SCORES_INL_H_
#endif

#include <type_traits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {

// e^r for x = n ln2 + r, |r| <= ln2 / 2, and n: Highway's Exp reduction and
// its coefficients, 1 + r + r^2 P(r) evaluated by Horner. The targets below
// differ only in how they apply 2^n.
template <class DF, class V = hwy::HWY_NAMESPACE::Vec<DF>>
HWY_INLINE V ExpReduced(DF df, V x, V& n) {
  namespace hn = hwy::HWY_NAMESPACE;
  n = hn::Round(hn::Mul(x, hn::Set(df, 1.44269504088896341f)));
  V r = hn::MulAdd(n, hn::Set(df, -0.693145751953125f), x);
  r = hn::MulAdd(n, hn::Set(df, -1.428606765330187045e-6f), r);
  V p = hn::Set(df, +0.000198527617612853646278381f);
  p = hn::MulAdd(p, r, hn::Set(df, +0.00139304355252534151077271f));
  p = hn::MulAdd(p, r, hn::Set(df, +0.00833336077630519866943359f));
  p = hn::MulAdd(p, r, hn::Set(df, +0.0416664853692054748535156f));
  p = hn::MulAdd(p, r, hn::Set(df, +0.166666671633720397949219f));
  p = hn::MulAdd(p, r, hn::Set(df, +0.5f));
  p = hn::MulAdd(p, hn::Mul(r, r), r);
  return hn::Add(p, hn::Set(df, 1.0f));
}

// Whole vectors of floats, where the intrinsics below apply.
template <class DF>
constexpr bool kFullF32 = std::is_same_v<DF, hwy::HWY_NAMESPACE::ScalableTag<float>>;

template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<DF> ExpScores(DF df, hwy::HWY_NAMESPACE::Vec<DF> x) {
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
  if constexpr (kFullF32<DF>) {
    using V = hwy::HWY_NAMESPACE::Vec<DF>;
    V n;
    const V p = ExpReduced(df, x, n);
    const __mmask16 in_range = _mm512_cmp_ps_mask(x.raw, _mm512_set1_ps(-104.0f), _CMP_GE_OQ);
    return V{_mm512_maskz_scalef_ps(in_range, p.raw, n.raw)};
  }
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  if constexpr (kFullF32<DF>) {
    using V = hwy::HWY_NAMESPACE::Vec<DF>;
    V n;
    const V p = ExpReduced(df, x, n);
    // p lies in [2^-0.5, 2^0.5], exponent field 126 or 127: adding n keeps
    // it normal for n >= -125. NaN and -inf fail the ordered compare.
    const __m256i scaled = _mm256_add_epi32(_mm256_castps_si256(p.raw),
                                            _mm256_slli_epi32(_mm256_cvtps_epi32(n.raw), 23));
    const __m256 in_range = _mm256_cmp_ps(n.raw, _mm256_set1_ps(-125.0f), _CMP_GE_OQ);
    return V{_mm256_and_ps(_mm256_castsi256_ps(scaled), in_range)};
  }
#endif
  return hwy::HWY_NAMESPACE::Exp(df, x);
}

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
