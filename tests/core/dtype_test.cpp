// f16 / bf16 conversions against independent references, and parse_dtype.
#include "kvcache/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kvcache/error.h"
#include "test_util.h"

namespace {

using namespace kvcache;

// ---- independent slow references (double arithmetic, nearbyint = ties-to-even) ----

// Nearest binary16 to a float, round to nearest even, computed in double.
std::uint16_t ref_f32_to_f16(float x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7e00;  // any NaN; callers only compare NaN-ness
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(x) || a >= 65520.0) return sign | 0x7c00;
  if (a == 0.0) return sign;
  double quantum;
  if (a < std::ldexp(1.0, -14)) {
    quantum = std::ldexp(1.0, -24);  // subnormal spacing
  } else {
    int e;
    std::frexp(a, &e);  // a in [2^(e-1), 2^e)
    quantum = std::ldexp(1.0, (e - 1) - 10);
  }
  const double r = std::nearbyint(a / quantum);  // exact quotient; ties to even
  const double v = r * quantum;
  if (v >= 65536.0) return sign | 0x7c00;
  if (v == 0.0) return sign;
  if (v < std::ldexp(1.0, -14)) return sign | static_cast<std::uint16_t>(r);
  int e;
  const double m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  const int E = e - 1;
  const auto mant = static_cast<std::uint32_t>((m * 2.0 - 1.0) * 1024.0);
  return sign | static_cast<std::uint16_t>(((E + 15) << 10) | mant);
}

// Exact value of a binary16 bit pattern, in double.
double ref_f16_value(std::uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1f)
    return m ? std::numeric_limits<double>::quiet_NaN()
             : s * std::numeric_limits<double>::infinity();
  if (e == 0) return s * std::ldexp(static_cast<double>(m), -24);
  return s * std::ldexp(1.0 + m / 1024.0, e - 15);
}

// Nearest bfloat16 to a float, round to nearest even, in double.
std::uint16_t ref_f32_to_bf16(float x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7fc0;
  if (std::isinf(x)) return sign | 0x7f80;
  const double a = std::fabs(static_cast<double>(x));
  if (a == 0.0) return sign;
  double quantum;
  if (a < std::ldexp(1.0, -126)) {
    quantum = std::ldexp(1.0, -133);
  } else {
    int e;
    std::frexp(a, &e);
    quantum = std::ldexp(1.0, (e - 1) - 7);
  }
  const double v = std::nearbyint(a / quantum) * quantum;
  if (v >= std::ldexp(1.0, 128)) return sign | 0x7f80;
  const auto bits = std::bit_cast<std::uint32_t>(static_cast<float>(v));  // exact
  EXPECT_EQ(bits & 0xffffu, 0u);
  return sign | static_cast<std::uint16_t>(bits >> 16);
}

