// Bridge from the engine's signed token ids to the paged manager's prefix cache.

#include "engine/prefix_adapter.h"

#include <type_traits>

#include "kvcache/error.h"
#include "kvcache/paged_manager.h"

namespace kvcache::engine::prefix {
namespace {

// Token ids are non-negative; int32 and uint32 may alias each other.
static_assert(sizeof(TokenId) == sizeof(std::uint32_t) && std::is_integral_v<TokenId>);
std::span<const std::uint32_t> as_unsigned(std::span<const TokenId> tokens) {
  return {reinterpret_cast<const std::uint32_t*>(tokens.data()), tokens.size()};
}

PagedKVCacheManager* prefix_manager(KVCacheManager& m) {
  return available(m) ? m.paged() : nullptr;
}

}  // namespace

bool available(const KVCacheManager& m) {
  return m.params().cache_strategy == CacheStrategy::paged && m.params().enable_prefix_caching;
}

std::uint32_t match(KVCacheManager& m, SeqId seq, std::span<const TokenId> tokens) {
  PagedKVCacheManager* pm = prefix_manager(m);
  return pm != nullptr ? pm->match_prefix(seq, as_unsigned(tokens)) : 0;
}

std::uint32_t cached_pages(const KVCacheManager& m) {
  return available(m) ? m.paged()->metrics().pages_cached : 0;
}

void release(KVCacheManager& m, SeqId seq, ReuseHint hint) {
  if (PagedKVCacheManager* pm = prefix_manager(m)) {
    pm->release(seq, hint);
  } else {
    m.release(seq);
  }
}

SeqId fork(KVCacheManager& m, SeqId seq) {
  PagedKVCacheManager* paged = m.paged();
  if (paged == nullptr) throw InvalidArgument("fork needs a paged manager");
  return paged->fork(seq);
}

bool has_tiers(const KVCacheManager& m) { return available(m) && m.paged()->has_tiers(); }

bool has_pending_loads(const KVCacheManager& m, SeqId seq) {
  return has_tiers(m) && m.paged()->has_pending_loads(seq);
}

void poll_loads(KVCacheManager& m) {
  if (has_tiers(m)) (void)m.paged()->poll_loads();
}

void wait_loads(KVCacheManager& m, SeqId seq) {
  if (has_tiers(m)) m.paged()->wait_loads(seq);
}

void step(KVCacheManager& m, std::span<const SeqId> seqs, std::span<const std::uint32_t> valid,
          std::span<const TokenId> new_tokens) {
  if (PagedKVCacheManager* pm = prefix_manager(m)) {
    pm->step(seqs, valid, as_unsigned(new_tokens));
  } else {
    m.step(seqs, valid);
  }
}

}  // namespace kvcache::engine::prefix
