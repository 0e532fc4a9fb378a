// What the tier tests of the manager share: the small f32 paged cache with
// prefix caching (page 4, head dim 4, either pool arrangement) and prompts of
// consecutive token ids.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/params.h"

namespace kvcache::testing {

inline KVCacheParams tier_test_params(PoolArrangement arrangement, std::uint32_t num_layers = 3,
                                      std::uint32_t n_kv_heads = 2, std::uint32_t n_devices = 1) {
  return KVCacheParams{.dtype = DType::f32,
                       .num_layers = num_layers,
                       .n_kv_heads = n_kv_heads,
                       .head_dim = 4,
                       .cache_strategy = CacheStrategy::paged,
                       .page_size = 4,
                       .enable_prefix_caching = true,
                       .n_devices = n_devices,
                       .pool_arrangement = arrangement};
}

// n token ids from, from + 1, ...
inline std::vector<std::uint32_t> iota_tokens(std::uint32_t n, std::uint32_t from) {
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = from + i;
  return t;
}

}  // namespace kvcache::testing
