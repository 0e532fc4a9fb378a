// The CPU attention kernel for f16 caches, one instantiation per Highway
// target. The kernel is kernels/cpu/attention_cpu-inl.h; each element type has
// a translation unit of its own so that a parallel build compiles them at once.

#include "kernels/cpu/kernel_common.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention_f16.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"
#include "kernels/cpu/attention_cpu-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
void AttentionF16(const AttentionCtx& c) { RunAttention<hwy::float16_t>(c); }
}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache::kernels {
HWY_EXPORT(AttentionF16);
void attention_f16(const AttentionCtx& c) { HWY_DYNAMIC_DISPATCH(AttentionF16)(c); }
}  // namespace kvcache::kernels
#endif  // HWY_ONCE
