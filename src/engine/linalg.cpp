// Dense math of the engine: OpenBLAS sgemm plus small elementwise loops.

#include "engine/linalg.h"

#include <cblas.h>

#include <cmath>

#include "kvcache/kernels/rope.h"

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
                std::span<const std::uint32_t> positions, const RopeTable& table) {
  const std::uint32_t half = table.rotary_dim() / 2;
  const RopeOptions rope{true, table.theta(), table.rotary_dim()};
  for (std::size_t r = 0; r < rows; ++r) {
    const std::span<float> row(x + r * heads * head_dim, std::size_t{heads} * head_dim);
    if (positions[r] >= table.max_positions()) {  // past the table: the angles computed
      apply_rope_reference(row, heads, head_dim, positions[r], rope);
      continue;
    }
    const std::span<const float> cs = table.cos_sin(positions[r]);
    for (std::uint32_t h = 0; h < heads; ++h) {
      float* v = row.data() + std::size_t{h} * head_dim;
      for (std::uint32_t i = 0; i < half; ++i) {
        rope_rotate_pair(v[i], v[i + half], cs[i], cs[half + i], v[i], v[i + half]);
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
