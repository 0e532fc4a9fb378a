// The 8-bit storage types: fp8 conversions exhaustive over all 256 codes
// against a decoder and a nearest-value encoder written from the OCP format
// definitions (not from dtype.h's bit formulas), int8 rounding, names,
// sizes, params and KVScales validation.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kvcache/kv_scales.h"
#include "kvcache/kvcache.h"

namespace {

using kvcache::DType;

struct Format {
  int exponent_bits, mantissa_bits, bias;
  bool ieee_specials;  // E5M2: all-ones exponent is inf / NaN; E4M3: only S.1111.111 is NaN
};
constexpr Format kE4M3{4, 3, 7, false};
constexpr Format kE5M2{5, 2, 15, true};

// The value of code c by the format's definition (NaN for the NaN codes).
double decode_by_definition(const Format& f, unsigned c) {
  const int sign = (c >> 7) & 1;
  const unsigned e = (c >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1);
  const unsigned m = c & ((1u << f.mantissa_bits) - 1);
  const unsigned e_max = (1u << f.exponent_bits) - 1;
  const unsigned m_max = (1u << f.mantissa_bits) - 1;
  double v;
  if (f.ieee_specials && e == e_max) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::nan("");
  } else if (!f.ieee_specials && e == e_max && m == m_max) {
    v = std::nan("");
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m) / (1 << f.mantissa_bits), 1 - f.bias);
  } else {
    v = std::ldexp(1.0 + static_cast<double>(m) / (1 << f.mantissa_bits), int(e) - f.bias);
  }
  return sign ? -v : v;
}

// The code a saturating round-to-nearest-even conversion gives x: the
// nearest finite code value (ties to the even code), the largest finite
// value at or past it (infinities too), a NaN code for NaN.
unsigned encode_by_definition(const Format& f, float x) {
  if (std::isnan(x)) return 0x7f | (std::signbit(x) ? 0x80u : 0u);
  const unsigned sign = std::signbit(x) ? 0x80u : 0u;
  const double a = std::fabs(static_cast<double>(x));
  unsigned best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (unsigned c = 0; c < 0x80; ++c) {
    const double v = decode_by_definition(f, c);
    if (!std::isfinite(v)) continue;
    const double err = std::fabs(v - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  double max_finite = 0;
  unsigned max_code = 0;
  for (unsigned c = 0; c < 0x80; ++c) {
    const double v = decode_by_definition(f, c);
    if (std::isfinite(v) && v > max_finite) max_finite = v, max_code = c;
  }
  if (a >= max_finite) best = max_code;
  return best | sign;
}

float decode(DType t, unsigned c) {
  return t == DType::fp8_e4m3 ? kvcache::e4m3_bits_to_f32(static_cast<std::uint8_t>(c))
                              : kvcache::e5m2_bits_to_f32(static_cast<std::uint8_t>(c));
}
unsigned encode(DType t, float x) {
  return t == DType::fp8_e4m3 ? kvcache::f32_to_e4m3_bits(x) : kvcache::f32_to_e5m2_bits(x);
}

void expect_same(double want, float got, unsigned code) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "code " << code;
  } else {
    EXPECT_EQ(want, static_cast<double>(got)) << "code " << code;
  }
}

class Fp8 : public ::testing::TestWithParam<DType> {
 protected:
  const Format& format() const { return GetParam() == DType::fp8_e4m3 ? kE4M3 : kE5M2; }
};

TEST_P(Fp8, DecodeEveryCodeExactly) {
  for (unsigned c = 0; c < 256; ++c)
    expect_same(decode_by_definition(format(), c), decode(GetParam(), c), c);
}

TEST_P(Fp8, EveryFiniteCodeRoundTrips) {
  for (unsigned c = 0; c < 256; ++c) {
    const float v = decode(GetParam(), c);
    if (!std::isfinite(v)) continue;
    if (v == 0.0f) {
      EXPECT_EQ(encode(GetParam(), v), c) << "signed zero " << c;
      continue;
    }
    EXPECT_EQ(encode(GetParam(), v), c) << "code " << c;
  }
}

