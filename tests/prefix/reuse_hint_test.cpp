// Release hints (ReuseHint): the tiered policy evicts `unlikely` pages used
// once first, then unhinted ones, and keeps `likely` ones with the reused
// pages; other policies ignore hints; a bad hint throws and changes nothing.
#include <gtest/gtest.h>

#include <vector>

#include "kvcache/error.h"
#include "prefix/eviction_policy.h"
#include "prefix/prefix_test_util.h"

namespace kvcache {
namespace {

using prefix::EvictionPolicy;
using testing::iota_tokens;
using testing::run_prompt;
using testing::seq_kv_matches;
using testing::tiny_params;

std::unique_ptr<EvictionPolicy> policy(EvictionPolicyKind kind, std::uint32_t pages) {
  PrefixCacheConfig cfg;
  cfg.policy = kind;
  auto p = prefix::make_policy(cfg, pages);
  for (std::uint32_t page = 0; page < pages; ++page) p->on_publish(page, 1000 + page, false);
  return p;
}

std::vector<std::uint32_t> evict_all(EvictionPolicy& p) {
  std::vector<std::uint32_t> order;
  while (p.size() > 0) order.push_back(p.evict());
  return order;
}

TEST(ReuseHint, TieredEvictsUnlikelyThenUnhintedThenLikely) {
  auto p = policy(EvictionPolicyKind::tiered, 6);
  p->insert(0, ReuseHint::likely);
  p->insert(1, ReuseHint::unknown);
  p->insert(2, ReuseHint::unlikely);
  p->insert(3, ReuseHint::unknown);
  p->insert(4, ReuseHint::unlikely);
  p->insert(5, ReuseHint::likely);
  EXPECT_EQ(evict_all(*p), (std::vector<std::uint32_t>{2, 4, 1, 3, 0, 5}));
}

TEST(ReuseHint, ReuseOutranksAnUnlikelyHint) {
  auto p = policy(EvictionPolicyKind::tiered, 3);
  p->on_hit(0);  // a second request used page 0
  p->insert(0, ReuseHint::unlikely);
  p->insert(1, ReuseHint::unknown);
  p->insert(2, ReuseHint::unlikely);
  EXPECT_EQ(evict_all(*p), (std::vector<std::uint32_t>{2, 1, 0}));
}

TEST(ReuseHint, HintSticksUntilThePageIsRepublished) {
  auto p = policy(EvictionPolicyKind::tiered, 3);
  p->insert(0, ReuseHint::unlikely);
  p->insert(1, ReuseHint::unknown);
  p->erase(0);                       // e.g. pinned and unpinned again:
  p->insert(0, ReuseHint::unknown);  // re-inserted without a hint
  EXPECT_EQ(p->evict(), 0u);         // still `unlikely`: before page 1
  p->on_publish(0, 77, false);       // new content in page 0: hint forgotten
  p->insert(0, ReuseHint::unknown);
  p->insert(2, ReuseHint::likely);
  EXPECT_EQ(evict_all(*p), (std::vector<std::uint32_t>{1, 0, 2}));
}

TEST(ReuseHint, OtherPoliciesIgnoreHints) {
  for (EvictionPolicyKind kind :
       {EvictionPolicyKind::lru, EvictionPolicyKind::s3fifo, EvictionPolicyKind::interval}) {
    auto hinted = policy(kind, 5);
    auto plain = policy(kind, 5);
    const ReuseHint hints[] = {ReuseHint::likely, ReuseHint::unlikely, ReuseHint::unknown,
                               ReuseHint::unlikely, ReuseHint::likely};
    for (std::uint32_t page = 0; page < 5; ++page) {
      hinted->insert(page, hints[page]);
      plain->insert(page, ReuseHint::unknown);
    }
    EXPECT_EQ(evict_all(*hinted), evict_all(*plain)) << policy_name(kind);
  }
}

TEST(ReuseHint, NamesRoundTrip) {
  for (ReuseHint h : {ReuseHint::unknown, ReuseHint::unlikely, ReuseHint::likely})
    EXPECT_EQ(parse_reuse_hint(reuse_hint_name(h)), h);
  try {
    parse_reuse_hint("maybe");
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'maybe'"), std::string::npos) << e.what();
  }
}

// a and b: 2 full pages each once released (page size 4); the pool holds 6
// pages. A third prompt of 16 tokens needs 4 pages: the 2 free ones and 2 of
// the 4 cached ones.
struct TwoCachedPrompts {
  PagedKVCacheManager m;
  std::vector<std::uint32_t> a = iota_tokens(9, 1), b = iota_tokens(9, 100);
  explicit TwoCachedPrompts(EvictionPolicyKind kind)
      : m(tiny_params(4), 6, 4, 64, [&] {
          PrefixCacheConfig c;
          c.policy = kind;
          return c;
        }()) {}
  // Tokens of `prompt` still cached, checked against the data written for them.
  std::uint32_t cached(const std::vector<std::uint32_t>& prompt) {
    const SeqId s = m.claim(1)[0];
    const std::uint32_t reused = m.match_prefix(s, prompt);
    EXPECT_TRUE(seq_kv_matches(m, s, std::span(prompt).first(reused)));
    m.release(s);
    return reused;
  }
  // Runs the third prompt, then reports how much of a and b survived.
  std::pair<std::uint32_t, std::uint32_t> reused_after_pressure() {
    m.release(run_prompt(m, iota_tokens(16, 500)));
    EXPECT_EQ(m.metrics().evictions, 2u);
    m.check_invariants();
    return {cached(a), cached(b)};
  }
};

TEST(ReuseHint, ManagerKeepsTheLikelyPrefixUnderPressure) {
  {  // No hints: a was released first, so LRU order evicts a.
    TwoCachedPrompts t(EvictionPolicyKind::tiered);
    t.m.release(run_prompt(t.m, t.a));
    t.m.release(run_prompt(t.m, t.b));
    EXPECT_EQ(t.reused_after_pressure(), std::make_pair(0u, 8u));
  }
  {  // a likely, b unlikely: b goes although it is newer.
    TwoCachedPrompts t(EvictionPolicyKind::tiered);
    t.m.release(run_prompt(t.m, t.a), ReuseHint::likely);
    t.m.release(run_prompt(t.m, t.b), ReuseHint::unlikely);
    EXPECT_EQ(t.reused_after_pressure(), std::make_pair(8u, 0u));
  }
  {  // LRU ignores the hints.
    TwoCachedPrompts t(EvictionPolicyKind::lru);
    t.m.release(run_prompt(t.m, t.a), ReuseHint::likely);
    t.m.release(run_prompt(t.m, t.b), ReuseHint::unlikely);
    EXPECT_EQ(t.reused_after_pressure(), std::make_pair(0u, 8u));
  }
}

TEST(ReuseHint, BadHintThrowsAndReleasesNothing) {
  TwoCachedPrompts t(EvictionPolicyKind::tiered);
  const SeqId s = run_prompt(t.m, t.a);
  const ManagerSnapshot before = t.m.snapshot();
  const PrefixCacheMetrics metrics_before = t.m.metrics();
  try {
    t.m.release(s, static_cast<ReuseHint>(7));
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("reuse hint 7"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.m.snapshot(), before);
  EXPECT_EQ(t.m.metrics().pages_used, metrics_before.pages_used);
  EXPECT_TRUE(t.m.contains(s));
  EXPECT_TRUE(seq_kv_matches(t.m, s, t.a));
  EXPECT_THROW(t.m.release(s + 1000, ReuseHint::likely), UnknownSequence);
  t.m.release(s, ReuseHint::likely);
  EXPECT_FALSE(t.m.contains(s));
  t.m.check_invariants();
}

}  // namespace
}  // namespace kvcache
