// Internal: cache element conversions on the device, bit-identical to
// kvcache/dtype.h (the same integer round-to-nearest-even algorithms).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kvcache/dtype.h"

namespace kvcache::cuda::detail {

__device__ inline float to_f32(float x) { return x; }
__device__ inline float to_f32(Half h) { return __half2float(__ushort_as_half(h.bits)); }
__device__ inline float to_f32(BFloat16 b) {
  return __uint_as_float(static_cast<std::uint32_t>(b.bits) << 16);
}

// f32_to_f16_bits of kvcache/dtype.h, on the device.
__device__ inline std::uint16_t f32_to_f16_rne(float value) {
  const std::uint32_t x = __float_as_uint(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {
    return static_cast<std::uint16_t>(sign | 0x7c00u |
                                      (abs > 0x7f800000u ? (0x200u | ((abs >> 13) & 0x3ffu)) : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    const float shifted = __fadd_rn(__uint_as_float(abs), 0.5f);
    return static_cast<std::uint16_t>(sign | (__float_as_uint(shifted) - 0x3f000000u));
  }
  const std::uint32_t mantissa_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mantissa_odd;
  return static_cast<std::uint16_t>(sign | (abs >> 13));
}

// f32_to_bf16_bits of kvcache/dtype.h, on the device.
__device__ inline std::uint16_t f32_to_bf16_rne(float value) {
  const std::uint32_t x = __float_as_uint(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

template <class T>
__device__ inline T from_f32(float v);
template <>
__device__ inline float from_f32<float>(float v) {
  return v;
}
template <>
__device__ inline Half from_f32<Half>(float v) {
  return Half{f32_to_f16_rne(v)};
}
template <>
__device__ inline BFloat16 from_f32<BFloat16>(float v) {
  return BFloat16{f32_to_bf16_rne(v)};
}

}  // namespace kvcache::cuda::detail
