// The `interval` eviction policy's ordering on hand-made histories. The clock
// ticks once per insert(); a content's interval is the mean gap between its
// uses (publish or hit); content used once is "far" (64 x pool pages).
#include <gtest/gtest.h>

#include "prefix/eviction_policy.h"

namespace kvcache::prefix {
namespace {

constexpr std::uint32_t kPages = 8;  // fresh interval 512 (bucket 512), ghost 16 x 8

std::unique_ptr<EvictionPolicy> make_interval() {
  PrefixCacheConfig cfg;
  cfg.policy = EvictionPolicyKind::interval;
  return make_policy(cfg, kPages);
}

// Advances the clock by n ticks with a scratch page that ends up not evictable.
void tick(EvictionPolicy& p, std::uint32_t scratch, int n) {
  for (int i = 0; i < n; ++i) {
    p.insert(scratch, ReuseHint::unknown);
    p.erase(scratch);
  }
}

// Uses `page` again `gap` ticks after its last insert (as a prefix hit does).
void reuse_after(EvictionPolicy& p, std::uint32_t page, std::uint32_t scratch, int gap) {
  tick(p, scratch, gap);
  p.erase(page);
  p.on_hit(page);
  p.insert(page, ReuseHint::unknown);
}

TEST(IntervalPolicy, FreshContentGoesBeforeContentWithAShortInterval) {
  auto p = make_interval();
  p->on_publish(7, 999, false);  // scratch
  p->on_publish(0, 100, false);
  p->insert(0, ReuseHint::unknown);
  reuse_after(*p, 0, 7, 1);  // page 0: used twice, interval 2 ticks
  p->on_publish(1, 200, false);
  p->insert(1, ReuseHint::unknown);  // newer, but never reused
  EXPECT_EQ(p->size(), 2u);
  EXPECT_EQ(p->evict(), 1u);
  EXPECT_EQ(p->evict(), 0u);
  EXPECT_EQ(p->size(), 0u);
}

TEST(IntervalPolicy, LongerIntervalGoesFirstAtEqualIdleTime) {
  auto p = make_interval();
  p->on_publish(7, 999, false);
  p->on_publish(0, 100, false);
  p->insert(0, ReuseHint::unknown);
  tick(*p, 7, 100);
  p->on_publish(1, 101, false);  // clock 101
  p->insert(1, ReuseHint::unknown);
  p->erase(1);
  p->on_hit(1);  // page 1: interval 1 tick
  p->erase(0);
  p->on_hit(0);  // page 0: interval 102 ticks
  p->insert(0, ReuseHint::unknown);
  p->insert(1, ReuseHint::unknown);  // both released now; page 1 even after page 0
  EXPECT_EQ(p->evict(), 0u);         // farther predicted next use
  EXPECT_EQ(p->evict(), 1u);
}

TEST(IntervalPolicy, AShortIntervalIdleForLongIsOverdue) {
  auto p = make_interval();
  p->on_publish(7, 999, false);
  p->on_publish(0, 100, false);
  p->on_publish(1, 101, false);
  p->insert(0, ReuseHint::unknown);
  p->insert(1, ReuseHint::unknown);
  reuse_after(*p, 1, 7, 1);    // page 1: interval 3, then idle 102 ticks: score 2 x 102 + 2
  reuse_after(*p, 0, 7, 100);  // page 0: interval 104, idle 1 tick: score 2 x 1 + 64
  EXPECT_EQ(p->evict(), 1u);
  EXPECT_EQ(p->evict(), 0u);
}

TEST(IntervalPolicy, OverdueContentGoesBeforeFreshContent) {
  auto p = make_interval();
  p->on_publish(7, 999, false);
  p->on_publish(0, 100, false);
  p->insert(0, ReuseHint::unknown);
  reuse_after(*p, 0, 7, 1);  // interval 2: expected back soon
  tick(*p, 7, 300);          // ... but idle for 300 ticks: score 2 x 300 + 2
  p->on_publish(1, 200, false);
  p->insert(1, ReuseHint::unknown);  // fresh: score 2 x 0 + 512
  EXPECT_EQ(p->evict(), 0u);
}

TEST(IntervalPolicy, GhostKeepsTheHistoryOfEvictedContent) {
  auto p = make_interval();
  p->on_publish(7, 999, false);
  p->on_publish(0, 100, false);
  p->insert(0, ReuseHint::unknown);
  reuse_after(*p, 0, 7, 1);
  EXPECT_EQ(p->evict(), 0u);  // content 100 (used twice) leaves the pool
  // Content 100 comes back in page 3: its history resumes (3 uses, interval
  // ~2 ticks), so fresh content 200 still goes first.
  p->on_publish(3, 100, false);
  p->insert(3, ReuseHint::unknown);
  p->on_publish(1, 200, false);
  p->insert(1, ReuseHint::unknown);
  EXPECT_EQ(p->evict(), 1u);
  EXPECT_EQ(p->evict(), 3u);
}

TEST(IntervalPolicy, WithinABucketTheOldestGoesFirst) {
  auto p = make_interval();
  for (std::uint32_t page = 0; page < 4; ++page) {
    p->on_publish(page, 100 + page, false);
    p->insert(page, ReuseHint::unknown);
  }
  for (std::uint32_t page = 0; page < 4; ++page) {
    EXPECT_TRUE(p->contains(page));
    EXPECT_EQ(p->evict(), page);  // all fresh: least recently released first
  }
  EXPECT_FALSE(p->contains(0));
}

}  // namespace
}  // namespace kvcache::prefix
