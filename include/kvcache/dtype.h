// kvcache/dtype.h — element types of the cache and exact conversions.
//
// The cache stores K/V as f32, f16 (IEEE binary16) or bf16 (bfloat16). The
// 16-bit types are plain 2-byte structs (`Half`, `BFloat16`) so they are
// trivially copyable and portable; convert with `to_float` / `from_float<T>`.
// Conversions float -> 16 bit round to nearest, ties to even, handle
// subnormals, infinities and NaN (a NaN stays a NaN). 16 bit -> float is exact.
// All functions are constexpr-free of global state and thread-safe.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace kvcache {

enum class DType : std::uint8_t { f32, f16, bf16 };

// IEEE 754 binary16 storage.
struct Half {
  std::uint16_t bits;
  friend constexpr bool operator==(Half, Half) = default;
};

// bfloat16 storage (the top 16 bits of an f32).
struct BFloat16 {
  std::uint16_t bits;
  friend constexpr bool operator==(BFloat16, BFloat16) = default;
};

// Bytes of one element.
constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
  }
  return "?";
}

// The names parse_dtype takes, for help texts and messages.
inline constexpr std::string_view kDTypeNames =
    "f32 (fp32, float32, float), f16 (fp16, float16, half), bf16 (bfloat16)";

// Parses a dtype name, in any case: "f32" | "fp32" | "float32" | "float",
// "f16" | "fp16" | "float16" | "half", "bf16" | "bfloat16" (kDTypeNames).
// Throws kvcache::InvalidArgument naming the string and the names otherwise.
DType parse_dtype(std::string_view name);

// ---- binary16 ---------------------------------------------------------------

inline std::uint16_t f32_to_f16_bits(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN; keep NaN quiet and non-zero
    return static_cast<std::uint16_t>(sign | 0x7c00u |
                                      (abs > 0x7f800000u ? (0x200u | ((abs >> 13) & 0x3ffu)) : 0u));
  }
  if (abs >= 0x477ff000u) {  // >= 65520 rounds to infinity
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // result is subnormal or zero: let the FPU round
    // Adding 0.5 puts the f16 subnormal unit (2^-24) at the f32 ulp of 0.5,
    // so the hardware's round-to-nearest-even does the rounding for us.
    const float shifted = std::bit_cast<float>(abs) + 0.5f;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(shifted) - 0x3f000000u));
  }
  const std::uint32_t mantissa_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mantissa_odd;  // rebias exponent (127 -> 15) and round
  return static_cast<std::uint16_t>(sign | (abs >> 13));
}

inline float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) {  // inf / NaN
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {  // zero / subnormal: mantissa * 2^-24, exact in f32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// ---- bfloat16 ---------------------------------------------------------------

inline std::uint16_t f32_to_bf16_bits(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: truncate, force quiet bit
    return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  }
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

inline float bf16_bits_to_f32(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// ---- generic helpers used by kernels ----------------------------------------

inline float to_float(float v) { return v; }
inline float to_float(Half v) { return f16_bits_to_f32(v.bits); }
inline float to_float(BFloat16 v) { return bf16_bits_to_f32(v.bits); }

template <class T>
T from_float(float v);
template <>
inline float from_float<float>(float v) {
  return v;
}
template <>
inline Half from_float<Half>(float v) {
  return Half{f32_to_f16_bits(v)};
}
template <>
inline BFloat16 from_float<BFloat16>(float v) {
  return BFloat16{f32_to_bf16_bits(v)};
}

// The element type <-> DType mapping.
template <class T>
inline constexpr bool is_cache_element_v = false;
template <>
inline constexpr bool is_cache_element_v<float> = true;
template <>
inline constexpr bool is_cache_element_v<Half> = true;
template <>
inline constexpr bool is_cache_element_v<BFloat16> = true;

template <class T>
concept CacheElement = is_cache_element_v<T>;

template <CacheElement T>
inline constexpr DType dtype_of_v = std::is_same_v<T, float>  ? DType::f32
                                    : std::is_same_v<T, Half> ? DType::f16
                                                              : DType::bf16;

// Calls f(T{}) with T the element type of `dtype` (float, Half or BFloat16).
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f16:
      return f(Half{});
    case DType::bf16:
      return f(BFloat16{});
    case DType::f32:
      break;
  }
  return f(float{});
}

}  // namespace kvcache
