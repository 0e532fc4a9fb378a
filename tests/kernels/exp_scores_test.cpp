// Tests for ExpScores (kernels/cpu/exp_scores-inl.h), the e^x of the fast
// attention kernels' softmax, on every instruction set this processor runs:
// against std::exp in double over a sweep of float bit patterns.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/kernel_common.h"
#include "kvcache/error.h"
#include "kvcache/kernels/isa.h"

namespace kvcache::kernels {
namespace {

struct AutoIsa {
  ~AutoIsa() { select_isa("auto"); }
};

// Every `step`-th float from lo to hi (both finite, lo < hi), in bit order.
std::vector<float> sweep(float lo, float hi, std::uint32_t step) {
  std::vector<float> v;
  float x = lo;
  while (x < hi) {
    v.push_back(x);
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    // Towards +inf: negative floats shrink in magnitude as their bits fall.
    std::uint32_t next = 0;
    if (x < 0) {
      next = bits >= 0x80000000u + step ? bits - step : std::bit_cast<std::uint32_t>(0.0f);
    } else {
      next = bits + step;
    }
    x = std::bit_cast<float>(next);
  }
  return v;
}

// The spacing of floats at |y| (y a normal float's magnitude).
double ulp(double y) {
  const float f = static_cast<float>(y);
  return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity())) - f;
}

std::vector<float> exp_of(const std::vector<float>& x) {
  std::vector<float> out(x.size(), -1.0f);
  exp_scores(x, out);
  return out;
}

// Where the scores land after the running maximum is subtracted (the decode
// kernel's lazy maximum lets them reach +8): within 1 ulp of e^x.
TEST(ExpScores, WithinOneUlpOfExpOnEveryInstructionSet) {
  AutoIsa restore;
  // 10,007 is prime: the sweep visits odd and even mantissas alike.
  const std::vector<float> x = sweep(-86.5f, 8.8f, 10007);
  ASSERT_GT(x.size(), 200000u);
  for (const std::string& isa : available_isas()) {
    select_isa(isa);
    const std::vector<float> got = exp_of(x);
    double worst = 0;
    float worst_x = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double exact = std::exp(static_cast<double>(x[i]));
      const double err = std::fabs(static_cast<double>(got[i]) - exact) / ulp(exact);
      if (!(err <= worst)) {  // NaN lands here too
        worst = std::isnan(err) ? std::numeric_limits<double>::infinity() : err;
        worst_x = x[i];
      }
    }
    RecordProperty("worst_ulp_" + isa, std::to_string(worst));
    EXPECT_LE(worst, 1.0) << isa << ": " << worst << " ulp at x = " << worst_x;
  }
}

// Below the normal range the result is tiny and never negative (AVX2 gives
// 0 once 2^n would leave the normal range); from -104 down, -inf and NaN it
// is exactly 0, as masked scores need.
TEST(ExpScores, UnderflowMaskedScoresAndNaNGiveZero) {
  AutoIsa restore;
  const std::vector<float> tiny = sweep(-104.0f, -86.5f, 9973);
  std::vector<float> zero = sweep(-1000.0f, -104.0f, 999983);
  zero.push_back(-std::numeric_limits<float>::infinity());
  zero.push_back(std::numeric_limits<float>::quiet_NaN());
  zero.push_back(-std::numeric_limits<float>::quiet_NaN());
  for (const std::string& isa : available_isas()) {
    select_isa(isa);
    const std::vector<float> got_tiny = exp_of(tiny);
    for (std::size_t i = 0; i < tiny.size(); ++i) {
      const double exact = std::exp(static_cast<double>(tiny[i]));
      ASSERT_GE(got_tiny[i], 0.0f) << isa << " x = " << tiny[i];
      ASSERT_LE(std::fabs(got_tiny[i] - exact), 0x1p-124) << isa << " x = " << tiny[i];
    }
    const std::vector<float> got_zero = exp_of(zero);
    for (std::size_t i = 0; i < zero.size(); ++i) {
      ASSERT_EQ(got_zero[i], 0.0f) << isa << " x = " << zero[i];
    }
  }
}

// Sizes that leave a partial vector: the tail is computed like the rest.
TEST(ExpScores, OddSizesAndSizeMismatch) {
  AutoIsa restore;
  for (const std::string& isa : available_isas()) {
    select_isa(isa);
    for (std::size_t n : {1u, 3u, 7u, 9u, 17u, 33u}) {
      std::vector<float> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = -0.37f * static_cast<float>(i) + 1.25f;
      const std::vector<float> got = exp_of(x);
      for (std::size_t i = 0; i < n; ++i) {
        const double exact = std::exp(static_cast<double>(x[i]));
        EXPECT_LE(std::fabs(got[i] - exact), ulp(exact)) << isa << " n = " << n << " i = " << i;
      }
    }
  }
  std::vector<float> x(4, 1.0f), out(3, 7.0f);
  EXPECT_THROW(exp_scores(x, out), InvalidArgument);
  EXPECT_EQ(out, std::vector<float>(3, 7.0f));
}

}  // namespace
}  // namespace kvcache::kernels
