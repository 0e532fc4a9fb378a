// The `adaptive` eviction policy: its shadow caches count what LRU and
// tiered would have served, it evicts as LRU until tiered's shadow leads by
// more than the noise, then as tiered; and it keeps the policy contract
// (size, contains, every page evicted once).
#include "prefix/adaptive_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace kvcache::prefix {
namespace {

constexpr std::uint64_t kHot = 1'000'000;  // content used by every round

// Page `page` holds content `hash` for one request: published (or hit),
// then released.
void use(EvictionPolicy& p, std::uint32_t page, std::uint64_t hash, bool hit) {
  if (hit) {
    p.erase(page);
    p.on_hit(page);
  } else {
    p.on_publish(page, hash, false);
  }
  p.insert(page, ReuseHint::unknown);
}

TEST(ShadowCache, CountsHitsAsAnLruCacheOfItsSize) {
  ShadowCache<LruPolicy> s(2, LruPolicy(2));
  EXPECT_FALSE(s.access(1, false));
  s.release(1, ReuseHint::unknown);
  EXPECT_FALSE(s.access(2, false));
  s.release(2, ReuseHint::unknown);
  EXPECT_TRUE(s.access(1, false));  // 1 becomes the most recent
  s.release(1, ReuseHint::unknown);
  EXPECT_FALSE(s.access(3, false));  // evicts 2
  s.release(3, ReuseHint::unknown);
  EXPECT_TRUE(s.access(1, false));
  EXPECT_FALSE(s.access(2, false));  // evicts 3 (1 is open: in use)
  EXPECT_FALSE(s.access(4, false));  // every slot open: not simulated
  s.release(4, ReuseHint::unknown);  // unknown content: nothing to release
  s.release(1, ReuseHint::unknown);
  s.release(2, ReuseHint::unknown);
  EXPECT_TRUE(s.access(1, false));
  EXPECT_TRUE(s.access(2, false));
}

TEST(AdaptivePolicy, EvictsAsLruWithoutEvidence) {
  AdaptivePolicy p(4, 64);
  for (std::uint32_t page = 0; page < 4; ++page) use(p, page, 100 + page, false);
  EXPECT_FALSE(p.following_tiered());
  EXPECT_EQ(p.size(), 4u);
  std::vector<std::uint32_t> order;
  while (p.size() > 0) order.push_back(p.evict());
  EXPECT_EQ(order, (std::vector<std::uint32_t>{0, 1, 2, 3}));
  for (std::uint32_t page = 0; page < 4; ++page) EXPECT_FALSE(p.contains(page));
}

// A pool of 4 pages; every round uses a hot content, then a scan of 4 fresh
// ones. LRU's shadow loses the hot content to each scan, tiered's keeps it
// (reused: `kept`), so the policy follows tiered and the real pool keeps it
// too.
TEST(AdaptivePolicy, FollowsTieredWhenItsShadowWins) {
  constexpr std::uint32_t kPages = 4;
  AdaptivePolicy p(kPages, 64);
  std::uint64_t fresh = 0;
  std::uint32_t hot_page = kPages;  // where the hot content lives, if cached
  std::uint32_t hot_hits = 0;
  std::vector<std::uint32_t> free_pages{0, 1, 2, 3};
  auto take = [&] {
    if (!free_pages.empty()) {
      const std::uint32_t page = free_pages.back();
      free_pages.pop_back();
      return page;
    }
    const std::uint32_t page = p.evict();
    p.on_unpublish(page);
    if (page == hot_page) hot_page = kPages;
    return page;
  };
  for (int round = 0; round < 40; ++round) {
    if (hot_page < kPages) {
      use(p, hot_page, kHot, true);
      ++hot_hits;
    } else {
      hot_page = take();
      use(p, hot_page, kHot, false);
    }
    for (int i = 0; i < 4; ++i) use(p, take(), ++fresh, false);
  }
  EXPECT_TRUE(p.following_tiered());
  EXPECT_GT(p.shadow_tiered_hits(), p.shadow_lru_hits());
  EXPECT_GE(hot_hits, 30u);  // LRU alone would never hit it
}

TEST(AdaptivePolicy, PageLeavesBothOrderingsWhateverEvictsIt) {
  AdaptivePolicy p(3, 16);
  for (std::uint32_t page = 0; page < 3; ++page) use(p, page, 10 + page, false);
  p.erase(1);
  EXPECT_FALSE(p.contains(1));
  EXPECT_EQ(p.size(), 2u);
  const std::uint32_t a = p.evict(), b = p.evict();
  EXPECT_EQ(p.size(), 0u);
  EXPECT_NE(a, b);
  EXPECT_NE(a, 1u);
  EXPECT_NE(b, 1u);
  p.insert(1, ReuseHint::likely);
  EXPECT_EQ(p.evict(), 1u);
}

TEST(AdaptivePolicy, BytesCountBothPoliciesAndBothShadows) {
  const std::uint64_t n = 1024, ghost = 4096;
  EXPECT_EQ(AdaptivePolicy::bytes(1024, 4096),
            2 * (LruPolicy::bytes(1024) + TieredPolicy::bytes(1024, 4096) +
                 ShadowCache<LruPolicy>::bytes(1024)) +
                n * 8);
  EXPECT_GT(AdaptivePolicy::bytes(1024, 4096), 2 * ghost * 8);
}

}  // namespace
}  // namespace kvcache::prefix
