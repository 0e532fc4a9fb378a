#include "kvcache/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kvcache/error.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvcache {
namespace {

std::string u(std::uint64_t v) { return std::to_string(v); }

void check_counts(std::uint32_t num_layers, std::uint32_t n_kv_heads) {
  if (num_layers == 0 || n_kv_heads == 0) {
    throw InvalidArgument("KVScales needs num_layers and n_kv_heads >= 1 (got " + u(num_layers) +
                          " and " + u(n_kv_heads) + ")");
  }
}

void check_scale(float s, std::uint32_t layer, std::uint32_t kv, std::uint32_t head) {
  if (!(std::isfinite(s) && s > 0.0f)) {
    throw InvalidArgument(std::string(kv == 0 ? "k" : "v") + " scale of layer " + u(layer) +
                          " head " + u(head) + " is " + std::to_string(s) +
                          ": a scale must be finite and > 0");
  }
}

}  // namespace

KVScales::KVScales(std::uint32_t num_layers, std::uint32_t n_kv_heads)
    : num_layers_(num_layers), n_kv_heads_(n_kv_heads) {
  check_counts(num_layers, n_kv_heads);
  scales_.assign(std::size_t{num_layers} * 2 * n_kv_heads, 1.0f);
}

KVScales::KVScales(std::uint32_t num_layers, std::uint32_t n_kv_heads,
                   std::span<const float> k_scales, std::span<const float> v_scales)
    : KVScales(num_layers, n_kv_heads) {
  const std::size_t want = std::size_t{num_layers} * n_kv_heads;
  for (std::uint32_t kv = 0; kv < 2; ++kv) {
    const std::span<const float> s = kv == 0 ? k_scales : v_scales;
    if (s.size() != want) {
      throw InvalidArgument(std::string(kv == 0 ? "k" : "v") + "_scales has " + u(s.size()) +
                            " values, expected num_layers * n_kv_heads = " + u(want));
    }
  }
  for (std::uint32_t l = 0; l < num_layers; ++l) {
    set(l, 0, k_scales.subspan(std::size_t{l} * n_kv_heads, n_kv_heads));
    set(l, 1, v_scales.subspan(std::size_t{l} * n_kv_heads, n_kv_heads));
  }
}

void KVScales::set(std::uint32_t layer, std::uint32_t kv, std::span<const float> scales) {
  if (layer >= num_layers_) {
    throw InvalidArgument("layer " + u(layer) + " is out of range: the scales have " +
                          u(num_layers_) + " layers");
  }
  if (kv > 1) throw InvalidArgument("kv " + u(kv) + " is neither 0 (K) nor 1 (V)");
  if (scales.size() != n_kv_heads_) {
    throw InvalidArgument("layer " + u(layer) + " got " + u(scales.size()) +
                          " scales, expected n_kv_heads = " + u(n_kv_heads_));
  }
  for (std::uint32_t h = 0; h < n_kv_heads_; ++h) check_scale(scales[h], layer, kv, h);
  std::copy(
      scales.begin(), scales.end(),
      scales_.begin() + static_cast<std::ptrdiff_t>((std::size_t{layer} * 2 + kv) * n_kv_heads_));
}

float KVScales::get(std::uint32_t layer, std::uint32_t kv, std::uint32_t head) const {
  if (layer >= num_layers_ || kv > 1 || head >= n_kv_heads_) {
    throw InvalidArgument("scale (layer " + u(layer) + ", kv " + u(kv) + ", head " + u(head) +
                          ") is out of range (" + u(num_layers_) + " layers, " + u(n_kv_heads_) +
                          " heads)");
  }
  return scales_[(std::size_t{layer} * 2 + kv) * n_kv_heads_ + head];
}

std::vector<float> fp8_head_scales(DType dtype, std::uint32_t n_kv_heads, std::uint32_t head_dim,
                                   std::span<const float> samples) {
  if (!is_fp8(dtype)) {
    throw InvalidArgument("fp8_head_scales needs fp8_e4m3 or fp8_e5m2, not " +
                          std::string(dtype_name(dtype)));
  }
  if (n_kv_heads == 0 || head_dim == 0) {
    throw InvalidArgument("fp8_head_scales needs n_kv_heads and head_dim >= 1");
  }
  const std::size_t row = std::size_t{n_kv_heads} * head_dim;
  if (samples.size() % row != 0) {
    throw InvalidArgument("fp8_head_scales got " + u(samples.size()) +
                          " samples, not a multiple of n_kv_heads * head_dim = " + u(row));
  }
  std::vector<float> absmax(n_kv_heads, 0.0f);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (!std::isfinite(samples[i])) {
      throw InvalidArgument("sample " + u(i) + " is not finite");
    }
    float& m = absmax[(i % row) / head_dim];
    m = std::max(m, std::fabs(samples[i]));
  }
  for (float& m : absmax) {
    m = m > 0.0f ? std::max(m / quantized_max(dtype), std::numeric_limits<float>::min()) : 1.0f;
  }
  return absmax;
}

std::uint64_t KVScales::digest() const {
  const std::uint32_t counts[2] = {num_layers_, n_kv_heads_};
  const std::uint64_t seed = XXH3_64bits(counts, sizeof counts);
  return XXH3_64bits_withSeed(scales_.data(), scales_.size() * sizeof(float), seed);
}

}  // namespace kvcache
