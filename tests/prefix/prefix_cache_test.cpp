// Prefix caching in PagedKVCacheManager: reuse, collisions, eviction,
// pinning, fork / copy-on-write, truncate, metrics, events, strong guarantee.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>

#include "kvcache/continuous_manager.h"
#include "prefix/prefix_test_util.h"
#include "test_util.h"

namespace kvcache {
namespace {

using testing::iota_tokens;
using testing::run_prompt;
using testing::seq_kv_matches;
using testing::tiny_params;

TEST(PrefixCache, MatchPrefixNeedsPrefixCaching) {
  KVCacheParams p = tiny_params();
  p.enable_prefix_caching = false;
  PagedKVCacheManager m(p, 8, 4, 64);
  const SeqId s = m.claim(1)[0];
  const std::vector<std::uint32_t> prompt = iota_tokens(9, 1);
  try {
    m.match_prefix(s, prompt);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("enable_prefix_caching"), std::string::npos);
  }
}

TEST(PrefixCache, ReusesFullPagesAndLeavesOneTokenToCompute) {
  PagedKVCacheManager m(tiny_params(4), 16, 4, 64);
  const std::vector<std::uint32_t> prompt = iota_tokens(12, 100);  // exactly 3 pages
  std::uint32_t reused = 99;
  const SeqId a = run_prompt(m, prompt, &reused);
  EXPECT_EQ(reused, 0u);
  m.release(a);
  EXPECT_EQ(m.metrics().pages_cached, 3u);
  const SeqId b = run_prompt(m, prompt, &reused);
  EXPECT_EQ(reused, 8u);  // 3 full pages cached, but one token must be computed
  EXPECT_TRUE(seq_kv_matches(m, b, prompt));
  m.check_invariants();
  const PrefixCacheMetrics mm = m.metrics();
  EXPECT_EQ(mm.prompt_tokens, 24u);
  EXPECT_EQ(mm.reused_tokens, 8u);
  EXPECT_DOUBLE_EQ(mm.hit_rate(), 8.0 / 24.0);
}

TEST(PrefixCache, DivergingPromptsShareOnlyTheCommonPages) {
  PagedKVCacheManager m(tiny_params(4), 32, 4, 64);
  std::vector<std::uint32_t> a = iota_tokens(13, 1), b = a;
  b[6] = 999;  // differs inside page 1
  m.release(run_prompt(m, a));
  std::uint32_t reused = 0;
  const SeqId sb = run_prompt(m, b, &reused);
  EXPECT_EQ(reused, 4u);
  EXPECT_TRUE(seq_kv_matches(m, sb, b));
  m.check_invariants();
}

TEST(PrefixCache, ExtraKeyIsolatesTenants) {
  PagedKVCacheManager m(tiny_params(4), 32, 4, 64);
  const std::vector<std::uint32_t> prompt = iota_tokens(9, 5);
  m.release(run_prompt(m, prompt, nullptr, /*extra_key=*/1));
  std::uint32_t reused = 0;
  m.release(run_prompt(m, prompt, &reused, /*extra_key=*/2));
  EXPECT_EQ(reused, 0u);
  m.release(run_prompt(m, prompt, &reused, /*extra_key=*/1));
  EXPECT_EQ(reused, 8u);
}

// A deliberately terrible hash: every page collides. Matching must still
// never hand out another prompt's K/V.
TEST(PrefixCache, HashCollisionsNeverShareWrongData) {
  PrefixCacheConfig cfg;
  cfg.hash = [](std::uint64_t, std::span<const std::uint32_t>, std::uint64_t) {
    return std::uint64_t{42};
  };
  PagedKVCacheManager m(tiny_params(4), 32, 4, 64, cfg);
  const std::vector<std::uint32_t> a = iota_tokens(13, 1), b = iota_tokens(13, 500);
  m.release(run_prompt(m, a));
  m.check_invariants();
  std::uint32_t reused = 7;
  const SeqId sb = run_prompt(m, b, &reused);
  EXPECT_EQ(reused, 0u);
  EXPECT_TRUE(seq_kv_matches(m, sb, b));
  m.release(sb);
  // a's first page is the only indexed entry: a reuses exactly it.
  const SeqId sa = run_prompt(m, a, &reused);
  EXPECT_EQ(reused, 4u);
  EXPECT_TRUE(seq_kv_matches(m, sa, a));
  m.check_invariants();
}

// Weak hash that collides across pages with the same first token: the
// parent check must stop a chain that continues from a different prefix.
TEST(PrefixCache, CollisionWithDifferentParentIsRejected) {
  PrefixCacheConfig cfg;
  cfg.hash = [](std::uint64_t, std::span<const std::uint32_t> t, std::uint64_t) {
    return std::uint64_t{t[0]} % 3;
  };
  PagedKVCacheManager m(tiny_params(2), 64, 4, 64, cfg);
  const std::vector<std::uint32_t> a = {1, 2, 3, 4, 5, 6, 7};
  const std::vector<std::uint32_t> b = {4, 4, 3, 4, 5, 6, 7};  // page 1 equal, page 0 differs
  m.release(run_prompt(m, a));
  std::uint32_t reused = 9;
  const SeqId sb = run_prompt(m, b, &reused);
  EXPECT_EQ(reused, 0u);
  EXPECT_TRUE(seq_kv_matches(m, sb, b));
  m.check_invariants();
}

TEST(PrefixCache, EvictsOnlyWhenFreeListIsEmptyAndNeverPagesInUse) {
  PagedKVCacheManager m(tiny_params(4), 6, 4, 64);
  const std::vector<std::uint32_t> a = iota_tokens(8, 1), b = iota_tokens(8, 100);
  m.release(run_prompt(m, a));        // 2 cached pages
  const SeqId sb = run_prompt(m, b);  // 2 pages in use, 2 free
  EXPECT_EQ(m.metrics().evictions, 0u);
  // Needs 4 pages: 2 free + 2 evicted (a's pages), never b's.
  const SeqId c = m.claim(1)[0];
  const std::uint32_t n = 17;
  EXPECT_THROW(m.fetch(std::span(&c, 1), std::span(&n, 1)), OutOfPages);  // 5 > 4 available
  const std::uint32_t n2 = 13;
  m.fetch(std::span(&c, 1), std::span(&n2, 1));
  EXPECT_EQ(m.metrics().evictions, 2u);
  EXPECT_TRUE(seq_kv_matches(m, sb, b));
  m.check_invariants();
}

TEST(PrefixCache, LruEvictsTheTailOfASequenceFirst) {
  PagedKVCacheManager m(tiny_params(4), 4, 4, 64);
  const std::vector<std::uint32_t> a = iota_tokens(16, 1);  // 4 pages
  m.release(run_prompt(m, a));
  const SeqId c = m.claim(1)[0];
  const std::uint32_t one = 1;
  m.fetch(std::span(&c, 1), std::span(&one, 1));  // evicts one page: a's tail
  m.release(c);
  std::uint32_t reused = 0;
  m.release(run_prompt(m, a, &reused));
  EXPECT_EQ(reused, 12u);  // head three pages survived
  m.check_invariants();
}

TEST(PrefixCache, PinnedPrefixOutlivesUnpinnedPages) {
  PagedKVCacheManager m(tiny_params(4), 4, 4, 64);
  const std::vector<std::uint32_t> sys = iota_tokens(8, 1), other = iota_tokens(8, 50);
  m.release(run_prompt(m, sys));
  EXPECT_EQ(m.pin_prefix(sys, 5), 8u);
  m.release(run_prompt(m, other));  // cached later: LRU alone would evict sys first
  EXPECT_EQ(m.metrics().pages_pinned, 2u);
  const SeqId c = m.claim(1)[0];
  const std::uint32_t n = 8;
  m.fetch(std::span(&c, 1), std::span(&n, 1));  // evicts two pages
  m.release(c);
  m.check_invariants();
  std::uint32_t reused = 0;
  m.release(run_prompt(m, sys, &reused));
  EXPECT_EQ(reused, 4u);  // (8 - 1) / 4 pages
  EXPECT_EQ(m.pin_prefix(sys, 0), 8u);
  EXPECT_EQ(m.metrics().pages_pinned, 0u);
  m.check_invariants();
}

TEST(PrefixCache, ForkSharesPagesAndCopiesOnWrite) {
  PagedKVCacheManager m(tiny_params(4), 16, 4, 64);
  std::vector<std::uint32_t> toks = iota_tokens(6, 1);  // one full page + 2 tokens
  const SeqId parent = run_prompt(m, toks);
  const SeqId child = m.fork(parent);
  EXPECT_EQ(m.cache_length(child), 6u);
  EXPECT_EQ(m.free_blocks(), 14u);  // nothing copied yet
  m.check_invariants();
  // Both write a different token at position 6 into the shared partial page.
  std::vector<std::uint32_t> tp = toks, tc = toks;
  tp.push_back(70);
  tc.push_back(80);
  const std::uint32_t one = 1;
  for (auto [seq, t] : {std::pair{parent, &tp}, std::pair{child, &tc}}) {
    const KVCacheBatch batch = m.fetch(std::span(&seq, 1), std::span(&one, 1));
    testing::write_kv(batch, 0, *t, 6, 7);
    m.step(std::span(&seq, 1), std::span(&one, 1), std::span(t->data() + 6, 1));
  }
  EXPECT_EQ(m.metrics().cow_copies, 1u);
  EXPECT_TRUE(seq_kv_matches(m, parent, tp));
  EXPECT_TRUE(seq_kv_matches(m, child, tc));
  m.check_invariants();
  m.release(parent);
  m.release(child);
  m.check_invariants();
}

// The page table of a live sequence, from the manager's snapshot.
std::vector<std::uint32_t> pages_of(const PagedKVCacheManager& m, SeqId s) {
  for (const SequenceSnapshot& q : m.snapshot().sequences)
    if (q.id == s) return q.blocks;
  return {};
}

TEST(PrefixCache, FetchReportsItsCopyOnWriteCopies) {
  PagedKVCacheManager m(tiny_params(4), 16, 4, 64);
  const std::vector<std::uint32_t> toks = iota_tokens(6, 1);  // one full page + 2 tokens
  const SeqId parent = run_prompt(m, toks);
  const SeqId child1 = m.fork(parent), child2 = m.fork(parent);
  const std::uint32_t shared = pages_of(m, parent).at(1);  // the partial page, 3 holders

  // parent and child1 both write into it: two copies, in batch order; the
  // writer gets the copy, the page stays with child2.
  const std::vector<SeqId> both = {parent, child1};
  const std::vector<std::uint32_t> ones = {1, 1};
  KVCacheBatch batch = m.fetch(both, ones);
  ASSERT_EQ(batch.block_copies().size(), 2u);
  const BlockCopy first = batch.block_copies()[0], second = batch.block_copies()[1];
  EXPECT_EQ(first.src, shared);
  EXPECT_EQ(second.src, shared);
  EXPECT_EQ(batch.lookup_table()[1], first.dst);
  EXPECT_EQ(batch.lookup_table()[batch.lookup_stride() + 1], second.dst);
  EXPECT_NE(first.dst, second.dst);
  EXPECT_EQ(pages_of(m, child2).at(1), shared);
  EXPECT_EQ(m.metrics().cow_copies, 2u);
  // The host copies were made: both hold the shared tokens' data.
  EXPECT_TRUE(testing::kv_matches(batch, 0, toks));
  EXPECT_TRUE(testing::kv_matches(batch, 1, toks));

  // A failed fetch into the same batch leaves it, copies included, unchanged.
  const std::uint32_t too_many = 58;  // 64 tokens: 16 pages, 12 free
  EXPECT_THROW(m.fetch_into(batch, std::span(&child2, 1), std::span(&too_many, 1)), OutOfPages);
  ASSERT_EQ(batch.block_copies().size(), 2u);
  EXPECT_EQ(batch.block_copies()[0], first);

  // child2 now holds the page alone: writing into it copies nothing, and the
  // reused batch no longer lists the earlier copies.
  const std::uint32_t one = 1;
  m.fetch_into(batch, std::span(&child2, 1), std::span(&one, 1));
  EXPECT_TRUE(batch.block_copies().empty());
  EXPECT_EQ(batch.lookup_table()[1], shared);
  EXPECT_EQ(m.metrics().cow_copies, 2u);
  for (SeqId s : {parent, child1, child2}) m.release(s);
  m.check_invariants();
}

TEST(PrefixCache, FetchReportsTheCopyOfAPageCutByTruncate) {
  PagedKVCacheManager m(tiny_params(4), 16, 4, 64);
  const std::vector<std::uint32_t> toks = iota_tokens(9, 1);
  const SeqId a = run_prompt(m, toks);
  std::uint32_t reused = 0;
  const SeqId b = run_prompt(m, toks, &reused);  // shares a's two full pages
  ASSERT_EQ(reused, 8u);
  const std::uint32_t page0 = pages_of(m, a).at(0);
  ASSERT_EQ(pages_of(m, b).at(0), page0);
  m.truncate(b, 2);  // b keeps page 0, still shared with a, and will write into it
  const std::uint32_t one = 1;
  const KVCacheBatch batch = m.fetch(std::span(&b, 1), std::span(&one, 1));
  ASSERT_EQ(batch.block_copies().size(), 1u);
  EXPECT_EQ(batch.block_copies()[0].src, page0);
  EXPECT_EQ(batch.block_copies()[0].dst, batch.lookup_table()[0]);
  EXPECT_EQ(pages_of(m, a).at(0), page0);  // a keeps the original
  m.release(a);
  m.release(b);
  m.check_invariants();
}

TEST(PrefixCache, FetchWithoutSharingReportsNoCopies) {
  PagedKVCacheManager m(tiny_params(4), 16, 4, 64);
  const SeqId s = m.claim(1)[0];
  const std::uint32_t n = 7;
  EXPECT_TRUE(m.fetch(std::span(&s, 1), std::span(&n, 1)).block_copies().empty());
  KVCacheParams cp = tiny_params(4);
  cp.cache_strategy = CacheStrategy::continuous;
  cp.enable_prefix_caching = false;
  ContinuousBatchingKVCacheManager c(cp, 2, 32);
  const SeqId cs = c.claim(1)[0];
  EXPECT_TRUE(c.fetch(std::span(&cs, 1), std::span(&n, 1)).block_copies().empty());
}

TEST(PrefixCache, TruncateUnpublishesTheCutPageAndRollsBack) {
  std::vector<PageEvent::Kind> events;
  PrefixCacheConfig cfg;
  cfg.on_event = [&](const PageEvent& e) { events.push_back(e.kind); };
  PagedKVCacheManager m(tiny_params(4), 16, 4, 64, cfg);
  const std::vector<std::uint32_t> toks = iota_tokens(12, 1);
  const SeqId s = run_prompt(m, toks);
  EXPECT_EQ(events.size(), 3u);
  m.truncate(s, 6);  // page 2 released (stays cached), page 1 cut: unpublished
  EXPECT_EQ(m.cache_length(s), 6u);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events.back(), PageEvent::Kind::removed);
  m.check_invariants();
  std::vector<std::uint32_t> t2(toks.begin(), toks.begin() + 6);
  t2.push_back(77);
  const std::uint32_t one = 1;
  const KVCacheBatch batch = m.fetch(std::span(&s, 1), std::span(&one, 1));
  testing::write_kv(batch, 0, t2, 6, 7);
  m.step(std::span(&s, 1), std::span(&one, 1), std::span(t2.data() + 6, 1));
  EXPECT_TRUE(seq_kv_matches(m, s, t2));
  EXPECT_THROW(m.truncate(s, 8), InvalidArgument);
  m.check_invariants();
}

