// src/engine/prefix_adapter.h — the scheduler's ONE door to prefix caching.
//
// Prefix caching (PagedKVCacheManager::match_prefix and the token-aware
// step) is being added to the library separately. These three functions are
// everything the scheduler needs from it; they detect the API at compile
// time, so until it exists `available()` is false, `match` returns 0 and
// `step` forwards to the plain KVCacheManager::step.
#pragma once

#include <cstdint>
#include <span>

#include "kvcache/engine/model.h"
#include "kvcache/manager.h"

namespace kvcache::engine::prefix {

// True when this build's library has prefix caching and `m` has it enabled.
bool available(const KVCacheManager& m);

// Attaches the longest cached prefix of `tokens` to the (fresh) sequence;
// returns how many tokens it covers (0 when unavailable).
std::uint32_t match(KVCacheManager& m, SeqId seq, std::span<const TokenId> tokens);

// Commits a step; new_tokens holds the ids of every sequence's valid tokens,
// concatenated in batch order (used to hash pages that became full).
void step(KVCacheManager& m, std::span<const SeqId> seqs, std::span<const std::uint32_t> valid,
          std::span<const TokenId> new_tokens);

}  // namespace kvcache::engine::prefix
