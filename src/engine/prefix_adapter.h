// src/engine/prefix_adapter.h — the scheduler's ONE door to prefix caching.
//
// Prefix caching lives in PagedKVCacheManager (match_prefix and the
// token-aware step), and so does fork. These functions are everything the
// scheduler needs from it: for a manager without prefix caching enabled, `available()`
// is false, `match` returns 0 and `step` forwards to KVCacheManager::step.
#pragma once

#include <cstdint>
#include <span>

#include "kvcache/engine/model.h"
#include "kvcache/manager.h"
#include "kvcache/prefix_cache.h"

namespace kvcache::engine::prefix {

// True when `m` is a paged manager with prefix caching enabled.
bool available(const KVCacheManager& m);

// Attaches the longest cached prefix of `tokens` to the (fresh) sequence;
// returns how many tokens it covers (0 when unavailable).
std::uint32_t match(KVCacheManager& m, SeqId seq, std::span<const TokenId> tokens);

// Evictable cached pages (ref count 0, in the hash index); 0 when unavailable.
// fetch() takes them after the free list, so free_blocks() + cached_pages()
// is what a fetch can allocate.
std::uint32_t cached_pages(const KVCacheManager& m);

// Releases the sequence, passing `hint` to the prefix cache when available
// (plain KVCacheManager::release otherwise).
void release(KVCacheManager& m, SeqId seq, ReuseHint hint);

// A new sequence sharing every page of `seq` (PagedKVCacheManager::fork).
// Throws InvalidArgument for a continuous manager.
SeqId fork(KVCacheManager& m, SeqId seq);

// Tiers (PrefixCacheConfig::tiers): whether `m` has any; whether `seq` still
// has pages loading; finish the loads that are done (never waits); wait for
// `seq`'s loads and finish them. All false / no-ops without tiers.
bool has_tiers(const KVCacheManager& m);
bool has_pending_loads(const KVCacheManager& m, SeqId seq);
void poll_loads(KVCacheManager& m);
void wait_loads(KVCacheManager& m, SeqId seq);

// Commits a step; new_tokens holds the ids of every sequence's valid tokens,
// concatenated in batch order (used to hash pages that became full).
void step(KVCacheManager& m, std::span<const SeqId> seqs, std::span<const std::uint32_t> valid,
          std::span<const TokenId> new_tokens);

}  // namespace kvcache::engine::prefix
