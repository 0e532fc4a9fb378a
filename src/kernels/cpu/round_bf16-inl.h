// Rounding to bf16 for AttentionPrecision::bf16 (kernels/options.h), per
// Highway target (included by attention_cpu-inl.h and attention_prefill-inl.h).
//
// RoundToBF16(df, v): each lane rounded to the nearest bf16, ties to even,
// returned as f32 (the low 16 bits zero), the value f32_to_bf16_bits
// (kvcache/dtype.h) gives for every lane that is not NaN. Products of such
// values with bf16 K/V elements are exact in fp32.
// DotBF16(acc, a, b) (AVX-512 targets, kHaveDotBF16): bf16 pair products.
#if defined(KVCACHE_KERNELS_CPU_ROUND_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ROUND_BF16_INL_H_
#undef KVCACHE_KERNELS_CPU_ROUND_BF16_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ROUND_BF16_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {

template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<DF> RoundToBF16(DF df, hwy::HWY_NAMESPACE::Vec<DF> v) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::BitCast(du, v);
  // Adding 0x7fff plus the lowest kept bit carries into the kept bits
  // exactly when the dropped half is above a tie, or a tie with the kept
  // value odd.
  const auto bias =
      hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u)));
  return hn::BitCast(df, hn::And(hn::Add(bits, bias), hn::Set(du, 0xffff0000u)));
}

// p[0, n) rounded in place (n a multiple of the lane count, p aligned).
template <class DF>
HWY_INLINE void RoundRowToBF16(DF df, float* p, std::size_t n) {
  namespace hn = hwy::HWY_NAMESPACE;
  for (std::size_t i = 0; i < n; i += hn::Lanes(df))
    hn::Store(RoundToBF16(df, hn::Load(df, p + i)), df, p + i);
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG)
// Whether this target has DotBF16 (the processor must still have
// AVX512-BF16: cpu_has_avx512_bf16() in kernel_common.h).
constexpr bool kHaveDotBF16 = true;
// acc lane i += a.bf16[2i] * b.bf16[2i] + a.bf16[2i + 1] * b.bf16[2i + 1]
// (vdpbf16ps: exact products summed in fp32, bf16 denormals as zero). An
// asm statement: the AVX-512 targets are compiled without avx512bf16, which
// only some of their processors have.
HWY_INLINE hwy::HWY_NAMESPACE::Vec512<float> DotBF16(hwy::HWY_NAMESPACE::Vec512<float> acc,
                                                     hwy::HWY_NAMESPACE::Vec512<std::uint32_t> a,
                                                     hwy::HWY_NAMESPACE::Vec512<std::uint32_t> b) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc.raw) : "v"(a.raw), "v"(b.raw));
  return acc;
}
#else
constexpr bool kHaveDotBF16 = false;
#endif

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
