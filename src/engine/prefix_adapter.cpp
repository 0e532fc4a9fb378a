// Compile-time bridge to the paged manager's prefix cache (see prefix_adapter.h).

#include "engine/prefix_adapter.h"

#include <concepts>

#include "kvcache/paged_manager.h"

namespace kvcache::engine::prefix {
namespace {

template <class M>
concept HasPrefixCache = requires(M& m, SeqId s, std::span<const TokenId> t,
                                  std::span<const SeqId> seqs, std::span<const std::uint32_t> v) {
  { m.match_prefix(s, t) } -> std::convertible_to<std::uint32_t>;
  m.step(seqs, v, t);
};

template <class M>
PagedKVCacheManager* as_prefix_manager(KVCacheManager& m) {
  if constexpr (HasPrefixCache<M>) {
    if (m.params().cache_strategy == CacheStrategy::paged && m.params().enable_prefix_caching) {
      return static_cast<M*>(&m);
    }
  }
  return nullptr;
}

template <class M>
std::uint32_t match_impl(KVCacheManager& m, SeqId seq, std::span<const TokenId> tokens) {
  if constexpr (HasPrefixCache<M>) {
    if (M* pm = as_prefix_manager<M>(m)) return pm->match_prefix(seq, tokens);
  }
  return 0;
}

template <class M>
void step_impl(KVCacheManager& m, std::span<const SeqId> seqs, std::span<const std::uint32_t> valid,
               std::span<const TokenId> new_tokens) {
  if constexpr (HasPrefixCache<M>) {
    if (M* pm = as_prefix_manager<M>(m)) return pm->step(seqs, valid, new_tokens);
  }
  m.step(seqs, valid);
}

}  // namespace

bool available(const KVCacheManager& m) {
  return HasPrefixCache<PagedKVCacheManager> && m.params().cache_strategy == CacheStrategy::paged &&
         m.params().enable_prefix_caching;
}

std::uint32_t match(KVCacheManager& m, SeqId seq, std::span<const TokenId> tokens) {
  return match_impl<PagedKVCacheManager>(m, seq, tokens);
}

void step(KVCacheManager& m, std::span<const SeqId> seqs, std::span<const std::uint32_t> valid,
          std::span<const TokenId> new_tokens) {
  step_impl<PagedKVCacheManager>(m, seqs, valid, new_tokens);
}

}  // namespace kvcache::engine::prefix
