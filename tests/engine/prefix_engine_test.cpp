// End-to-end tests of prefix caching through the engine: requests that share
// a long prompt prefix reuse cached pages (the scheduler attaches them at
// admission, also when a preempted request resumes), and greedy generation
// must still equal the no-cache reference token for token, logits within
// 1e-4 relative. At the end no sequence is claimed and every page is either
// free or an evictable cache entry.

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/reference.h"
#include "kvcache/engine/scheduler.h"
#include "kvcache/paged_manager.h"

namespace kvcache::engine {
namespace {

using test_ref::expect_matches_reference;
using test_ref::random_prompt;
using test_ref::tiny_model;

struct PrefixCase {
  std::string name;
  std::uint32_t page_size;
  std::uint32_t pages;
  std::uint32_t max_num_tokens;  // small: chunked prefill
  std::uint32_t prefix_len;      // shared prompt prefix
  std::uint32_t max_new;         // outputs are 1..max_new tokens
  bool expect_preemption;
  bool expect_eviction;  // the pool is small enough that cached pages get evicted
};

std::unique_ptr<PagedKVCacheManager> prefix_manager(std::uint32_t page_size, std::uint32_t pages) {
  KVCacheParams p = tiny_model().config().cache_params(CacheStrategy::paged, page_size);
  p.enable_prefix_caching = true;
  return std::make_unique<PagedKVCacheManager>(p, pages, 16, 256);
}

// Nothing claimed, nothing leaked: every page free or cached; after a cache
// reset every page is free.
void expect_clean(PagedKVCacheManager& m) {
  EXPECT_EQ(m.num_active_sequences(), 0u);
  m.check_invariants();
  const PrefixCacheMetrics pm = m.metrics();
  EXPECT_EQ(pm.pages_used, 0u);
  EXPECT_EQ(pm.pages_free + pm.pages_cached, m.total_blocks());
  m.reset_prefix_cache();
  m.check_invariants();
  EXPECT_EQ(m.free_blocks(), m.total_blocks());
}

class PrefixEndToEnd : public ::testing::TestWithParam<PrefixCase> {};

TEST_P(PrefixEndToEnd, SharedPrefixReuseEqualsNoCacheReference) {
  const PrefixCase& c = GetParam();
  auto manager = prefix_manager(c.page_size, c.pages);
  SchedulerConfig sc;
  sc.max_num_tokens = c.max_num_tokens;
  sc.max_num_seqs = 8;
  sc.watermark = 0;
  sc.prefix_caching = true;
  sc.record_logits = true;
  Scheduler scheduler(tiny_model(), *manager, sc);
  std::mt19937 rng(17);
  const std::vector<TokenId> shared = random_prompt(rng, c.prefix_len);
  std::vector<std::vector<TokenId>> prompts;
  auto add = [&](std::uint32_t n) {
    for (std::uint32_t i = 0; i < n; ++i) {
      Request r;
      r.id = prompts.size();
      r.prompt = shared;
      const std::vector<TokenId> tail = random_prompt(rng, 1 + rng() % 12);
      r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
      r.max_new_tokens = 1 + rng() % c.max_new;
      prompts.push_back(r.prompt);
      scheduler.add_request(std::move(r));
    }
  };
  // One request alone fills the cache; then a burst, then arrivals while
  // others run (mixed prefill / decode batches).
  add(1);
  scheduler.run_to_completion();
  add(4);
  for (int round = 0; round < 4; ++round) {
    scheduler.step();
    scheduler.step();
    add(2);
  }
  scheduler.run_to_completion();
  const std::vector<RequestOutput> done = scheduler.take_finished();
  ASSERT_EQ(done.size(), prompts.size());
  std::uint64_t hits = 0;
  for (const RequestOutput& out : done) {
    expect_matches_reference(prompts[out.id], out);
    hits += out.prefix_hit_tokens;
  }
  const SchedulerStats& st = scheduler.stats();
  EXPECT_EQ(st.prefix_hit_tokens, hits);
  // The shared prefix's full pages are reused by later requests.
  const std::uint32_t full = c.prefix_len / c.page_size * c.page_size;
  EXPECT_GE(st.prefix_hit_tokens, full);
  EXPECT_GT(manager->metrics().reused_tokens, 0u);
  // Reused tokens are not recomputed. (A resumed sequence whose cache covers
  // all but its last generated token computes that one as a decode.)
  if (c.expect_preemption) {
    EXPECT_LE(st.prefill_tokens + st.prefix_hit_tokens, st.admitted_prompt_tokens);
  } else {
    EXPECT_EQ(st.prefill_tokens + st.prefix_hit_tokens, st.admitted_prompt_tokens);
  }
  if (c.expect_preemption) {
    EXPECT_GT(st.preemptions, 0u);
    std::uint32_t resumed_with_hits = 0;
    for (const RequestOutput& out : done) {
      if (out.preemptions > 0 && out.prefix_hit_tokens > 0) ++resumed_with_hits;
    }
    EXPECT_GT(resumed_with_hits, 0u);
  }
  if (c.expect_eviction) {
    EXPECT_GT(manager->metrics().evictions, 0u);
  }
  expect_clean(*manager);
}

// Request::reuse_hint reaches the prefix cache: A (likely) and B (unlikely)
// finish, then C needs pages beyond the free ones. With the tiered policy
// B's pages go although A finished first; without hints A's go (LRU order).
std::pair<std::uint32_t, std::uint32_t> cached_after_pressure(ReuseHint a_hint, ReuseHint b_hint) {
  KVCacheParams p = tiny_model().config().cache_params(CacheStrategy::paged, 4);
  p.enable_prefix_caching = true;
  PrefixCacheConfig pc;
  pc.policy = EvictionPolicyKind::tiered;
  PagedKVCacheManager manager(p, 7, 4, 64, pc);
  SchedulerConfig sc;
  sc.max_num_seqs = 4;
  sc.watermark = 0;
  sc.prefix_caching = true;
  Scheduler scheduler(tiny_model(), manager, sc);
  std::mt19937 rng(5);
  const std::vector<TokenId> a = random_prompt(rng, 9), b = random_prompt(rng, 9),
                             c = random_prompt(rng, 16);
  auto run = [&](const std::vector<TokenId>& prompt, ReuseHint hint) {
    Request r;
    r.prompt = prompt;
    r.max_new_tokens = 1;
    r.reuse_hint = hint;
    scheduler.add_request(std::move(r));
    scheduler.run_to_completion();
  };
  run(a, a_hint);
  run(b, b_hint);
  EXPECT_EQ(manager.metrics().pages_cached, 4u);  // 2 full pages each
  run(c, ReuseHint::unknown);
  EXPECT_GT(manager.metrics().evictions, 0u);
  EXPECT_EQ(scheduler.take_finished().size(), 3u);
  auto cached = [&](const std::vector<TokenId>& prompt) {
    const SeqId s = manager.claim(1)[0];
    std::vector<std::uint32_t> tokens(prompt.begin(), prompt.end());
    const std::uint32_t n = manager.match_prefix(s, tokens);
    manager.release(s);
    return n;
  };
  const auto result = std::make_pair(cached(a), cached(b));
  expect_clean(manager);
  return result;
}

TEST(PrefixEngine, ReuseHintKeepsTheLikelyPromptCached) {
  const auto [a_hinted, b_hinted] = cached_after_pressure(ReuseHint::likely, ReuseHint::unlikely);
  EXPECT_EQ(a_hinted, 8u);
  EXPECT_LT(b_hinted, 8u);
  const auto [a_plain, b_plain] = cached_after_pressure(ReuseHint::unknown, ReuseHint::unknown);
  EXPECT_LT(a_plain, 8u);
  EXPECT_EQ(b_plain, 8u);
}

INSTANTIATE_TEST_SUITE_P(Engine, PrefixEndToEnd,
                         ::testing::Values(
                             // 56-token prefix: 3 full pages of 16 and a partial one.
                             PrefixCase{"page16", 16, 200, 256, 56, 8, false, false},
                             PrefixCase{"page16_chunked", 16, 200, 9, 56, 8, false, false},
                             PrefixCase{"page1", 1, 2000, 256, 56, 8, false, false},
                             PrefixCase{"page1_chunked", 1, 2000, 7, 56, 8, false, false},
                             // A pool that holds few sequences: cached pages are evicted and
                             // reused, decode growth forces preemption and recompute.
                             PrefixCase{"page16_tight", 16, 12, 64, 56, 12, false, true},
                             PrefixCase{"page4_preemption", 4, 24, 32, 24, 12, true, true},
                             PrefixCase{"page1_preemption", 1, 120, 16, 24, 12, true, true}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kvcache::engine
