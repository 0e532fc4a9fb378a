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

#include "kvcache/kernels/reference.h"
#include "kvcache/kv_cache.h"
#include "kvcache/thread_pool.h"

namespace kvcache {

// Optional rotary position embedding applied to K on the way into the cache
// (and nowhere else). Rotates pairs (i, i + rotary_dim/2) ("NeoX" / HF Llama
// style) by angle pos * theta^(-2i/rotary_dim) for i < rotary_dim/2, pos =
// the token's position; see kernels/rope.h for the reference.
struct RopeOptions {
  bool enabled = false;
  float theta = 10000.0f;
  std::uint32_t rotary_dim = 0;  // 0 => head_dim
};

inline constexpr std::size_t kStoreStreamingBytes = std::size_t{8} << 20;

// Whether store_kv prefetches its input ahead into L1: with next_row_l1 the
// conversion loops prefetch 2 KiB ahead of what they read, one line per line
// read, running on into the next token's K and V rows (one burst of the
// whole next row per row is more than the L1's miss buffers take at once). Results never depend on
// it. automatic picks, from measurements (docs/PERFORMANCE.md):
// - next_row_l1 with RoPE on K, on every processor: the rotation reads each
//   K row in a pass of its own, whose loads the hardware prefetchers alone
//   leave waiting on DRAM (Zen 5 with a RopeTable, burst form: bf16 1.55x,
//   f16 1.35x);
// - next_row_l1 for bf16 and f16, none for f32 on AMD processors without
//   AVX-512 (Zen 3, running form, against none: bf16 1.13x, f16 1.10-1.26x,
//   f32 0.94x);
// - next_row_l1 on AMD processors with AVX-512 (Zen 4, running form, against
//   none, 2 threads: bf16 1.29x, f16 1.15x, f32 1.15x, bf16 with RoPE 1.14x;
//   the burst form had cost f16 on Zen 4 / 5, 0.79x / 0.94x; the running form
//   is not measured on Zen 5);
// - next_row_l1 elsewhere (a Sapphire Rapids Xeon, burst form: bf16 0.68 ->
//   0.77 of memcpy).
enum class StorePrefetch : std::uint8_t { automatic, next_row_l1, none };

class RopeTable;  // kernels/rope_table.h

struct StoreOptions {
  RopeOptions rope_k{};
  // Optional cos/sin of rope_k's angles per position, computed once
  // (kernels/rope_table.h): the same results without the per-token
  // trigonometry. It must match rope_k (same theta and rotary_dim in effect)
  // and rope_k must be enabled (InvalidArgument otherwise). Positions at or
  // past its max_positions are computed per token. Not owned.
  const RopeTable* rope_table = nullptr;
  StorePrefetch prefetch = StorePrefetch::automatic;
};

// The strategy options.prefetch stands for on the calling processor (never
// automatic), for a store of `dtype` with options.rope_k: what store_kv()
// uses. Throws InvalidArgument for a value outside the enum.
StorePrefetch resolve_store_prefetch(const StoreOptions& options, DType dtype);

// The strategy `requested` stands for on the calling processor for caches
// of page layout `layout` (never automatic): what attention() uses for
// AttentionOptions::prefetch. Throws InvalidArgument for a value outside the
// enum.
AttentionPrefetch resolve_attention_prefetch(AttentionPrefetch requested,
                                             PageLayout layout = PageLayout::nhd);

// The prefetch strategies by name, as `kvcache bench --prefetch` and the
// Python binding spell them: attention "auto", "step-l1", "tile-l2", "none";
// store "auto", "row-l1", "none". The parsers throw InvalidArgument naming
// the value and the accepted names; the name of a value outside the enum is
// "?".
std::string_view prefetch_name(AttentionPrefetch p);
std::string_view prefetch_name(StorePrefetch p);
AttentionPrefetch parse_attention_prefetch(std::string_view name);
StorePrefetch parse_store_prefetch(std::string_view name);

// AttentionPrecision by name, as `kvcache bench --precision` and the Python
// binding spell it: "fp32", "bf16". Parsing throws InvalidArgument naming
// the value and the accepted names; the name of a value outside the enum
// is "?".
std::string_view precision_name(AttentionPrecision p);
AttentionPrecision parse_attention_precision(std::string_view name);

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
  return retype<float>(d);
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
