// ExpScores (kernels/cpu/exp_scores-inl.h) of the active Highway target over a
// span: the entry point its tests use to compare it with std::exp.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>

#include "kernels/cpu/kernel_common.h"
#include "kvcache/error.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/exp_scores.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"
#include "kernels/cpu/exp_scores-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void ExpScoresSpan(const float* x, float* out, std::size_t n) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(ExpScores(df, hn::LoadU(df, x + i)), df, out + i);
  if (i < n) {
    HWY_ALIGN float tail[hn::MaxLanes(df)] = {};
    std::copy(x + i, x + n, tail);
    hn::Store(ExpScores(df, hn::Load(df, tail)), df, tail);
    std::copy(tail, tail + (n - i), out + i);
  }
}

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache::kernels {
HWY_EXPORT(ExpScoresSpan);

void exp_scores(std::span<const float> x, std::span<float> out) {
  if (out.size() != x.size()) {
    throw InvalidArgument("exp_scores: out holds " + std::to_string(out.size()) +
                          " floats, x holds " + std::to_string(x.size()));
  }
  HWY_DYNAMIC_DISPATCH(ExpScoresSpan)(x.data(), out.data(), x.size());
}

}  // namespace kvcache::kernels
#endif  // HWY_ONCE
