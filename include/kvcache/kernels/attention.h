// kvcache/kernels/attention.h — fast CPU kernels over the cache views.
//
// Same contract and argument conventions as kvcache/kernels/reference.h (the
// oracle they are tested against): ragged batch given by row_offsets, q/out
// [total_new_tokens][n_q_heads][head_dim] floats, k_new/v_new
// [total_new_tokens][n_kv_heads][head_dim] floats, causal over history + new
// tokens, GQA, fp32 accumulation. SIMD through Highway with runtime dispatch
// (AVX2 / AVX-512 / scalar). `pool` == nullptr runs on the calling thread.
// Arguments are validated (InvalidArgument) once per call, never in the loops.
#pragma once

#include <cstdint>
#include <span>

#include "kvcache/kernels/reference.h"
#include "kvcache/kv_cache.h"
#include "kvcache/thread_pool.h"

namespace kvcache {

// Optional rotary position embedding applied to K on the way into the cache
// (and nowhere else). Rotates pairs (d, d + head_dim/2) ("NeoX" / HF Llama
// style) by angle pos * theta^(-2i/rotary_dim) for i < rotary_dim/2.
struct RopeOptions {
  bool enabled = false;
  float theta = 10000.0f;
  std::uint32_t rotary_dim = 0;  // 0 => head_dim
};

struct StoreOptions {
  RopeOptions rope_k{};
};

namespace detail {
// Type-erased entry points (implemented with Highway in src/kernels/cpu/).
void attention_cpu(DType dtype, const LayerCacheDesc<float>& k, const LayerCacheDesc<float>& v,
                   std::span<const float> q, std::uint32_t n_q_heads,
                   std::span<const std::uint32_t> row_offsets, std::span<float> out,
                   const AttentionOptions& options, ThreadPool* pool);
void store_kv_cpu(DType dtype, const LayerCacheDesc<float>& k, const LayerCacheDesc<float>& v,
                  std::span<const float> k_new, std::span<const float> v_new,
                  std::span<const std::uint32_t> row_offsets, const StoreOptions& options,
                  ThreadPool* pool);

// The descriptors differ only in the element pointer type: reinterpret.
template <CacheElement T>
LayerCacheDesc<float> erase(const LayerCacheDesc<T>& d) {
  LayerCacheDesc<float> e;
  e.blocks = reinterpret_cast<float*>(d.blocks);
  e.cache_lengths = d.cache_lengths;
  e.lookup_table = d.lookup_table;
  e.lookup_stride = d.lookup_stride;
  e.batch_size = d.batch_size;
  e.max_seq_length = d.max_seq_length;
  e.max_cache_length = d.max_cache_length;
  e.block_tokens = d.block_tokens;
  e.n_kv_heads = d.n_kv_heads;
  e.head_dim = d.head_dim;
  e.block_stride = d.block_stride;
  return e;
}
}  // namespace detail

template <KVCacheT Cache>
void attention(const Cache& k_cache, const Cache& v_cache, std::span<const float> q,
               std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
               std::span<float> out, AttentionOptions options = {}, ThreadPool* pool = nullptr) {
  using T = typename Cache::element_type;
  detail::attention_cpu(dtype_of_v<T>, detail::erase(k_cache.desc()), detail::erase(v_cache.desc()),
                        q, n_q_heads, row_offsets, out, options, pool);
}

template <KVCacheT Cache>
void store_kv(const Cache& k_cache, const Cache& v_cache, std::span<const float> k_new,
              std::span<const float> v_new, std::span<const std::uint32_t> row_offsets,
              const StoreOptions& options = {}, ThreadPool* pool = nullptr) {
  using T = typename Cache::element_type;
  detail::store_kv_cpu(dtype_of_v<T>, detail::erase(k_cache.desc()), detail::erase(v_cache.desc()),
                       k_new, v_new, row_offsets, options, pool);
}

}  // namespace kvcache