// Midpoints between neighbouring codes (ties to even), one float either
// side of them, and values past the largest finite one.
TEST_P(Fp8, MidpointsTiesAndSaturationMatchTheDefinition) {
  const DType t = GetParam();
  std::vector<float> values;
  for (unsigned c = 0; c + 1 < 0x80; ++c) {
    const double lo = decode_by_definition(format(), c), hi = decode_by_definition(format(), c + 1);
    if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);  // exact in f32
    values.insert(values.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)});
  }
  const float inf = std::numeric_limits<float>::infinity();
  values.insert(values.end(), {inf, 1e30f, 464.0f, 480.0f, 500.0f, 57344.0f, 61440.0f, 70000.0f,
                               std::numeric_limits<float>::denorm_min(), 1e-30f});
  for (float v : values) {
    for (float s : {v, -v}) {
      EXPECT_EQ(encode(t, s), encode_by_definition(format(), s)) << "value " << s;
    }
  }
  EXPECT_EQ(encode(t, inf), t == DType::fp8_e4m3 ? 0x7eu : 0x7bu);  // saturating
  EXPECT_EQ(encode(t, -inf), t == DType::fp8_e4m3 ? 0xfeu : 0xfbu);
  EXPECT_TRUE(std::isnan(decode(t, encode(t, std::nanf("")))));  // NaN kept
}

TEST_P(Fp8, RandomFloatsOverTheWholeRange) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 20000; ++i) {
    // Exponents where the format lives (2^-20 .. 2^17), every mantissa.
    const std::uint32_t b = (bits(rng) & 0x807fffffu) | ((107u + bits(rng) % 38u) << 23);
    const float x = std::bit_cast<float>(b);
    ASSERT_EQ(encode(GetParam(), x), encode_by_definition(format(), x)) << "value " << x;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8, ::testing::Values(DType::fp8_e4m3, DType::fp8_e5m2),
                         [](const auto& info) {
                           return std::string(kvcache::dtype_name(info.param));
                         });

TEST(Int8, RoundsToNearestEvenAndClamps) {
  EXPECT_EQ(kvcache::f32_to_int8(0.5f), 0);
  EXPECT_EQ(kvcache::f32_to_int8(1.5f), 2);
  EXPECT_EQ(kvcache::f32_to_int8(-2.5f), -2);
  EXPECT_EQ(kvcache::f32_to_int8(126.6f), 127);
  EXPECT_EQ(kvcache::f32_to_int8(300.0f), 127);
  EXPECT_EQ(kvcache::f32_to_int8(-300.0f), -127);
  EXPECT_EQ(kvcache::f32_to_int8(std::nanf("")), 0);
  EXPECT_EQ(kvcache::int8_inverse_scale(0.0f), 0.0f);
  EXPECT_FLOAT_EQ(kvcache::int8_scale(127.0f), 1.0f);
}

TEST(QuantDtypes, NamesSizesAndParams) {
  EXPECT_EQ(kvcache::parse_dtype("FP8_E4M3"), DType::fp8_e4m3);
  EXPECT_EQ(kvcache::parse_dtype("e5m2"), DType::fp8_e5m2);
  EXPECT_EQ(kvcache::parse_dtype("int8"), DType::int8);
  EXPECT_EQ(kvcache::dtype_name(DType::int8), "int8");
  for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2, DType::int8}) {
    EXPECT_EQ(kvcache::dtype_size(t), 1u);
    EXPECT_EQ(kvcache::parse_dtype(kvcache::dtype_name(t)), t);
  }
  kvcache::KVCacheParams p;
  p.num_layers = 32;
  p.n_kv_heads = 8;
  p.head_dim = 128;
  p.dtype = DType::bf16;
  const std::size_t bf16 = p.bytes_per_token();
  p.dtype = DType::fp8_e4m3;
  EXPECT_EQ(p.bytes_per_token() * 2, bf16);
  p.dtype = DType::int8;  // values + one float scale per (token, head)
  EXPECT_EQ(p.bytes_per_token(), 2u * 32 * 8 * (128 + 4));
  p.head_dim = 130;
  EXPECT_THROW(p.validate(), kvcache::InvalidArgument);
  p.dtype = DType::fp8_e5m2;
  EXPECT_NO_THROW(p.validate());
  p.dtype = static_cast<DType>(6);
  EXPECT_THROW(p.validate(), kvcache::InvalidArgument);
}

