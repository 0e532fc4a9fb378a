// Dense math of the engine: OpenBLAS sgemm plus small elementwise loops.

#include "engine/linalg.h"

#include <cblas.h>

#include <cmath>
#include <vector>

namespace kvcache::engine {

void linear(const float* x, std::size_t rows, std::size_t in, const float* w, std::size_t out,
            float* y, bool accumulate) {
  if (rows == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
              static_cast<int>(out), static_cast<int>(in), 1.0f, x, static_cast<int>(in), w,
              static_cast<int>(in), accumulate ? 1.0f : 0.0f, y, static_cast<int>(out));
}

void rms_norm(const float* x, std::size_t rows, std::size_t dim, const float* weight, float eps,
              float* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double ss = 0;
    for (std::size_t d = 0; d < dim; ++d) ss += double(xr[d]) * xr[d];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(dim) + eps));
    float* yr = y + r * dim;
    for (std::size_t d = 0; d < dim; ++d) yr[d] = xr[d] * inv * weight[d];
  }
}

void apply_rope(float* x, std::size_t rows, std::uint32_t heads, std::uint32_t head_dim,
                std::span<const std::uint32_t> positions, float theta) {
  const std::uint32_t half = head_dim / 2;
  std::vector<float> inv_freq(half), cos_v(half), sin_v(half);
  for (std::uint32_t i = 0; i < half; ++i) {
    inv_freq[i] = static_cast<float>(std::pow(double(theta), -2.0 * i / double(head_dim)));
  }
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::uint32_t i = 0; i < half; ++i) {
      const double angle = double(positions[r]) * inv_freq[i];
      cos_v[i] = static_cast<float>(std::cos(angle));
      sin_v[i] = static_cast<float>(std::sin(angle));
    }
    for (std::uint32_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim;
      for (std::uint32_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos_v[i] - b * sin_v[i];
        v[i + half] = b * cos_v[i] + a * sin_v[i];
      }
    }
  }
}

void silu_mul(float* gate, const float* up, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace kvcache::engine
