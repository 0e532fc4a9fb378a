// The adaptive eviction policy never serves fewer blocks than LRU on the
// checked-in conversation traces (tests/data/conversation_*_trace.jsonl, made
// by `kvcache trace-gen`, commands in docs/PERFORMANCE.md), at capacities
// where tiered alone wins and where it loses to LRU. Deterministic replays;
// the assertion is the relation, not the figures.
#include <gtest/gtest.h>

#include <string>

#include "kvcache/engine/trace_file.h"
#include "kvcache/replay/trace_replay.h"

namespace kvcache {
namespace {

std::uint64_t blocks_hit(const std::vector<TraceRequest>& trace, EvictionPolicyKind policy,
                         std::uint64_t capacity) {
  ReplayOptions o;
  o.sequential = true;
  o.capacity_tokens = capacity;
  o.policy = policy;
  return replay_trace(trace, o).blocks_hit;
}

void expect_at_least_lru(const char* file) {
  const auto trace = engine::read_mooncake_trace(std::string(KVCACHE_TEST_DATA_DIR) + "/" + file);
  bool tiered_lost = false;
  for (std::uint64_t capacity : {32'000, 64'000, 128'000, 256'000, 512'000}) {
    const std::uint64_t lru = blocks_hit(trace, EvictionPolicyKind::lru, capacity);
    const std::uint64_t tiered = blocks_hit(trace, EvictionPolicyKind::tiered, capacity);
    const std::uint64_t adaptive = blocks_hit(trace, EvictionPolicyKind::adaptive, capacity);
    EXPECT_GE(adaptive, lru) << file << " at " << capacity << " tokens";
    tiered_lost = tiered_lost || tiered < lru;
  }
  EXPECT_TRUE(tiered_lost) << file << ": the trace should make tiered lose somewhere";
}

TEST(AdaptiveReplay, AtLeastLruOnTheChatTrace) {
  expect_at_least_lru("conversation_chat_trace.jsonl");
}

TEST(AdaptiveReplay, AtLeastLruOnTheAgentTrace) {
  expect_at_least_lru("conversation_agent_trace.jsonl");
}

TEST(AdaptiveReplay, IsThePrefixCacheDefault) {
  EXPECT_EQ(PrefixCacheConfig{}.policy, EvictionPolicyKind::adaptive);
}

}  // namespace
}  // namespace kvcache
