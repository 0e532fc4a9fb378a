// kvcache/kernels/rope.h — rotary position embedding (RoPE): the scalar
// reference and the shared angle definition.
//
// Convention ("NeoX" / HF Llama rotate_half): within the first rotary_dim
// elements of a head vector, element i and element i + rotary_dim/2 form a
// pair (i < rotary_dim/2) rotated by angle pos * theta^(-2i/rotary_dim):
//   x[i]        <- x[i] * cos - x[i + half] * sin   (as fma(x[i], cos, -(x[i+half]*sin)))
//   x[i + half] <- x[i] * sin + x[i + half] * cos   (as fma(x[i], sin, x[i+half]*cos))
// Elements from rotary_dim on are left as they are. rotary_dim 0 means
// head_dim. The fused store path (store_kv with StoreOptions::rope_k) uses
// rope_cos_sin too, so both compute bit-identical angles.
// Pure functions; thread-safe. Throws InvalidArgument for an odd rotary_dim or
// one larger than head_dim, and for a span whose size is not n_heads*head_dim.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcache/error.h"
#include "kvcache/kernels/attention.h"

namespace kvcache {

// rotary_dim in effect (0 => head_dim), validated.
inline std::uint32_t rope_rotary_dim(const RopeOptions& rope, std::uint32_t head_dim) {
  const std::uint32_t rd = rope.rotary_dim == 0 ? head_dim : rope.rotary_dim;
  if (rd % 2 != 0 || rd > head_dim) {
    throw InvalidArgument("rope rotary_dim " + std::to_string(rd) +
                          " must be even and at most head_dim " + std::to_string(head_dim));
  }
  if (!(rope.theta > 0.0f)) {
    throw InvalidArgument("rope theta " + std::to_string(rope.theta) + " must be positive");
  }
  return rd;
}

// Inverse frequency of pair i: theta^(-2i/rotary_dim), computed in double, rounded once.
inline float rope_inv_freq(std::uint32_t i, std::uint32_t rotary_dim, float theta) {
  return static_cast<float>(
      std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / rotary_dim));
}

// Inverse frequencies of pairs 0 .. rotary_dim/2 - 1 (rope_inv_freq each).
inline std::vector<float> rope_inv_freqs(std::uint32_t rotary_dim, float theta) {
  std::vector<float> f(rotary_dim / 2);
  for (std::uint32_t i = 0; i < rotary_dim / 2; ++i) f[i] = rope_inv_freq(i, rotary_dim, theta);
  return f;
}

// cos and sin of pair i's angle at position pos, given its inverse frequency.
inline void rope_cos_sin(std::uint32_t pos, float inv_freq, float& c, float& s) {
  const double angle = static_cast<double>(pos) * static_cast<double>(inv_freq);
  c = static_cast<float>(std::cos(angle));
  s = static_cast<float>(std::sin(angle));
}

// Rotates one pair. Written with explicit fma so the result does not depend
// on whether the compiler contracts a*b - c*d (it may differ per target).
inline void rope_rotate_pair(float x0, float x1, float c, float s, float& y0, float& y1) {
  y0 = std::fma(x0, c, -(x1 * s));
  y1 = std::fma(x0, s, x1 * c);
}

// Rotates one token's row x = [n_heads][head_dim] in place for position pos.
inline void apply_rope_reference(std::span<float> x, std::uint32_t n_heads, std::uint32_t head_dim,
                                 std::uint32_t pos, const RopeOptions& rope) {
  detail::check_size("rope row", x.size(), std::size_t{n_heads} * head_dim);
  const std::uint32_t rd = rope_rotary_dim(rope, head_dim);
  const std::uint32_t half = rd / 2;
  for (std::uint32_t i = 0; i < half; ++i) {
    float c = 0.0f;
    float s = 0.0f;
    rope_cos_sin(pos, rope_inv_freq(i, rd, rope.theta), c, s);
    for (std::uint32_t h = 0; h < n_heads; ++h) {
      float* v = x.data() + std::size_t{h} * head_dim;
      const float x0 = v[i];
      const float x1 = v[i + half];
      rope_rotate_pair(x0, x1, c, s, v[i], v[i + half]);
    }
  }
}

}  // namespace kvcache
