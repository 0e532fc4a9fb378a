// The engine's single call site of the cache kernels (see kernels_bridge.h).

#include "engine/kernels_bridge.h"

#include "kvcache/kernels/attention.h"

namespace kvcache::engine {

void store_and_attend(const KVCacheBatch& batch, std::uint32_t layer, std::span<const float> k,
                      std::span<const float> v, const StoreOptions& store, std::span<const float> q,
                      std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
                      std::span<float> out) {
  // The per-layer descriptors serve every dtype and both strategies (an fp8
  // batch's carry its manager's static scales).
  const CacheDesc whole = batch.desc();
  const CacheDesc k_cache = whole.layer(layer, 0);
  const CacheDesc v_cache = whole.layer(layer, 1);
  store_kv(k_cache, v_cache, k, v, row_offsets, store);
  attention(k_cache, v_cache, q, n_q_heads, row_offsets, out);
}

}  // namespace kvcache::engine
