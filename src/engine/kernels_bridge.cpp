// The engine's single call site of the cache kernels (see kernels_bridge.h).

#include "engine/kernels_bridge.h"

#include "kvcache/kernels/attention.h"

namespace kvcache::engine {
namespace {

template <class Collection>
void run(const Collection& c, std::uint32_t layer, std::span<const float> k,
         std::span<const float> v, const StoreOptions& store, std::span<const float> q,
         std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
         std::span<float> out) {
  const auto k_cache = c.get_key_cache(layer);
  const auto v_cache = c.get_value_cache(layer);
  store_kv(k_cache, v_cache, k, v, row_offsets, store);
  attention(k_cache, v_cache, q, n_q_heads, row_offsets, out);
}

}  // namespace

void store_and_attend(const KVCacheBatch& batch, std::uint32_t layer, std::span<const float> k,
                      std::span<const float> v, const StoreOptions& store, std::span<const float> q,
                      std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
                      std::span<float> out) {
  if (batch.strategy() == CacheStrategy::paged) {
    run(batch.paged<float>(), layer, k, v, store, q, n_q_heads, row_offsets, out);
  } else {
    run(batch.continuous<float>(), layer, k, v, store, q, n_q_heads, row_offsets, out);
  }
}

}  // namespace kvcache::engine
