// The tier contract (kvcache/tier.h) checked against every tier: the host
// tier synchronous and threaded, the disk tier through io_uring, through
// worker threads and with buffered I/O, and a host tier writing through to a
// disk tier.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <thread>

#include "kvcache/disk_tier.h"
#include "kvcache/error.h"
#include "kvcache/host_tier.h"
#include "kvcache/write_through_tier.h"
#include "tier/tier_test_util.h"

namespace kvcache {
namespace {

using tier_test::Pages;
using tier_test::ReadBuffers;
using tier_test::results;

struct TierCase {
  std::string name;
  std::function<std::unique_ptr<Tier>(TierFingerprint, std::uint64_t capacity,
                                      const std::filesystem::path& dir)>
      make;
};

std::vector<TierCase> cases() {
  auto disk = [](DiskIo io, bool direct) {
    return [io, direct](TierFingerprint f, std::uint64_t cap, const std::filesystem::path& d) {
      DiskTierOptions o;
      o.io = io;
      o.direct_io = direct;
      o.slab_bytes = 64 << 10;  // several slab files even in small tests
      return std::unique_ptr<Tier>(std::make_unique<DiskTier>(std::move(f), d, cap, o));
    };
  };
  return {
      {"host_sync",
       [](TierFingerprint f, std::uint64_t cap, const std::filesystem::path&) {
         HostTierOptions o;
         o.synchronous = true;
         return std::unique_ptr<Tier>(std::make_unique<HostTier>(std::move(f), cap, o));
       }},
      {"host_async",
       [](TierFingerprint f, std::uint64_t cap, const std::filesystem::path&) {
         HostTierOptions o;
         o.chunk_bytes = 64 << 10;  // several chunks
         return std::unique_ptr<Tier>(std::make_unique<HostTier>(std::move(f), cap, o));
       }},
      {"host_checksums",
       [](TierFingerprint f, std::uint64_t cap, const std::filesystem::path&) {
         HostTierOptions o;
         o.checksums = true;
         return std::unique_ptr<Tier>(std::make_unique<HostTier>(std::move(f), cap, o));
       }},
      {"disk_io_uring", disk(DiskIo::io_uring, true)},
      {"disk_threads", disk(DiskIo::threads, true)},
      {"disk_buffered", disk(DiskIo::automatic, false)},
      {"write_through",
       [](TierFingerprint f, std::uint64_t cap, const std::filesystem::path& d) {
         auto far = std::make_shared<DiskTier>(f, d, DiskTier::kUnlimited);
         auto near = std::make_shared<HostTier>(std::move(f), cap);
         return std::unique_ptr<Tier>(std::make_unique<WriteThroughTier>(near, far));
       }},
  };
}

class TierContract : public ::testing::TestWithParam<TierCase> {
 protected:
  std::unique_ptr<Tier> make(std::uint64_t capacity_pages,
                             TierFingerprint f = tier_test::fingerprint()) {
    const std::uint64_t cap = capacity_pages * f.page_bytes();
    return GetParam().make(std::move(f), cap, dir_.path);
  }
  tier_test::TempDir dir_;
};

TEST_P(TierContract, StoreThenLoadIsByteExact) {
  auto tier = make(64);
  const Pages p(tier->fingerprint(), 8, 1);
  const auto w = p.writes();
  const TierTicket st = tier->store(w);
  st.wait();
  EXPECT_EQ(results(st.store_results()), std::vector<StoreResult>(8, StoreResult::stored));
  EXPECT_EQ(tier->contains(p.keys), std::vector<std::uint8_t>(8, 1));
  ReadBuffers rb(p, 0, 8);
  const TierTicket lt = tier->load(rb.reads);
  EXPECT_EQ(results(lt.load_results()), std::vector<LoadResult>(8, LoadResult::loaded));
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(rb.bytes[i], p.bytes[i]) << "page " << i;
  const TierStats s = tier->stats();
  EXPECT_EQ(s.pages_held, 8u);
  EXPECT_EQ(s.bytes_held, 8 * tier->fingerprint().page_bytes());
  EXPECT_EQ(s.pages_stored, 8u);
  EXPECT_EQ(s.pages_loaded, 8u);
  EXPECT_EQ(s.bytes_loaded, 8 * tier->fingerprint().page_bytes());
  EXPECT_EQ(s.lookups, 8u);
  EXPECT_EQ(s.hits, 8u);
  EXPECT_TRUE(tier->enabled());
}

TEST_P(TierContract, OddPageBytesAreByteExact) {
  auto tier = make(16, tier_test::fingerprint(24));  // 6144 bytes: not a multiple of 4 KiB
  const Pages p(tier->fingerprint(), 3, 2);
  const auto w = p.writes();
  tier->store(w).wait();
  ReadBuffers rb(p, 0, 3);
  EXPECT_EQ(results(tier->load(rb.reads).load_results()),
            std::vector<LoadResult>(3, LoadResult::loaded));
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(rb.bytes[i], p.bytes[i]);
}

TEST_P(TierContract, MissingKeysAndOtherNamespace) {
  auto tier = make(16);
  const Pages p(tier->fingerprint(), 2, 3);
  const auto w = p.writes(0, 1);
  tier->store(w).wait();
  ReadBuffers rb(p, 1, 2);  // never stored
  EXPECT_EQ(results(tier->load(rb.reads).load_results()),
            std::vector<LoadResult>{LoadResult::missing});
  // The same tokens and bytes keyed under another model's fingerprint.
  const Pages other(tier_test::fingerprint(64, "other-model"), 1, 3);
  EXPECT_NE(other.keys[0], p.keys[0]);
  EXPECT_EQ(tier->contains(other.keys), std::vector<std::uint8_t>{0});
  ReadBuffers ro(other, 0, 1);
  EXPECT_EQ(results(tier->load(ro.reads).load_results()),
            std::vector<LoadResult>{LoadResult::missing});
  EXPECT_EQ(tier->contains(p.keys), (std::vector<std::uint8_t>{1, 0}));
}

TEST_P(TierContract, WrongTokensAreAMismatchAndThePageStays) {
  auto tier = make(16);
  const Pages p(tier->fingerprint(), 1, 4);
  const auto w = p.writes();
  tier->store(w).wait();
  std::vector<std::uint32_t> wrong = p.tokens[0];
  wrong[5] += 1;
  std::vector<std::byte> buf(p.bytes[0].size());
  const PageRead bad{p.keys[0], wrong, buf};
  EXPECT_EQ(results(tier->load({&bad, 1}).load_results()),
            std::vector<LoadResult>{LoadResult::mismatch});
  EXPECT_EQ(tier->contains(p.keys), std::vector<std::uint8_t>{1});
  ReadBuffers rb(p, 0, 1);
  EXPECT_EQ(results(tier->load(rb.reads).load_results()),
            std::vector<LoadResult>{LoadResult::loaded});
  EXPECT_EQ(rb.bytes[0], p.bytes[0]);
}

TEST_P(TierContract, CapacityEvictsLeastRecentlyUsed) {
  auto tier = make(4);
  const Pages p(tier->fingerprint(), 7, 5);
  for (std::size_t i = 0; i < 4; ++i) {
    const auto w = p.writes(i, i + 1);
    tier->store(w).wait();
  }
  ReadBuffers touch(p, 0, 1);  // page 0 becomes the most recent
  EXPECT_EQ(results(tier->load(touch.reads).load_results()),
            std::vector<LoadResult>{LoadResult::loaded});
  for (std::size_t i = 4; i < 6; ++i) {
    const auto w = p.writes(i, i + 1);
    EXPECT_EQ(results(tier->store(w).store_results()),
              std::vector<StoreResult>{StoreResult::stored});
  }
  EXPECT_EQ(tier->contains(p.keys), (std::vector<std::uint8_t>{1, 0, 0, 1, 1, 1, 0}));
  const TierStats s = tier->stats();
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(s.pages_held, 4u);
  EXPECT_EQ(s.capacity_bytes, 4 * tier->fingerprint().page_bytes());
  ReadBuffers rb(p, 5, 6);
  EXPECT_EQ(results(tier->load(rb.reads).load_results()),
            std::vector<LoadResult>{LoadResult::loaded});
  EXPECT_EQ(rb.bytes[0], p.bytes[5]);
}

// take_evicted: the keys evicted for room, oldest first, each reported once;
// a duplicate store or a load is not an eviction.
TEST_P(TierContract, EvictionsAreReportedOnceOldestFirst) {
  auto tier = make(2);
  const Pages p(tier->fingerprint(), 5, 9);
  std::vector<PageKey> out;
  tier->take_evicted(out);
  EXPECT_TRUE(out.empty());
  for (std::size_t i = 0; i < 2; ++i) {
    const auto w = p.writes(i, i + 1);
    tier->store(w).wait();
    tier->store(w).wait();  // present: nothing evicted
  }
  ReadBuffers rb(p, 1, 2);
  tier->load(rb.reads).wait();  // page 1 becomes the most recent
  tier->take_evicted(out);
  EXPECT_TRUE(out.empty());
  for (std::size_t i = 2; i < 5; ++i) {
    const auto w = p.writes(i, i + 1);
    tier->store(w).wait();
  }
  tier->take_evicted(out);
  EXPECT_EQ(out, (std::vector<PageKey>{p.keys[0], p.keys[1], p.keys[2]}));
  EXPECT_EQ(tier->stats().evictions, 3u);
  out.assign(1, p.keys[4]);  // appended to what `out` holds
  tier->take_evicted(out);
  EXPECT_EQ(out, std::vector<PageKey>{p.keys[4]});
}

TEST_P(TierContract, CapacityBelowOnePageRejects) {
  auto tier = make(0);
  const Pages p(tier->fingerprint(), 1, 6);
  const auto w = p.writes();
  EXPECT_EQ(results(tier->store(w).store_results()),
            std::vector<StoreResult>{StoreResult::rejected});
  EXPECT_EQ(tier->stats().rejected, 1u);
  EXPECT_EQ(tier->contains(p.keys), std::vector<std::uint8_t>{0});
}

TEST_P(TierContract, DuplicateStoreIsPresent) {
  auto tier = make(16);
  const Pages p(tier->fingerprint(), 2, 7);
  const auto w = p.writes(0, 1);
  tier->store(w).wait();
  EXPECT_EQ(results(tier->store(w).store_results()),
            std::vector<StoreResult>{StoreResult::present});
  const std::vector<PageWrite> twice{p.write(1), p.write(1)};
  auto r = results(tier->store(twice).store_results());
  std::sort(r.begin(), r.end());
  EXPECT_EQ(r, (std::vector<StoreResult>{StoreResult::stored, StoreResult::present}));
  EXPECT_EQ(tier->stats().pages_stored, 2u);
}

TEST_P(TierContract, WrongSizesThrowAndEnqueueNothing) {
  auto tier = make(16);
  const Pages p(tier->fingerprint(), 2, 8);
  std::vector<PageWrite> w = p.writes();
  w[1].bytes = w[1].bytes.first(w[1].bytes.size() - 1);
  EXPECT_THROW(tier->store(w), InvalidArgument);
  w = p.writes();
  w[1].token_ids = w[1].token_ids.first(3);
  EXPECT_THROW(tier->store(w), InvalidArgument);
  ReadBuffers rb(p, 0, 2);
  rb.reads[0].bytes = rb.reads[0].bytes.subspan(1);
  EXPECT_THROW(tier->load(rb.reads), InvalidArgument);
  // Nothing of the refused calls reached the tier.
  const auto ok = p.writes(1, 2);
  tier->store(ok).wait();
  EXPECT_EQ(tier->contains(p.keys), (std::vector<std::uint8_t>{0, 1}));
  EXPECT_EQ(tier->stats().pages_stored, 1u);
  EXPECT_EQ(tier->stats().pages_loaded, 0u);
}

// Threads storing and loading at once, with eviction: every load answers
// loaded (byte-exact) or missing; the counters add up.
TEST_P(TierContract, ConcurrencyStoreLoadEvict) {
  auto tier = make(12);
  constexpr std::size_t kThreads = 4, kPages = 8;
  std::vector<Pages> pages;
  for (std::size_t t = 0; t < kThreads; ++t) {
    pages.emplace_back(tier->fingerprint(), kPages, static_cast<std::uint32_t>(100 + t));
  }
  std::vector<std::thread> threads;
  std::vector<int> bad(kThreads, 0);
  for (std::size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        const auto w = pages[t].writes();
        const TierTicket st = tier->store(w);
        ReadBuffers rb(pages[t], 0, kPages);
        const auto lr = results(tier->load(rb.reads).load_results());
        st.wait();
        for (std::size_t i = 0; i < kPages; ++i) {
          if (lr[i] == LoadResult::loaded && rb.bytes[i] != pages[t].bytes[i]) ++bad[t];
          if (lr[i] != LoadResult::loaded && lr[i] != LoadResult::missing) ++bad[t];
        }
        tier->contains(pages[t].keys);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(kThreads, 0));
  const TierStats s = tier->stats();
  EXPECT_LE(s.pages_held, 12u);
  EXPECT_EQ(s.pages_held + s.evictions, s.pages_stored);
  EXPECT_EQ(s.corrupt, 0u);
}

INSTANTIATE_TEST_SUITE_P(Tiers, TierContract, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(TierEvictionPolicyTest, LruSkipsSlotsNotEvictable) {
  auto lru = make_lru_tier_policy();
  lru->resize(4);
  for (std::uint32_t s = 0; s < 4; ++s) lru->stored(s);
  lru->accessed(0);
  auto any = [](std::uint32_t) { return true; };
  EXPECT_EQ(lru->victim(any), 1u);
  EXPECT_EQ(lru->victim([](std::uint32_t s) { return s != 1; }), 2u);
  lru->removed(1);
  EXPECT_EQ(lru->victim(any), 2u);
  lru->removed(2);
  lru->removed(3);
  lru->removed(0);
  EXPECT_FALSE(lru->victim(any).has_value());
}

TEST(HostTierTest, RefusesBadConstruction) {
  TierFingerprint f = tier_test::fingerprint();
  HostTierOptions o;
  o.threads = 0;
  EXPECT_THROW(HostTier(f, 1 << 20, o), InvalidArgument);
  f.head_dim = 0;
  EXPECT_THROW(HostTier(f, 1 << 20), InvalidArgument);
}

}  // namespace
}  // namespace kvcache
