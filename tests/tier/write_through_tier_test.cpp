// WriteThroughTier (kvcache/write_through_tier.h): what only it does — every
// store reaches the far tier too, its ticket waits for both, the far tier
// keeps what the near one evicts; the contract itself runs in
// tier_contract_test.cpp (write_through).
#include "kvcache/write_through_tier.h"

#include <gtest/gtest.h>

#include <memory>

#include "kvcache/disk_tier.h"
#include "kvcache/error.h"
#include "kvcache/host_tier.h"
#include "tier/memory_tier.h"
#include "tier/tier_test_util.h"

namespace kvcache {
namespace {

using testing::MemoryTier;
using tier_test::Pages;
using tier_test::ReadBuffers;
using tier_test::results;

std::shared_ptr<MemoryTier> memory(std::string name, bool synchronous, std::size_t capacity) {
  return std::make_shared<MemoryTier>(tier_test::fingerprint(),
                                      MemoryTier::Options{std::move(name), synchronous, capacity});
}

TEST(WriteThroughTier, StoresReachBothAndTheTicketWaitsForTheFarOne) {
  auto near = memory("host", true, SIZE_MAX);
  auto far = memory("disk", false, SIZE_MAX);  // finishes only when told
  WriteThroughTier wt(near, far);
  EXPECT_EQ(wt.name(), "host");
  const Pages p(wt.fingerprint(), 3, 1);
  const auto w = p.writes();
  const TierTicket t = wt.store(w);
  EXPECT_FALSE(t.done());  // the far store is still queued
  EXPECT_EQ(wt.contains(p.keys), (std::vector<std::uint8_t>{1, 1, 1}));
  EXPECT_EQ(far->complete_all(), 3u);
  EXPECT_EQ(results(t.store_results()), std::vector<StoreResult>(3, StoreResult::stored));
  EXPECT_EQ(far->contains(p.keys), (std::vector<std::uint8_t>{1, 1, 1}));
  EXPECT_EQ(wt.stats().pages_stored, 3u);  // the near tier's figures
}

TEST(WriteThroughTier, FarKeepsWhatNearEvictsAndResultsAreNears) {
  auto near = memory("host", true, 2);
  auto far = memory("disk", true, SIZE_MAX);
  WriteThroughTier wt(near, far);
  const Pages p(wt.fingerprint(), 4, 2);
  for (std::size_t i = 0; i < 4; ++i) {
    const auto w = p.writes(i, i + 1);
    EXPECT_EQ(results(wt.store(w).store_results()), std::vector<StoreResult>{StoreResult::stored});
  }
  EXPECT_EQ(wt.contains(p.keys), (std::vector<std::uint8_t>{0, 0, 1, 1}));
  EXPECT_EQ(far->contains(p.keys), (std::vector<std::uint8_t>{1, 1, 1, 1}));
  ReadBuffers rb(p, 0, 1);  // what near lost comes back from far, byte for byte
  EXPECT_EQ(results(far->load(rb.reads).load_results()),
            std::vector<LoadResult>{LoadResult::loaded});
  EXPECT_EQ(rb.bytes[0], p.bytes[0]);
  const auto again = p.writes(0, 1);  // near stores it again; far has it: present there
  EXPECT_EQ(results(wt.store(again).store_results()),
            std::vector<StoreResult>{StoreResult::stored});
  EXPECT_EQ(far->stats().pages_stored, 4u);
}

TEST(WriteThroughTier, HostInFrontOfADiskThatSurvivesARestart) {
  tier_test::TempDir dir;
  const TierFingerprint f = tier_test::fingerprint();
  const Pages p(f, 6, 3);
  {
    auto host = std::make_shared<HostTier>(f, 2 * f.page_bytes());
    auto disk = std::make_shared<DiskTier>(f, dir.path, DiskTier::kUnlimited);
    WriteThroughTier wt(host, disk);
    const auto w = p.writes();
    EXPECT_EQ(results(wt.store(w).store_results()).size(), 6u);
    EXPECT_EQ(host->stats().pages_held, 2u);
    EXPECT_EQ(disk->stats().pages_held, 6u);
  }
  DiskTier reopened(f, dir.path, DiskTier::kUnlimited);
  EXPECT_EQ(reopened.recovery().pages, 6u);
  EXPECT_EQ(reopened.contains(p.keys), std::vector<std::uint8_t>(6, 1));
}

TEST(WriteThroughTier, RefusesNullSameOrOtherFingerprint) {
  auto a = memory("host", true, SIZE_MAX);
  EXPECT_THROW(WriteThroughTier(a, nullptr), InvalidArgument);
  EXPECT_THROW(WriteThroughTier(nullptr, a), InvalidArgument);
  EXPECT_THROW(WriteThroughTier(a, a), InvalidArgument);
  auto other = std::make_shared<MemoryTier>(tier_test::fingerprint(64, "other"));
  try {
    WriteThroughTier wt(a, other);
    FAIL() << "another fingerprint was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fingerprint"), std::string::npos) << e.what();
  }
}

TEST(WriteThroughTier, WrongSizesThrowAndQueueNothing) {
  auto near = memory("host", true, SIZE_MAX);
  auto far = memory("disk", false, SIZE_MAX);
  WriteThroughTier wt(near, far);
  const Pages p(wt.fingerprint(), 1, 4);
  std::vector<std::byte> short_bytes(wt.fingerprint().page_bytes() - 1);
  const PageWrite bad{p.keys[0], p.tokens[0], short_bytes};
  EXPECT_THROW(wt.store(std::span(&bad, 1)), InvalidArgument);
  EXPECT_EQ(far->queued(), 0u);
  EXPECT_EQ(wt.contains(p.keys), std::vector<std::uint8_t>{0});
}

}  // namespace
}  // namespace kvcache
