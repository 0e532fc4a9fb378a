// kvcache/kv_scales.h — the static K/V scales of an fp8 cache.
//
// An fp8 cache (DType::fp8_e4m3 / fp8_e5m2) stores code = fp8(x / scale) and
// reads back code * scale, with one float scale per (layer, KV head) for K
// and one for V, set by the caller (vLLM's k_scale / v_scale, per head). A
// `KVScales` holds them, [num_layers][2][n_kv_heads] (K then V of each
// layer), for the model's n_kv_heads (every device); a manager takes it with
// set_kv_scales() (manager.h) and hands its device's part to the kernels
// through CacheDesc::head_scales. `fp8_head_scales` computes scales from
// sample K or V rows: absmax per head / the format's largest value, so the
// samples' largest value maps to the largest code.
//
// Invariant: every scale is finite and > 0 (checked on every write;
// InvalidArgument naming the layer, head and value otherwise, the object
// unchanged). Plain value type: copy freely; const methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/dtype.h"

namespace kvcache {

class KVScales {
 public:
  KVScales() = default;
  // Every scale 1. Throws InvalidArgument for a zero count.
  KVScales(std::uint32_t num_layers, std::uint32_t n_kv_heads);
  // From K and V scales, each [num_layers][n_kv_heads]. Throws
  // InvalidArgument for a zero count, a span of another size, or a scale
  // that is zero, negative, infinite or NaN.
  KVScales(std::uint32_t num_layers, std::uint32_t n_kv_heads, std::span<const float> k_scales,
           std::span<const float> v_scales);

  std::uint32_t num_layers() const { return num_layers_; }
  std::uint32_t n_kv_heads() const { return n_kv_heads_; }

  // One layer's K (kv 0) or V (kv 1) scales, [n_kv_heads]. Throws
  // InvalidArgument for a bad layer / kv, a wrong count or a bad scale.
  void set(std::uint32_t layer, std::uint32_t kv, std::span<const float> scales);
  float get(std::uint32_t layer, std::uint32_t kv, std::uint32_t head) const;

  // All scales, [num_layers][2][n_kv_heads].
  std::span<const float> data() const { return scales_; }
  // 64-bit digest (XXH3) of the counts and every scale's bits: equal scales
  // give equal digests (the tier keys of an fp8 manager include it).
  std::uint64_t digest() const;

  friend bool operator==(const KVScales&, const KVScales&) = default;

 private:
  std::uint32_t num_layers_ = 0;
  std::uint32_t n_kv_heads_ = 0;
  std::vector<float> scales_;
};

// Per-head scales for `dtype` (fp8_e4m3 or fp8_e5m2) from sample rows
// [tokens][n_kv_heads][head_dim] of K or V: absmax of each head's values /
// quantized_max(dtype); a head whose samples are all zero gets 1. Throws
// InvalidArgument for a dtype that is not fp8, zero n_kv_heads / head_dim,
// a sample count that is not a multiple of n_kv_heads * head_dim, or a
// non-finite sample.
std::vector<float> fp8_head_scales(DType dtype, std::uint32_t n_kv_heads, std::uint32_t head_dim,
                                   std::span<const float> samples);

}  // namespace kvcache