TEST(KVScales, RefusesZeroNegativeNanInfAndWrongCounts) {
  const std::vector<float> ok(6, 0.5f);
  EXPECT_NO_THROW(kvcache::KVScales(3, 2, ok, ok));
  for (float bad : {0.0f, -1.0f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    std::vector<float> k = ok;
    k[4] = bad;
    EXPECT_THROW(kvcache::KVScales(3, 2, k, ok), kvcache::InvalidArgument) << bad;
    EXPECT_THROW(kvcache::KVScales(3, 2, ok, k), kvcache::InvalidArgument) << bad;
  }
  EXPECT_THROW(kvcache::KVScales(3, 2, std::vector<float>(5, 1.0f), ok), kvcache::InvalidArgument);
  kvcache::KVScales s(3, 2, ok, ok);
  const kvcache::KVScales before = s;
  EXPECT_THROW(s.set(1, 0, std::vector<float>{1.0f, -2.0f}), kvcache::InvalidArgument);
  EXPECT_EQ(s, before);  // unchanged
  EXPECT_THROW(s.set(3, 0, std::vector<float>{1.0f, 2.0f}), kvcache::InvalidArgument);
  s.set(2, 1, std::vector<float>{3.0f, 4.0f});
  EXPECT_EQ(s.get(2, 1, 1), 4.0f);
}

TEST(KVScales, HeadScalesFromSamples) {
  // 2 tokens x 2 heads x 2 dims; head 1 all zero.
  const std::vector<float> samples{1.0f, -896.0f, 0.0f, 0.0f, 224.0f, 3.0f, 0.0f, 0.0f};
  const auto s = kvcache::fp8_head_scales(DType::fp8_e4m3, 2, 2, samples);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], 2.0f);  // 896 / 448
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_THROW(kvcache::fp8_head_scales(DType::int8, 2, 2, samples), kvcache::InvalidArgument);
  EXPECT_THROW(kvcache::fp8_head_scales(DType::fp8_e5m2, 2, 3, samples), kvcache::InvalidArgument);
}

TEST(KVScales, ManagerSetKvScalesValidates) {
  kvcache::KVCacheParams p;
  p.dtype = DType::fp8_e4m3;
  p.num_layers = 2;
  p.n_kv_heads = 2;
  p.head_dim = 8;
  p.cache_strategy = kvcache::CacheStrategy::paged;
  p.page_size = 4;
  kvcache::PagedKVCacheManager m(p, 8, 2, 32);
  EXPECT_EQ(m.kv_scales().get(1, 1, 1), 1.0f);
  const std::vector<float> ks{1, 2, 3, 4}, vs{5, 6, 7, 8};
  m.set_kv_scales(kvcache::KVScales(2, 2, ks, vs));
  const auto ids = m.claim(1);
  const auto batch = m.fetch(ids, std::vector<std::uint32_t>{1});
  const kvcache::CacheDesc v1 = batch.desc().layer(1, 1);
  EXPECT_EQ(v1.head_scales[0], 7.0f);
  EXPECT_EQ(v1.head_scales[1], 8.0f);
  // Refused while a sequence is active; refused for another shape.
  EXPECT_THROW(m.set_kv_scales(kvcache::KVScales(2, 2)), kvcache::InvalidArgument);
  m.release(ids[0]);
  EXPECT_THROW(m.set_kv_scales(kvcache::KVScales(3, 2)), kvcache::InvalidArgument);
  EXPECT_EQ(m.kv_scales().get(0, 0, 1), 2.0f);
  p.dtype = DType::bf16;
  kvcache::PagedKVCacheManager wide(p, 8, 2, 32);
  EXPECT_THROW(wide.set_kv_scales(kvcache::KVScales(2, 2)), kvcache::InvalidArgument);
}

}  // namespace
