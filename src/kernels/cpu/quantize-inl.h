// 8-bit encode of whole vectors, per Highway target (included by
// store_kv_cpu.cpp and store_q8-inl.h; the attention kernels decode codes in
// code_types.h). Bit-identical to dtype.h's scalar conversions (the same
// integer formulas), tested against them over every code.
#if defined(KVCACHE_KERNELS_CPU_QUANTIZE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_QUANTIZE_INL_H_
#undef KVCACHE_KERNELS_CPU_QUANTIZE_INL_H_
#else
#define KVCACHE_KERNELS_CPU_QUANTIZE_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kvcache/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// fp8 codes of v (already divided by the scale), as int32 lanes 0..255:
// f32_to_e4m3_bits / f32_to_e5m2_bits lane by lane.
template <DType kType, class DF>
HWY_INLINE hn::Vec<hn::Rebind<std::int32_t, DF>> EncodeFp8(DF df, hn::Vec<DF> v) {
  const hn::Rebind<std::int32_t, DF> di;
  constexpr bool e4 = kType == DType::fp8_e4m3;
  constexpr int kShift = e4 ? 20 : 21;
  const auto x = hn::BitCast(di, v);
  const auto sign = hn::And(hn::ShiftRight<24>(x), hn::Set(di, 0x80));
  const auto a = hn::And(x, hn::Set(di, 0x7fffffff));
  // Below the smallest normal: the FPU rounds at the subnormal unit.
  const float magic = e4 ? 16384.0f : 128.0f;
  const auto sub = hn::Sub(hn::BitCast(di, hn::Add(hn::BitCast(df, a), hn::Set(df, magic))),
                           hn::Set(di, e4 ? 0x46800000 : 0x43000000));
  const auto odd = hn::And(hn::ShiftRight<kShift>(a), hn::Set(di, 1));
  const auto rounded = hn::Add(hn::Add(a, hn::Set(di, (1 << (kShift - 1)) - 1)), odd);
  const auto normal = hn::Sub(hn::ShiftRight<kShift>(rounded), hn::Set(di, e4 ? 960 : 448));
  auto code = hn::IfThenElse(hn::Lt(a, hn::Set(di, e4 ? 0x3c800000 : 0x38800000)), sub, normal);
  code = hn::IfThenElse(hn::Lt(a, hn::Set(di, e4 ? 0x43e00000 : 0x47600000)), code,
                        hn::Set(di, e4 ? 0x7e : 0x7b));
  code = hn::IfThenElse(hn::Gt(a, hn::Set(di, 0x7f800000)), hn::Set(di, 0x7f), code);
  return hn::Or(code, sign);
}

// Quantises n values of src (times `inverse`) into codes at dst.
template <DType kType>
HWY_INLINE void EncodeRowQ8(const float* src, std::uint8_t* dst, std::size_t n, float inverse) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<std::int32_t, decltype(df)> di;
  const std::size_t kN = hn::Lanes(df);
  const auto vinv = hn::Set(df, inverse);
  std::size_t i = 0;
  for (; i + kN <= n; i += kN) {
    const auto v = hn::Mul(hn::LoadU(df, src + i), vinv);
    if constexpr (kType == DType::int8) {
      const auto q = hn::Min(hn::Max(hn::NearestInt(v), hn::Set(di, -127)), hn::Set(di, 127));
      hn::StoreU(hn::DemoteTo(hn::Rebind<std::int8_t, decltype(df)>(), q),
                 hn::Rebind<std::int8_t, decltype(df)>(), reinterpret_cast<std::int8_t*>(dst + i));
    } else {
      const auto q = EncodeFp8<kType>(df, v);
      hn::StoreU(hn::DemoteTo(hn::Rebind<std::uint8_t, decltype(df)>(), q),
                 hn::Rebind<std::uint8_t, decltype(df)>(), dst + i);
    }
  }
  for (; i < n; ++i) {
    const float v = src[i] * inverse;
    if constexpr (kType == DType::int8) {
      dst[i] = static_cast<std::uint8_t>(f32_to_int8(v));
    } else if constexpr (kType == DType::fp8_e4m3) {
      dst[i] = f32_to_e4m3_bits(v);
    } else {
      dst[i] = f32_to_e5m2_bits(v);
    }
  }
}

// The largest |x| of n values.
HWY_INLINE float AbsMax(const float* src, std::size_t n) {
  const hn::ScalableTag<float> df;
  const std::size_t kN = hn::Lanes(df);
  auto m = hn::Zero(df);
  std::size_t i = 0;
  for (; i + kN <= n; i += kN) m = hn::Max(m, hn::Abs(hn::LoadU(df, src + i)));
  float r = hn::GetLane(hn::MaxOfLanes(df, m));
  for (; i < n; ++i) r = std::max(r, src[i] < 0.0f ? -src[i] : src[i]);
  return r;
}

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_QUANTIZE_INL_H_ (per target)
