// kvcache/dtype.h — element types of the cache and exact conversions.
//
// The cache stores K/V as f32, f16 (IEEE binary16), bf16 (bfloat16) or one of
// three 8-bit types (docs/quantization.md):
//  fp8_e4m3  OCP FP8 E4M3 (bias 7, no infinities, NaN S.1111.111, max 448),
//  fp8_e5m2  OCP FP8 E5M2 (bias 15, IEEE-like: inf, NaN, max 57344),
//            both with static per-layer, per-KV-head float scales for K and
//            V (kv_scales.h): stored code = fp8(x / scale);
//  int8      symmetric int8 in [-127, 127] with one float scale per (token,
//            KV head), absmax / 127, computed at write time and stored in the
//            page beside the values (cache_desc.h gives the in-page layout).
// The storage types are plain structs (`Half`, `BFloat16`, `Fp8E4M3`,
// `Fp8E5M2`, `Int8`) so they are trivially copyable and portable; convert
// with `to_float` / `from_float<T>` (for the 8-bit types these are the raw,
// unscaled codes). Conversions float -> 16 / 8 bit round to nearest, ties to
// even, handle subnormals and NaN (a NaN stays a NaN); the 16-bit types
// overflow to infinity, the fp8 types saturate to their largest finite value
// (infinities too, as vLLM's and NVIDIA's saturating conversions do). Narrow
// -> float is exact. All functions are free of global state and thread-safe.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace kvcache {

enum class DType : std::uint8_t { f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8 };

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

// OCP FP8 E4M3 storage (the code's bits).
struct Fp8E4M3 {
  std::uint8_t bits;
  friend constexpr bool operator==(Fp8E4M3, Fp8E4M3) = default;
};

// OCP FP8 E5M2 storage (the top byte of the binary16 of the same value).
struct Fp8E5M2 {
  std::uint8_t bits;
  friend constexpr bool operator==(Fp8E5M2, Fp8E5M2) = default;
};

// Symmetric int8 storage: value * its (token, head) scale is the number.
struct Int8 {
  std::int8_t value;
  friend constexpr bool operator==(Int8, Int8) = default;
};

// Bytes of one element (for int8 the values only: its scales are counted
// by KVCacheParams::bytes_per_token and CacheDesc::block_elements).
constexpr std::size_t dtype_size(DType t) {
  return t == DType::f32 ? 4 : (t == DType::f16 || t == DType::bf16) ? 2 : 1;
}

// Whether t is one of the DType values (an enum may hold any byte).
constexpr bool is_dtype(DType t) { return t <= DType::int8; }
// The 8-bit types.
constexpr bool is_quantized(DType t) { return t >= DType::fp8_e4m3 && t <= DType::int8; }
// The fp8 types: static per-layer, per-KV-head scales (CacheDesc::head_scales).
constexpr bool is_fp8(DType t) { return t == DType::fp8_e4m3 || t == DType::fp8_e5m2; }
// int8: one float scale per (token, KV head) stored in the page.
constexpr bool has_page_scales(DType t) { return t == DType::int8; }
// Largest finite magnitude of an fp8 type (448, 57344); 127 for int8.
constexpr float quantized_max(DType t) {
  return t == DType::fp8_e4m3 ? 448.0f : t == DType::fp8_e5m2 ? 57344.0f : 127.0f;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::fp8_e4m3:
      return "fp8_e4m3";
    case DType::fp8_e5m2:
      return "fp8_e5m2";
    case DType::int8:
      return "int8";
  }
  return "?";
}

// The names parse_dtype takes, for help texts and messages.
inline constexpr std::string_view kDTypeNames =
    "f32 (fp32, float32, float), f16 (fp16, float16, half), bf16 (bfloat16), fp8_e4m3 (fp8, "
    "e4m3, float8_e4m3fn), fp8_e5m2 (e5m2, float8_e5m2), int8 (i8)";

// Parses a dtype name, in any case: "f32" | "fp32" | "float32" | "float",
// "f16" | "fp16" | "float16" | "half", "bf16" | "bfloat16", "fp8_e4m3" |
// "fp8" | "e4m3" | "float8_e4m3fn", "fp8_e5m2" | "e5m2" | "float8_e5m2",
// "int8" | "i8" (kDTypeNames).
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

// ---- fp8 (OCP 8-bit floating point) ----------------------------------------
// Encoding: f32 bits, sign apart; NaN -> S.1111111 (a NaN code); at or past
// the largest finite value (infinity included) -> the largest finite code;
// below the smallest normal the FPU rounds (adding 2^14 (E4M3) or 2^7 (E5M2)
// puts the format's subnormal unit at the f32 ulp); normals round the
// mantissa to nearest even and rebias the exponent (127 -> 7 or 15).

