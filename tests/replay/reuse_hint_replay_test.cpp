// Release hints in replay_trace: with reuse_hints, a request's output length
// picks its ReuseHint (short: likely), and the tiered policy keeps the likely
// prefix (the policy itself: tests/prefix/reuse_hint_test.cpp).
#include <gtest/gtest.h>

#include <vector>

#include "kvcache/replay/trace_replay.h"

namespace kvcache {
namespace {

// 600-token requests: one full 512-token page (cacheable) and one partial.
TraceRequest one_page(std::uint64_t id, std::uint32_t output) {
  return TraceRequest{0, 600, output, {id, 1000 + id}};
}

TEST(ReuseHint, ReplayHintsFromOutputLength) {
  // A (short output) X1 X2 (long outputs) A, room for 3 pages; each request
  // holds 2 pages while it runs. X2 needs one cached page evicted: without
  // hints tiered evicts the oldest (A), with hints the unlikely X1: A hits.
  const std::vector<TraceRequest> trace = {one_page(0, 5), one_page(1, 200), one_page(2, 200),
                                           one_page(0, 5)};
  for (bool sequential : {true, false}) {
    ReplayOptions o;
    o.capacity_tokens = 3 * 512;
    o.policy = EvictionPolicyKind::tiered;
    o.sequential = sequential;
    o.decode_tokens_per_s = 1e6;  // timed: each request finishes before the next arrives
    o.max_batch = 1;
    EXPECT_EQ(replay_trace(trace, o).blocks_hit, 0u) << sequential;
    o.reuse_hints = true;
    const ReplayResult r = replay_trace(trace, o);
    EXPECT_EQ(r.blocks_hit, 1u) << sequential;
    EXPECT_EQ(r.blocks_total, 8u);
    o.short_output = 5;  // now A's output (5) is not short: unlikely like the others
    EXPECT_EQ(replay_trace(trace, o).blocks_hit, 0u) << sequential;
  }
}

}  // namespace
}  // namespace kvcache
