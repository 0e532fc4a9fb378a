// A byte-driven interpreter of manager operations, checked against a simple
// model after every step. Shared by the libFuzzer target (fuzz/) and the
// regular test suite (which replays the corpus and random inputs).
//
// Ops: claim, fetch (+ write K/V for the new tokens), step (with token ids on
// the prefix-caching manager), release, multistep increment, and bad calls
// (unknown / released / duplicate ids, absurd sizes, zero steps); on a third,
// prefix-caching paged manager also match_prefix (four shared prompts),
// fork and truncate, with eviction under a small pool; and on the same
// manager with a tier below it (tests/tier/memory_tier.h, completing at
// once or only when told, 16 pages, evicting) also poll_loads, wait_loads,
// wait_tiers, completions and faults (failed loads, corrupt and dropped
// pages): evicted pages are written back and match_prefix loads them.
// K/V values are a function of the whole token prefix, so a page served from the cache, shared
// by a fork or copied on write must hold exactly its own tokens' values.
// After each op: the manager's lengths equal the model's, check_invariants()
// passes, a failing call left snapshot() unchanged, and every committed token
// of every sequence still holds its value. With the tier: a sequence with
// pending loads is refused by fetch; once its loads finish it holds exactly
// its prompt's values up to the length the loads reached (a failed page ends
// the hit); a pool kept apart that receives the loaded pages matches the
// manager's; every tier eviction is reported once (as a removed event of a
// page that was stored); after everything is released and every load has
// finished, no page is leaked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvcache::testing {

// What the tiered runs did (so a test can tell that tiers were exercised).
struct ManagerOpsFigures {
  std::uint64_t pages_stored = 0;    // written back into the tier
  std::uint64_t pages_loaded = 0;    // loaded back from it
  std::uint64_t tier_evictions = 0;  // reported by the tier, as removed events
  std::uint64_t load_faults = 0;     // failed or corrupt loads
};

// Runs the program encoded by `bytes` on a continuous, a paged and a
// prefix-caching paged manager, then on the last with a tier below it
// (synchronous, then deferred).
// Returns normally when everything held; aborts (via a thrown
// std::logic_error) describing the first broken property.
ManagerOpsFigures run_manager_ops(std::span<const std::uint8_t> bytes);

}  // namespace kvcache::testing