bool f16_is_nan(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool bf16_is_nan(std::uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0; }

float bits_f(std::uint32_t b) { return std::bit_cast<float>(b); }

void check_f16(float x) {
  const std::uint16_t got = f32_to_f16_bits(x);
  if (std::isnan(x)) {
    EXPECT_TRUE(f16_is_nan(got)) << std::hex << std::bit_cast<std::uint32_t>(x) << " -> " << got;
    return;
  }
  const std::uint16_t want = ref_f32_to_f16(x);
  ASSERT_EQ(got, want) << "x = " << x << " (0x" << std::hex << std::bit_cast<std::uint32_t>(x)
                       << ")";
#ifdef __FLT16_MAX__
  const auto hw = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
  ASSERT_EQ(got, hw) << "vs _Float16, x = " << x;
#endif
}

void check_bf16(float x) {
  const std::uint16_t got = f32_to_bf16_bits(x);
  if (std::isnan(x)) {
    EXPECT_TRUE(bf16_is_nan(got)) << std::hex << std::bit_cast<std::uint32_t>(x) << " -> " << got;
    return;
  }
  ASSERT_EQ(got, ref_f32_to_bf16(x))
      << "x = " << x << " (0x" << std::hex << std::bit_cast<std::uint32_t>(x) << ")";
}

TEST(DTypeF16, ReferenceItselfIsSane) {
  // Guard the oracle against being wrong in the same way as the code.
  EXPECT_EQ(ref_f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(ref_f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(ref_f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(ref_f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(ref_f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(ref_f32_to_f16(0.333333333f), 0x3555);
  EXPECT_EQ(ref_f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(ref_f32_to_bf16(-3.0f), 0xc040);
  EXPECT_EQ(ref_f16_value(0x7bff), 65504.0);
}

TEST(DTypeF16, AllPatternsDecodeExactlyAndRoundTrip) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float f = f16_bits_to_f32(h);
    const double want = ref_f16_value(h);
    if (f16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      ASSERT_TRUE(f16_is_nan(f32_to_f16_bits(f))) << std::hex << i;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << i;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << i;
    ASSERT_EQ(f32_to_f16_bits(f), h) << std::hex << i;
    ASSERT_EQ(from_float<Half>(to_float(Half{h})), Half{h}) << std::hex << i;
#ifdef __FLT16_MAX__
    ASSERT_EQ(f, static_cast<float>(std::bit_cast<_Float16>(h))) << std::hex << i;
#endif
  }
}

TEST(DTypeF16, EdgeCases) {
  EXPECT_EQ(f32_to_f16_bits(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16_bits(-65504.0f), 0xfbff);
  EXPECT_EQ(f32_to_f16_bits(65519.99f), 0x7bff);  // just below the overflow midpoint
  EXPECT_EQ(f32_to_f16_bits(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(f32_to_f16_bits(65520.0f), 0x7c00);  // midpoint ties to even = inf
  EXPECT_EQ(f32_to_f16_bits(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16_bits(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16_bits(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(f32_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16_bits(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(f16_is_nan(f32_to_f16_bits(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(f16_is_nan(f32_to_f16_bits(bits_f(0x7f800001u))));  // signalling, low payload
  EXPECT_TRUE(f16_is_nan(f32_to_f16_bits(bits_f(0xff800001u))));
  EXPECT_TRUE(f16_is_nan(f32_to_f16_bits(bits_f(0x7fffffffu))));
  const float tiny = std::ldexp(1.0f, -24);  // smallest subnormal
  EXPECT_EQ(f32_to_f16_bits(tiny), 0x0001);
  EXPECT_EQ(f32_to_f16_bits(-tiny), 0x8001);
  EXPECT_EQ(f32_to_f16_bits(tiny / 2), 0x0000);  // tie -> even (0)
  EXPECT_EQ(f32_to_f16_bits(-tiny / 2), 0x8000);
  EXPECT_EQ(f32_to_f16_bits(std::nextafter(tiny / 2, 1.0f)), 0x0001);  // just above half
  EXPECT_EQ(f32_to_f16_bits(std::nextafter(tiny / 2, 0.0f)), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(tiny * 1.5f), 0x0002);  // tie between 1 and 2 -> 2 (even)
  EXPECT_EQ(f32_to_f16_bits(tiny * 2.5f), 0x0002);  // tie between 2 and 3 -> 2 (even)
  EXPECT_EQ(f32_to_f16_bits(tiny * 3.5f), 0x0004);
  EXPECT_EQ(f32_to_f16_bits(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  // Largest subnormal + half a unit: tie between 0x3ff (odd) and 0x400 (even).
  EXPECT_EQ(f32_to_f16_bits(std::ldexp(1023.5f, -24)), 0x0400);
  // 1 + 2^-11 is halfway between 1 and 1+2^-10 -> even (1.0).
  EXPECT_EQ(f32_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even).
  EXPECT_EQ(f32_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16_bits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  // 2047.5 .. 2048: mantissa carry into the exponent.
  EXPECT_EQ(f32_to_f16_bits(2047.0f), 0x67ff);
  EXPECT_EQ(f32_to_f16_bits(2047.5f), 0x6800);  // tie -> even (2048)
  EXPECT_EQ(f32_to_f16_bits(2049.0f), 0x6800);  // tie between 2048 and 2050 -> 2048
  EXPECT_EQ(f32_to_f16_bits(2051.0f), 0x6802);  // tie between 2050 and 2052 -> 2052
  for (float x : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-10f, tiny, tiny / 2, 0.1f, -0.1f,
                  3.14159f, 1e-5f, 6.1e-5f, 2047.5f}) {
    check_f16(x);
  }
}

TEST(DTypeF16, AllMidpointsAndNeighbours) {
  // Every halfway point between consecutive finite f16 values (the ties),
  // and the floats one ulp either side: exhaustive over the rounding boundaries.
  for (std::uint32_t i = 0; i < 0x7bff; ++i) {
    const double lo = ref_f16_value(static_cast<std::uint16_t>(i));
    const double hi = ref_f16_value(static_cast<std::uint16_t>(i + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in f32
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f),
                    static_cast<float>(lo), static_cast<float>(hi)}) {
      check_f16(x);
      check_f16(-x);
    }
  }
}

TEST(DTypeF16, RandomFloats) {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<std::uint32_t> bits;
  // Random bit patterns (all exponents, NaNs and infinities included) ...
  for (int i = 0; i < 300000; ++i) check_f16(bits_f(bits(rng)));
  // ... and random floats concentrated on the f16 range.
  std::uniform_real_distribution<float> expo(-27.0f, 17.0f);
  for (int i = 0; i < 300000; ++i) {
    const float x = std::exp2(expo(rng)) * kvtest::nonzero(rng, 0.5f, 1.0f);
    check_f16(x);
  }
}

TEST(DTypeBF16, AllPatternsRoundTrip) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    const float f = bf16_bits_to_f32(b);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), i << 16);
    if (bf16_is_nan(b)) {
      ASSERT_TRUE(std::isnan(f));
      ASSERT_TRUE(bf16_is_nan(f32_to_bf16_bits(f))) << std::hex << i;
      continue;
    }
    ASSERT_EQ(f32_to_bf16_bits(f), b) << std::hex << i;
    ASSERT_EQ(from_float<BFloat16>(to_float(BFloat16{b})), BFloat16{b});
  }
}

TEST(DTypeBF16, EdgeCasesAndTies) {
  EXPECT_EQ(f32_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16_bits(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1).
  EXPECT_EQ(f32_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16_bits(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(f32_to_bf16_bits(bits_f(0x7f7f7fffu)), 0x7f7f);                // just below tie
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_bf16_bits(bits_f(0x00008000u)), 0x0000);  // subnormal tie -> even
  EXPECT_EQ(f32_to_bf16_bits(bits_f(0x00018000u)), 0x0002);
  EXPECT_EQ(f32_to_bf16_bits(bits_f(0x00008001u)), 0x0001);
  for (std::uint32_t nan : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu, 0x7f800100u}) {
    EXPECT_TRUE(bf16_is_nan(f32_to_bf16_bits(bits_f(nan)))) << std::hex << nan;
  }
}

TEST(DTypeBF16, RandomAndMidpoints) {
  std::mt19937_64 rng(777);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 300000; ++i) check_bf16(bits_f(bits(rng)));
  for (int i = 0; i < 100000; ++i) {
    // Exact ties and their neighbours: low 16 bits = 0x8000.
    const std::uint32_t b = (bits(rng) & 0xffff0000u) | 0x8000u;
    const float x = bits_f(b);
    check_bf16(x);
    if (std::isfinite(x)) {
      check_bf16(std::nextafter(x, 0.0f));
      check_bf16(std::nextafter(x, std::copysign(INFINITY, x)));
    }
  }
}

TEST(DTypeGeneric, SizesNamesAndVisit) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_name(DType::bf16), "bf16");
  static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);
  static_assert(dtype_of_v<float> == DType::f32);
  static_assert(dtype_of_v<Half> == DType::f16);
  static_assert(dtype_of_v<BFloat16> == DType::bf16);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    const std::size_t sz = visit_dtype(t, [](auto x) { return sizeof(x); });
    EXPECT_EQ(sz, dtype_size(t));
    const DType back = visit_dtype(t, [](auto x) { return dtype_of_v<decltype(x)>; });
    EXPECT_EQ(back, t);
  }
}

TEST(DTypeParse, AcceptsNamesAndAliases) {
  EXPECT_EQ(parse_dtype("f32"), DType::f32);
  EXPECT_EQ(parse_dtype("f16"), DType::f16);
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  // The spellings users type (the CLI and Python take the same parser).
  EXPECT_EQ(parse_dtype("fp32"), DType::f32);
  EXPECT_EQ(parse_dtype("float"), DType::f32);
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_EQ(parse_dtype("half"), DType::f16);
  EXPECT_EQ(parse_dtype("BF16"), DType::bf16);
  EXPECT_EQ(parse_dtype("Float16"), DType::f16);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
}

TEST(DTypeParse, RejectsOthersNamingTheString) {
  for (const char* bad : {"f64", "fp16x", "int4", "fp9", "float64", "halff", "bfloat"}) {
    KV_EXPECT_THROW(parse_dtype(bad), InvalidArgument, bad);
  }
  EXPECT_THROW(parse_dtype(""), InvalidArgument);
  KV_EXPECT_THROW(parse_dtype("qwerty7"), InvalidArgument, "qwerty7");
  // InvalidArgument is a kvcache::Error.
  EXPECT_THROW(parse_dtype("nope"), Error);
}

}  // namespace
