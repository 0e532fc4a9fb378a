// A byte-driven interpreter of manager operations, checked against a simple
// model after every step. Shared by the libFuzzer target (fuzz/) and the
// regular test suite (which replays the corpus and random inputs).
//
// Ops: claim, fetch (+ write K/V for the new tokens), step (with token ids on
// the prefix-caching manager), release, multistep increment, and bad calls
// (unknown / released / duplicate ids, absurd sizes, zero steps); on a third,
// prefix-caching paged manager also match_prefix (four shared prompts),
// fork and truncate, with eviction under a small pool. K/V values are a
// function of the whole token prefix, so a page served from the cache, shared
// by a fork or copied on write must hold exactly its own tokens' values.
// After each op: the manager's lengths equal the model's, check_invariants()
// passes, a failing call left snapshot() unchanged, and every committed token
// of every sequence still holds its value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvcache::testing {

// Runs the program encoded by `bytes` on a continuous, a paged and a
// prefix-caching paged manager.
// Returns normally when everything held; aborts (via a thrown
// std::logic_error) describing the first broken property.
void run_manager_ops(std::span<const std::uint8_t> bytes);

}  // namespace kvcache::testing
