// replay_trace on small generated traces with hit rates known by hand.
#include "kvcache/replay/trace_replay.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kvcache/error.h"

namespace kvcache {
namespace {

TraceRequest req(double ts, std::uint32_t input, std::vector<std::uint64_t> ids,
                 std::uint32_t output = 2) {
  return TraceRequest{ts, input, output, std::move(ids)};
}

TEST(TraceReplay, RequestTokensFollowBlockIds) {
  const auto a = request_tokens(req(0, 1000, {7, 8}));
  const auto b = request_tokens(req(0, 600, {7, 9}));
  ASSERT_EQ(a.size(), 1000u);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 512, b.begin()));  // same block 7
  EXPECT_NE(a[512], b[512]);
  EXPECT_THROW(request_tokens(req(0, 1100, {1, 2})), InvalidArgument);  // 3 blocks' worth
  EXPECT_THROW(request_tokens(req(0, 500, {1, 2})), InvalidArgument);   // fits in 1
}

TEST(TraceReplay, SequentialUnlimitedHitRateIsKnown) {
  // Three identical 3-block requests (1500 tokens): the first computes all,
  // the next two reuse 2 full blocks each ((1500 - 1) / 512 = 2). 4 / 9.
  const std::vector<TraceRequest> trace = {req(0, 1500, {0, 1, 2}), req(1, 1500, {0, 1, 2}),
                                           req(2, 1500, {0, 1, 2})};
  ReplayOptions o;
  const ReplayResult r = replay_trace(trace, o);
  EXPECT_EQ(r.requests, 3u);
  EXPECT_EQ(r.blocks_total, 9u);
  EXPECT_EQ(r.blocks_hit, 4u);
  EXPECT_DOUBLE_EQ(r.token_hit_rate(), 2048.0 / 4500.0);
  EXPECT_EQ(r.evictions, 0u);
  EXPECT_EQ(r.peak_pages_used, 3u);
}

TEST(TraceReplay, SmallCapacityEvictsAndLosesHits) {
  // A, B, A with room for 4 pages of 512: B (4 pages) evicts all of A's under LRU.
  const std::vector<TraceRequest> trace = {
      req(0, 2048, {0, 1, 2, 3}), req(1, 2048, {10, 11, 12, 13}), req(2, 2048, {0, 1, 2, 3})};
  ReplayOptions o;
  o.capacity_tokens = 4 * 512;
  const ReplayResult lru = replay_trace(trace, o);
  EXPECT_EQ(lru.blocks_hit, 0u);
  EXPECT_EQ(lru.evictions, 8u);
  o.capacity_tokens = 8 * 512;
  EXPECT_EQ(replay_trace(trace, o).blocks_hit, 3u);
}

TEST(TraceReplay, TimedModeKeepsRequestsAliveWhileDecoding) {
  // Two overlapping requests sharing a prefix, then one after both finished.
  const std::vector<TraceRequest> trace = {
      req(0, 1100, {0, 1, 2}, 20), req(10, 1100, {0, 1, 3}, 20), req(5000, 1100, {0, 1, 2}, 1)};
  for (EvictionPolicyKind p :
       {EvictionPolicyKind::lru, EvictionPolicyKind::tiered, EvictionPolicyKind::interval}) {
    ReplayOptions o;
    o.sequential = false;
    o.decode_tokens_per_s = 100;
    o.policy = p;
    const ReplayResult r = replay_trace(trace, o);
    EXPECT_EQ(r.requests, 3u);
    EXPECT_EQ(r.blocks_hit, 4u);       // 2 + 2
    EXPECT_EQ(r.peak_pages_used, 4u);  // both alive at once, sharing 2 pages
    EXPECT_GT(r.decode_steps, 0u);
  }
}

// 600-token requests: one full page (reusable) + one partial page each.
TraceRequest one_page(std::uint64_t id) { return req(0, 600, {id, 1000 + id}); }

TEST(TraceReplay, IntervalKeepsAFrequentPrefixThatLruThrashes) {
  // P P X1 X2 P X3 X4 P with room for 3 pages. LRU: X1 + X2 push P out
  // (released before them), and so on: 1 hit. interval: P's measured reuse
  // interval is short, the X pages are fresh, so the X pages go: 3 hits.
  const std::vector<TraceRequest> trace = {one_page(0), one_page(0), one_page(1), one_page(2),
                                           one_page(0), one_page(3), one_page(4), one_page(0)};
  ReplayOptions o;
  o.capacity_tokens = 3 * 512;
  EXPECT_EQ(replay_trace(trace, o).blocks_hit, 1u);
  o.policy = EvictionPolicyKind::interval;
  const ReplayResult r = replay_trace(trace, o);
  EXPECT_EQ(r.blocks_total, 16u);
  EXPECT_EQ(r.blocks_hit, 3u);
  o.offline_belady = true;
  EXPECT_EQ(replay_trace(trace, o).blocks_hit, 3u);
}

