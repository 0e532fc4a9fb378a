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

// The 8-bit codes as numbers (before the scale): every code exactly as
// kvcache/dtype.h's e4m3_bits_to_f32 / e5m2_bits_to_f32 / the int8 value,
// with full-rate integer and float operations instead of the quarter-rate
// conversion instructions (attention reads 16 codes per 16-byte vector).
// fp8: sign and exponent-mantissa bits placed in an f32 whose exponent bias
// is 127, times 2^(127 - bias): exact for normals and subnormals (f32
// denormal inputs are not flushed: no fast-math); NaN (and E5M2's
// infinities) selected apart. int8: (2^23 + (c + 128)) - (2^23 + 128).
__device__ __forceinline__ float e4m3_to_f32(std::uint32_t b) {
  const std::uint32_t sign = (b & 0x80u) << 24;
  if ((b & 0x7fu) == 0x7fu) return __uint_as_float(sign | 0x7fc00000u);
  return __uint_as_float(sign | ((b & 0x7fu) << 20)) * 0x1p120f;
}
__device__ __forceinline__ float e5m2_to_f32(std::uint32_t b) {
  const std::uint32_t sign = (b & 0x80u) << 24;
  if ((b & 0x7cu) == 0x7cu) return __uint_as_float(sign | 0x7f800000u | ((b & 3u) << 21));
  return __uint_as_float(sign | ((b & 0x7fu) << 21)) * 0x1p112f;
}
__device__ __forceinline__ float i8_to_f32(std::uint32_t b) {
  return __uint_as_float(0x4b000000u | ((b & 0xffu) ^ 0x80u)) - 8388736.0f;
}
__device__ inline float to_f32(Fp8E4M3 c) { return e4m3_to_f32(c.bits); }
__device__ inline float to_f32(Fp8E5M2 c) { return e5m2_to_f32(c.bits); }
__device__ inline float to_f32(Int8 c) { return i8_to_f32(static_cast<std::uint8_t>(c.value)); }

// f32_to_e4m3_bits / f32_to_e5m2_bits / f32_to_int8 of kvcache/dtype.h, on
// the device (the same integer and float operations, so the same codes).
__device__ inline std::uint8_t f32_to_e4m3(float value) {
  const std::uint32_t x = __float_as_uint(value);
  const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;
  if (abs >= 0x43e00000u) return sign | 0x7eu;
  if (abs < 0x3c800000u) {
    const float shifted = __fadd_rn(__uint_as_float(abs), 16384.0f);
    return sign | static_cast<std::uint8_t>(__float_as_uint(shifted) - 0x46800000u);
  }
  const std::uint32_t rounded = abs + 0x7ffffu + ((abs >> 20) & 1u);
  return sign | static_cast<std::uint8_t>((rounded >> 20) - (120u << 3));
}
__device__ inline std::uint8_t f32_to_e5m2(float value) {
  const std::uint32_t x = __float_as_uint(value);
  const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;
  if (abs >= 0x47600000u) return sign | 0x7bu;
  if (abs < 0x38800000u) {
    const float shifted = __fadd_rn(__uint_as_float(abs), 128.0f);
    return sign | static_cast<std::uint8_t>(__float_as_uint(shifted) - 0x43000000u);
  }
  const std::uint32_t rounded = abs + 0xfffffu + ((abs >> 21) & 1u);
  return sign | static_cast<std::uint8_t>((rounded >> 21) - (112u << 2));
}
__device__ inline std::int8_t f32_to_i8(float scaled) {
  const float r = rintf(scaled);
  const float c = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
  return c == c ? static_cast<std::int8_t>(c) : std::int8_t{0};
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
