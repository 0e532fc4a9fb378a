// replay_trace with tiers (ReplayTiers): the hits split by medium, counted by
// hand on a five-request trace; the disk found again by a second replay; the
// TTFT model's arithmetic; bad tier options refused before any work.
#include <gtest/gtest.h>

#include <vector>

#include "kvcache/disk_tier.h"
#include "kvcache/error.h"
#include "kvcache/replay/trace_replay.h"
#include "test_util.h"
#include "tier/tier_test_util.h"

namespace kvcache {
namespace {

// 600-token requests: one full 512-token page (cacheable) and one partial.
TraceRequest one_page(double at, std::uint64_t id) {
  return TraceRequest{at, 600, 5, {id, 1000 + id}};
}

// A B C C A (tests/data/tier_replay_trace.jsonl). With room for 2 device
// pages each request evicts the page before it: B evicts A, C evicts B (both
// written back), the second C hits the device, and the second A finds A in a
// tier (loaded into the free page; its partial page then evicts C).
std::vector<TraceRequest> abcca() {
  return {one_page(0, 0), one_page(1, 1), one_page(2, 2), one_page(3, 2), one_page(4, 0)};
}

ReplayOptions two_pages(bool sequential) {
  ReplayOptions o;
  o.capacity_tokens = 2 * 512;
  o.sequential = sequential;
  o.decode_tokens_per_s = 1e6;  // timed: each request finishes before the next arrives
  o.max_batch = 1;
  return o;
}

void expect_media(const ReplayResult& r, std::vector<std::uint64_t> pages_hit) {
  ASSERT_EQ(r.media.size(), pages_hit.size());
  for (std::size_t i = 0; i < pages_hit.size(); ++i)
    EXPECT_EQ(r.media[i].pages_hit, pages_hit[i]) << r.media[i].name;
}

TEST(TierReplay, HostLargeEnoughServesTheSecondA) {
  for (bool sequential : {true, false}) {
    ReplayOptions o = two_pages(sequential);
    o.tiers.host_capacity_tokens = 2 * 512;
    const ReplayResult r = replay_trace(abcca(), o);
    EXPECT_EQ(r.blocks_total, 10u);
    EXPECT_EQ(r.blocks_hit, 2u) << sequential;
    ASSERT_EQ(r.media.size(), 2u);
    EXPECT_EQ(r.media[1].name, "host");
    expect_media(r, {1, 1});
    EXPECT_EQ(r.media[0].first_hit_request, 3u);
    EXPECT_EQ(r.media[1].first_hit_request, 4u);
    EXPECT_DOUBLE_EQ(r.hit_share(1), 0.5);
    EXPECT_DOUBLE_EQ(r.medium_block_hit_rate(1), 0.1);
    EXPECT_EQ(r.media[1].pages_stored, 3u);  // A, B, then C evicted by the second A
    EXPECT_EQ(r.media[1].bytes_stored, 3u * 4096);
    EXPECT_EQ(r.media[1].pages_loaded, 1u);
    EXPECT_EQ(r.media[1].bytes_loaded, 4096u);
    EXPECT_EQ(r.media[1].offload_dropped, 0u);
  }
}

// Admission `reused`: only C, which the second C attached again, goes down
// when the second A evicts it; A and B never do, so the second A misses.
TEST(TierReplay, ReusedAdmissionWritesBackOnlyReusedPages) {
  ReplayOptions o = two_pages(true);
  o.tiers.host_capacity_tokens = 2 * 512;
  o.tiers.admission = OffloadAdmission::reused;
  const ReplayResult r = replay_trace(abcca(), o);
  EXPECT_EQ(r.blocks_hit, 1u);
  expect_media(r, {1, 0});
  EXPECT_EQ(r.media[1].pages_stored, 1u);
  EXPECT_EQ(r.media[1].pages_loaded, 0u);
}

TEST(TierReplay, WithoutTiersOnlyTheDeviceHits) {
  const ReplayResult r = replay_trace(abcca(), two_pages(true));
  EXPECT_EQ(r.blocks_hit, 1u);
  ASSERT_EQ(r.media.size(), 1u);
  EXPECT_EQ(r.media[0].name, "device");
  expect_media(r, {1});
}

TEST(TierReplay, OnePageHostLosesAAndTheDiskBehindItKeepsIt) {
  ReplayOptions o = two_pages(true);
  o.tiers.host_capacity_tokens = 512;  // B's write-back evicts A from the host
  EXPECT_EQ(replay_trace(abcca(), o).blocks_hit, 1u);
  tier_test::TempDir dir;
  o.tiers.disk_dir = dir.path.string();
  const ReplayResult r = replay_trace(abcca(), o);
  EXPECT_EQ(r.blocks_hit, 2u);
  ASSERT_EQ(r.media.size(), 3u);
  EXPECT_EQ(r.media[2].name, "disk");
  expect_media(r, {1, 0, 1});
  EXPECT_EQ(r.media[2].first_hit_request, 4u);
  EXPECT_EQ(r.media[2].pages_stored, 3u);  // written through the host
  EXPECT_EQ(r.media[2].pages_loaded, 1u);
  EXPECT_EQ(r.media[2].pages_at_start, 0u);
}

TEST(TierReplay, ASecondReplayFindsTheDiskFromItsFirstRequest) {
  tier_test::TempDir dir;
  ReplayOptions o = two_pages(true);
  o.tiers.disk_dir = dir.path.string();
  const ReplayResult first = replay_trace(abcca(), o);
  expect_media(first, {1, 1});
  const ReplayResult second = replay_trace(abcca(), o);
  EXPECT_EQ(second.media[1].pages_at_start, 3u);  // A, B, C
  EXPECT_EQ(second.media[1].first_hit_request, 0u);
  EXPECT_GE(second.block_hit_rate(), first.block_hit_rate());
  EXPECT_EQ(second.blocks_hit, 5u);  // every full page: A, B, C from the disk, C, A
}

TEST(TierReplay, TtftModelArithmetic) {
  ReplayResult r;
  r.requests = 2;
  r.prompt_tokens = 1000;
  r.tokens_hit = 768;
  r.media = {{.name = "device", .tokens_hit = 256},
             {.name = "host", .tokens_hit = 256},
             {.name = "disk", .tokens_hit = 256}};
  TtftModel m{.flops_per_token = 2,
              .flops_per_s = 2,
              .kv_bytes_per_token = 1,
              .host_bytes_per_s = 4,
              .disk_bytes_per_s = 0.5};  // a token: compute 1 s, host 0.25 s, disk 2 s
  const TtftEstimate e = estimate_ttft(r, m);
  EXPECT_DOUBLE_EQ(e.without_cache_s, 500);
  EXPECT_DOUBLE_EQ(e.with_cache_s, 116 + 128 * 0.25 + 128 * 2);
  ASSERT_EQ(e.saving_s.size(), 3u);
  EXPECT_DOUBLE_EQ(e.saving_s[0], 128);
  EXPECT_DOUBLE_EQ(e.saving_s[1], 96);
  EXPECT_DOUBLE_EQ(e.saving_s[2], -128);  // slower than computing
  EXPECT_DOUBLE_EQ(e.saving_s_total(), 96);
  m.disk_bytes_per_s = 0;
  KV_EXPECT_THROW(estimate_ttft(r, m), InvalidArgument, "disk_bytes_per_s", "> 0");
}

TEST(TierReplay, BadTierOptionsAreRefusedNamingTheValue) {
  ReplayOptions o = two_pages(true);
  o.tiers.host_capacity_tokens = 100;
  KV_EXPECT_THROW(replay_trace(abcca(), o), InvalidArgument, "host tier capacity 100",
                  "one page of 512");
  o.tiers = {};
  o.tiers.disk_capacity_tokens = 4096;
  KV_EXPECT_THROW(replay_trace(abcca(), o), InvalidArgument, "4096", "without a disk directory");
  o.tiers = {};
  o.tiers.host_capacity_tokens = 1024;
  o.offline_belady = true;
  KV_EXPECT_THROW(replay_trace(abcca(), o), InvalidArgument, "belady");
}

TEST(TierReplay, ALockedDiskDirectoryIsRefused) {
  tier_test::TempDir dir;
  DiskTier holder(tier_test::fingerprint(), dir.path, DiskTier::kUnlimited);
  ReplayOptions o = two_pages(true);
  o.tiers.disk_dir = dir.path.string();
  KV_EXPECT_THROW(replay_trace(abcca(), o), InvalidArgument, dir.path.string());
}

}  // namespace
}  // namespace kvcache