TEST(PrefixCache, FailingCallsLeaveSnapshotUnchanged) {
  PagedKVCacheManager m(tiny_params(4), 4, 4, 64);
  const std::vector<std::uint32_t> toks = iota_tokens(9, 1);
  const SeqId s = run_prompt(m, toks);
  const ManagerSnapshot before = m.snapshot();
  const PrefixCacheMetrics mbefore = m.metrics();
  EXPECT_THROW(m.match_prefix(s, toks), InvalidArgument);  // not fresh
  EXPECT_THROW(m.match_prefix(999, toks), UnknownSequence);
  const std::uint32_t big = 20;
  EXPECT_THROW(m.fetch(std::span(&s, 1), std::span(&big, 1)), OutOfPages);
  const std::uint32_t two = 2;
  const std::vector<std::uint32_t> one_token = {5};
  EXPECT_THROW(m.step(std::span(&s, 1), std::span(&two, 1), one_token), InvalidArgument);
  EXPECT_THROW(m.truncate(s, 10), InvalidArgument);
  EXPECT_EQ(m.snapshot(), before);
  EXPECT_EQ(m.metrics().reused_tokens, mbefore.reused_tokens);
  m.check_invariants();
}

TEST(PrefixCache, ResetDropsEveryEntryAndMetricsAddUp) {
  int stored = 0, removed = 0;
  PrefixCacheConfig cfg;
  cfg.on_event = [&](const PageEvent& e) {
    (e.kind == PageEvent::Kind::stored ? stored : removed)++;
  };
  PagedKVCacheManager m(tiny_params(4), 16, 4, 64, cfg);
  m.release(run_prompt(m, iota_tokens(9, 1)));
  const SeqId s = run_prompt(m, iota_tokens(9, 100));
  PrefixCacheMetrics mm = m.metrics();
  EXPECT_EQ(mm.pages_cached, 2u);
  EXPECT_EQ(mm.pages_used, 3u);
  EXPECT_EQ(mm.pages_free + mm.pages_used + mm.pages_cached, mm.pages_total);
  m.reset_prefix_cache();
  EXPECT_EQ(stored, 4);
  EXPECT_EQ(removed, 4);
  mm = m.metrics();
  EXPECT_EQ(mm.pages_cached, 0u);
  EXPECT_EQ(mm.pages_free, 13u);
  EXPECT_TRUE(m.snapshot().cached_blocks.empty());
  m.check_invariants();
  m.release(s);
  EXPECT_EQ(m.free_blocks(), 16u);
}

