// A byte-driven interpreter of manager operations, checked against a simple
// model after every step. Shared by the libFuzzer target (fuzz/) and the
// regular test suite (which replays the corpus and random inputs).
//
// Ops: claim, fetch (+ write a deterministic K/V pattern for the new tokens),
// step, release, multistep increment, and bad calls (unknown / released /
// duplicate ids, absurd sizes, zero steps). After each op: the manager's
// lengths equal the model's, check_invariants() passes, a failing call left
// snapshot() unchanged, and every committed token still holds its pattern.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvcache::testing {

// Runs the program encoded by `bytes` on a continuous and a paged manager.
// Returns normally when everything held; aborts (via a thrown
// std::logic_error) describing the first broken property.
void run_manager_ops(std::span<const std::uint8_t> bytes);

}  // namespace kvcache::testing
