// The CPU attention kernel for fp8_e5m2 caches, one instantiation per Highway
// target: the tile loops of kernels/cpu/attention_cpu-inl.h over 8-bit codes
// (code_types.h), widened to f32 in registers. Each element type has a
// translation unit of its own so that a parallel build compiles them at once.

#include "kernels/cpu/code_types.h"
#include "kernels/cpu/kernel_common.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention_e5m2.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"
#include "kernels/cpu/attention_cpu-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
void AttentionE5M2(const AttentionCtx& c) { RunAttention<CodeE5M2>(c); }
}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache::kernels {
HWY_EXPORT(AttentionE5M2);
void attention_e5m2(const AttentionCtx& c) { HWY_DYNAMIC_DISPATCH(AttentionE5M2)(c); }
}  // namespace kvcache::kernels
#endif  // HWY_ONCE