inline std::uint8_t f32_to_e4m3_bits(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;   // NaN
  if (abs >= 0x43e00000u) return sign | 0x7eu;  // >= 448: saturate
  if (abs < 0x3c800000u) {                      // < 2^-6: subnormal unit 2^-9
    const float shifted = std::bit_cast<float>(abs) + 16384.0f;
    return sign | static_cast<std::uint8_t>(std::bit_cast<std::uint32_t>(shifted) - 0x46800000u);
  }
  const std::uint32_t rounded = abs + 0x7ffffu + ((abs >> 20) & 1u);
  return sign | static_cast<std::uint8_t>((rounded >> 20) - (120u << 3));
}

inline float e4m3_bits_to_f32(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t exponent = (b >> 3) & 0xfu;
  const std::uint32_t mantissa = b & 7u;
  if (exponent == 0xfu && mantissa == 7u) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (exponent == 0) {  // zero / subnormal: mantissa * 2^-9, exact
    const float magnitude = static_cast<float>(mantissa) * 0.001953125f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

inline std::uint8_t f32_to_e5m2_bits(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;   // NaN
  if (abs >= 0x47600000u) return sign | 0x7bu;  // >= 57344: saturate
  if (abs < 0x38800000u) {                      // < 2^-14: subnormal unit 2^-16
    const float shifted = std::bit_cast<float>(abs) + 128.0f;
    return sign | static_cast<std::uint8_t>(std::bit_cast<std::uint32_t>(shifted) - 0x43000000u);
  }
  const std::uint32_t rounded = abs + 0xfffffu + ((abs >> 21) & 1u);
  return sign | static_cast<std::uint8_t>((rounded >> 21) - (112u << 2));
}

// E5M2 is the top byte of binary16.
inline float e5m2_bits_to_f32(std::uint8_t b) {
  return f16_bits_to_f32(static_cast<std::uint16_t>(b << 8));
}

// ---- int8 -------------------------------------------------------------------
// A (token, head) row x quantizes with scale = absmax(x) / 127 and codes
// nearest_even(x * (127 / absmax)) clamped to [-127, 127]; an all-zero row
// gets scale 0 and zero codes. The number is code * scale. The kernels
// compute exactly these float operations. Rows must be finite (a NaN or
// infinity gives unspecified codes, never undefined behaviour).

inline float int8_inverse_scale(float absmax) { return absmax > 0.0f ? 127.0f / absmax : 0.0f; }
inline float int8_scale(float absmax) { return absmax / 127.0f; }

inline std::int8_t f32_to_int8(float scaled) {
  const float r = std::nearbyint(scaled);
  const float c = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
  return c == c ? static_cast<std::int8_t>(c) : std::int8_t{0};
}

// ---- generic helpers used by kernels ----------------------------------------

inline float to_float(float v) { return v; }
inline float to_float(Half v) { return f16_bits_to_f32(v.bits); }
inline float to_float(BFloat16 v) { return bf16_bits_to_f32(v.bits); }
inline float to_float(Fp8E4M3 v) { return e4m3_bits_to_f32(v.bits); }
inline float to_float(Fp8E5M2 v) { return e5m2_bits_to_f32(v.bits); }
inline float to_float(Int8 v) { return static_cast<float>(v.value); }

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
template <>
inline Fp8E4M3 from_float<Fp8E4M3>(float v) {
  return Fp8E4M3{f32_to_e4m3_bits(v)};
}
template <>
inline Fp8E5M2 from_float<Fp8E5M2>(float v) {
  return Fp8E5M2{f32_to_e5m2_bits(v)};
}
// The code of an already scaled value (x * int8_inverse_scale).
template <>
inline Int8 from_float<Int8>(float v) {
  return Int8{f32_to_int8(v)};
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
template <>
inline constexpr bool is_cache_element_v<Fp8E4M3> = true;
template <>
inline constexpr bool is_cache_element_v<Fp8E5M2> = true;
template <>
inline constexpr bool is_cache_element_v<Int8> = true;

template <class T>
concept CacheElement = is_cache_element_v<T>;

template <CacheElement T>
inline constexpr DType dtype_of_v = std::is_same_v<T, float>      ? DType::f32
                                    : std::is_same_v<T, Half>     ? DType::f16
                                    : std::is_same_v<T, BFloat16> ? DType::bf16
                                    : std::is_same_v<T, Fp8E4M3>  ? DType::fp8_e4m3
                                    : std::is_same_v<T, Fp8E5M2>  ? DType::fp8_e5m2
                                                                  : DType::int8;

// Calls f(T{}) with T the element type of `dtype` (float, Half, BFloat16,
// Fp8E4M3, Fp8E5M2 or Int8).
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f16:
      return f(Half{});
    case DType::bf16:
      return f(BFloat16{});
    case DType::fp8_e4m3:
      return f(Fp8E4M3{});
    case DType::fp8_e5m2:
      return f(Fp8E5M2{});
    case DType::int8:
      return f(Int8{});
    case DType::f32:
      break;
  }
  return f(float{});
}

}  // namespace kvcache