TEST(PrefixCache, EveryPolicyKeepsInvariantsUnderPressure) {
  for (EvictionPolicyKind kind :
       {EvictionPolicyKind::lru, EvictionPolicyKind::s3fifo, EvictionPolicyKind::tiered,
        EvictionPolicyKind::interval, EvictionPolicyKind::adaptive}) {
    PrefixCacheConfig cfg;
    cfg.policy = kind;
    PagedKVCacheManager m(tiny_params(4), 10, 4, 64, cfg);
    for (std::uint32_t i = 0; i < 40; ++i) {
      const std::vector<std::uint32_t> t = iota_tokens(9 + i % 7, (i % 5) * 1000);
      std::uint32_t reused = 0;
      const SeqId s = run_prompt(m, t, &reused);
      ASSERT_TRUE(seq_kv_matches(m, s, t)) << policy_name(kind) << " request " << i;
      m.release(s);
      m.check_invariants();
    }
    // (S3-FIFO's probation queue is one page here: it may reuse nothing.)
    if (kind != EvictionPolicyKind::s3fifo) {
      EXPECT_GT(m.metrics().reused_tokens, 0u) << policy_name(kind);
    }
    EXPECT_GT(m.metrics().evictions, 0u) << policy_name(kind);
  }
}

// A configuration value out of range is refused by the constructor with its
// name and range, whichever policy is chosen (LRU reads neither field).
TEST(PrefixCache, BadConfigIsRefusedForEveryPolicy) {
  for (EvictionPolicyKind kind :
       {EvictionPolicyKind::lru, EvictionPolicyKind::s3fifo, EvictionPolicyKind::tiered,
        EvictionPolicyKind::interval, EvictionPolicyKind::adaptive}) {
    for (double ghost : {-1.0, 64.5, std::nan("")}) {
      PrefixCacheConfig cfg;
      cfg.policy = kind;
      cfg.ghost_factor = ghost;
      KV_EXPECT_THROW(PagedKVCacheManager(tiny_params(4), 10, 4, 64, cfg), InvalidArgument,
                      "ghost_factor", "[0, 64]");
    }
    for (double small : {0.0, 1.0, std::nan("")}) {
      PrefixCacheConfig cfg;
      cfg.policy = kind;
      cfg.s3fifo_small_fraction = small;
      KV_EXPECT_THROW(PagedKVCacheManager(tiny_params(4), 10, 4, 64, cfg), InvalidArgument,
                      "s3fifo_small_fraction", "(0, 1)");
    }
    PrefixCacheConfig edges;  // both ends of the ghost range are allowed
    edges.policy = kind;
    edges.ghost_factor = 0.0;
    EXPECT_NO_THROW(PagedKVCacheManager(tiny_params(4), 10, 4, 64, edges));
    edges.ghost_factor = 64.0;
    EXPECT_NO_THROW(PagedKVCacheManager(tiny_params(4), 10, 4, 64, edges));
  }
}

TEST(PrefixCache, PolicyNamesRoundTrip) {
  for (auto k : {EvictionPolicyKind::lru, EvictionPolicyKind::s3fifo, EvictionPolicyKind::tiered,
                 EvictionPolicyKind::interval, EvictionPolicyKind::adaptive})
    EXPECT_EQ(parse_policy(policy_name(k)), k);
  EXPECT_THROW(parse_policy("belady"), InvalidArgument);
}

}  // namespace
}  // namespace kvcache