TEST(TraceReplay, OfflineBeladyBeatsLruOnACycle) {
  // A B C A B C with room for 3 pages (each request needs 2 while it runs).
  // LRU always evicts the page needed next: 0 hits. Belady keeps A for t3
  // (evicting B at t2), then keeps C for t5 (evicting A, never used again).
  const std::vector<TraceRequest> trace = {one_page(0), one_page(1), one_page(2),
                                           one_page(0), one_page(1), one_page(2)};
  ReplayOptions o;
  o.capacity_tokens = 3 * 512;
  EXPECT_EQ(replay_trace(trace, o).blocks_hit, 0u);
  o.offline_belady = true;
  const ReplayResult r = replay_trace(trace, o);
  EXPECT_EQ(r.requests, 6u);
  EXPECT_EQ(r.blocks_hit, 2u);
  EXPECT_EQ(r.evictions, 2u);  // B at t2, A at t4
  EXPECT_EQ(r.capacity_pages, 3u);
  // Unlimited: every repeat hits, as with the manager.
  o.capacity_tokens = 0;
  EXPECT_EQ(replay_trace(trace, o).blocks_hit, 3u);
}

TEST(TraceReplay, OfflineBeladyMatchesTheManagerWithoutPressure) {
  const std::vector<TraceRequest> trace = {req(0, 1500, {0, 1, 2}), req(1, 1500, {0, 1, 2}),
                                           req(2, 2048, {0, 1, 3, 4}), req(3, 1100, {0, 1, 3})};
  ReplayOptions o;
  const ReplayResult lru = replay_trace(trace, o);
  o.offline_belady = true;
  const ReplayResult opt = replay_trace(trace, o);
  EXPECT_EQ(opt.blocks_hit, lru.blocks_hit);
  EXPECT_EQ(opt.tokens_hit, lru.tokens_hit);
  EXPECT_EQ(opt.blocks_total, lru.blocks_total);
  o.sequential = false;
  EXPECT_THROW(replay_trace(trace, o), InvalidArgument);  // offline reference: sequential only
}

TEST(TraceReplay, RejectsBadOptions) {
  const std::vector<TraceRequest> trace = {req(0, 10, {0})};
  ReplayOptions o;
  o.page_size = 0;
  EXPECT_THROW(replay_trace(trace, o), InvalidArgument);
  o.page_size = 16;
  o.sequential = false;
  o.decode_tokens_per_s = 0;
  EXPECT_THROW(replay_trace(trace, o), InvalidArgument);
}

// Requests and options are checked against the documented limits before
// anything is allocated or run (issue 40, items 7 and 8): an output_length
// of 2^32 - 1 ended in bad_alloc, 1e8 cost 1 GB; a NaN timestamp never
// arrives in timed mode (the loop waited for it forever).
TEST(TraceReplay, RefusesRequestsPastTheLimitsBeforeWork) {
  ReplayOptions o;
  o.sequential = false;
  const auto refused = [&](const TraceRequest& r, const char* needle) {
    const std::vector<TraceRequest> trace = {req(0, 10, {0}), r};
    try {
      replay_trace(trace, o);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(req(1, 10, {0}, 4294967295u), "request 1: output_length 4294967295 exceeds the limit");
  refused(req(1, 10, {0}, kMaxTraceRequestTokens + 1), "output_length 1048577");
  refused(req(1, 4294967295u, {0}), "input_length 4294967295 exceeds the limit of 1048576");
  refused(req(std::nan(""), 10, {0}), "timestamp nan");
  refused(req(-1, 10, {0}), "timestamp -1");
  refused(req(HUGE_VAL, 10, {0}), "timestamp inf");
  refused(req(1, 1100, {1, 2}), "request 1: input_length 1100 does not fit 2 hash ids");
}

TEST(TraceReplay, RefusesOptionsPastTheLimits) {
  const std::vector<TraceRequest> trace = {req(0, 10, {0})};
  const auto refused = [&](const ReplayOptions& o, const char* needle) {
    try {
      replay_trace(trace, o);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  ReplayOptions o;
  o.page_size = kMaxTraceRequestTokens + 1;
  refused(o, "page size 1048577 is outside [1, 1048576]");
  o = ReplayOptions{};
  o.page_size = 1;
  o.capacity_tokens = std::uint64_t{1} << 40;  // silently clamped to 2^32 - 2 pages before
  refused(o, "1099511627776 pages of 1, more than the limit of 4294967294");
  o = ReplayOptions{};
  o.max_batch = kMaxReplayBatch + 1;
  refused(o, "max_batch 65537 exceeds the limit of 65536");
  o = ReplayOptions{};
  o.sequential = false;
  o.decode_tokens_per_s = HUGE_VAL;
  refused(o, "finite positive");
  o.decode_tokens_per_s = std::nan("");
  refused(o, "finite positive");
}

}  // namespace
}  // namespace kvcache
