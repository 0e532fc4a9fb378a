// kvcache/kernels/attention.h — fast CPU kernels over the cache views.
//
// Same contract and argument conventions as kvcache/kernels/reference.h (the
// oracle they are tested against): ragged batch given by row_offsets, q/out
// [total_new_tokens][n_q_heads][head_dim] floats, k_new/v_new
// [total_new_tokens][n_kv_heads][head_dim] floats, causal over history + new
// tokens, GQA, fp32 accumulation. SIMD through Highway with runtime dispatch
// (AVX2 / AVX-512 / scalar). `pool` == nullptr runs on the calling thread.
// Arguments are validated (InvalidArgument) once per call, never in the loops:
// row_offsets (shape, non-decreasing, and cache_length(b) + new tokens within
// the room the fetch reserved for entry b, reserved_length(b): a kernel never
// touches a row the batch did not reserve, nor a sentinel page), n_q_heads a positive
// multiple of n_kv_heads, span sizes, K/V views of the same shape, a finite scale.
//
// attention: every position < cache_length(b) + new tokens of entry b must
// hold K/V (store_kv the new tokens first). Decode entries (few new tokens)
// process all query heads of all KV heads per K/V row read, split the context
// across the pool's threads and merge the pieces by log-sum-exp; prefill
// entries are tiled (query rows x one KV head) with an online softmax.
// Results match attention_reference within fp32 rounding (different
// summation order and a polynomial exp with <= 1 ulp error); with
// AttentionPrecision::bf16 on a bf16 cache, within the bound stated there.
// store_kv: writes exactly what store_kv_reference writes (same f16 / bf16
// round-to-nearest-even), optionally rotating K first (kernels/rope.h).
// Calls writing at least kStoreStreamingBytes (K + V) into a cache whose
// rows are 64-byte aligned use non-temporal stores: the rows bypass the
// caches (no read-for-ownership of the destination), which is what a large
// prefill wants; smaller calls (decode) leave the new rows in cache for the
// attention call that follows.
// Thread-safety: concurrent calls on disjoint outputs are safe; a pool runs
// one call at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kvcache/cache_desc.h"
#include "kvcache/kernels/options.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/kv_cache.h"
#include "kvcache/thread_pool.h"

namespace kvcache {

// The kernels on per-layer descriptors (CacheDesc::layer(), or a view's
// desc()): what the typed overloads below call, and what code holding only
// a CacheDesc (the C API, another language) calls directly. k and v must
// describe the same batch and geometry (InvalidArgument otherwise) and be
// valid (CacheDesc::validate). Implemented with Highway in src/kernels/cpu/.
void attention(const CacheDesc& k, const CacheDesc& v, std::span<const float> q,
               std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
               std::span<float> out, const AttentionOptions& options = {},
               ThreadPool* pool = nullptr);
void store_kv(const CacheDesc& k, const CacheDesc& v, std::span<const float> k_new,
              std::span<const float> v_new, std::span<const std::uint32_t> row_offsets,
              const StoreOptions& options = {}, ThreadPool* pool = nullptr);

template <KVCacheT Cache>
void attention(const Cache& k_cache, const Cache& v_cache, std::span<const float> q,
               std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
               std::span<float> out, const AttentionOptions& options = {},
               ThreadPool* pool = nullptr) {
  attention(k_cache.desc(), v_cache.desc(), q, n_q_heads, row_offsets, out, options, pool);
}

template <KVCacheT Cache>
void store_kv(const Cache& k_cache, const Cache& v_cache, std::span<const float> k_new,
              std::span<const float> v_new, std::span<const std::uint32_t> row_offsets,
              const StoreOptions& options = {}, ThreadPool* pool = nullptr) {
  store_kv(k_cache.desc(), v_cache.desc(), k_new, v_new, row_offsets, options, pool);
}

}  // namespace kvcache
