// kvcache/metrics.h and KVCacheManager::stats(): exact figures after a
// scripted lifecycle (prefix hits, an eviction, a copy-on-write fork), the
// text checked line by line against the exposition format, the prefix
// checks, and readings taken while threads run the lifecycle (TSan runs
// MetricsConcurrency).
#include "kvcache/metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/kvcache.h"
#include "manager/exposition_format.h"
#include "test_util.h"

namespace {

using kvcache::CacheStrategy;
using kvcache::ManagerStats;
using kvcache::PagedKVCacheManager;
using kvtest::Ids;
using kvtest::U32;

U32 iota(std::uint32_t first, std::uint32_t n) {
  U32 v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// 4 pages of 4 tokens (f32, 1 layer, 1 KV head of 4: 32 bytes a token, 512 in all).
PagedKVCacheManager small_prefix_manager() {
  auto p = kvtest::paged_params(1, 1, 4, 4);
  p.enable_prefix_caching = true;
  return PagedKVCacheManager(p, 4, 4, 64);
}

// claim a, look up P (9 tokens: a miss), fetch + step P, release (2 pages
// published and cached); claim b, look up P (8 tokens hit), add one token;
// fork b into c, whose write into the shared partial page copies it;
// release c and b; claim d and fetch 13 tokens of other content: 2 free
// pages + 2 evicted; step them (3 more pages published).
void scripted_lifecycle(PagedKVCacheManager& m) {
  const U32 prompt = iota(1, 9);
  const Ids a = m.claim(1);
  m.match_prefix(a[0], prompt);
  m.fetch(a, U32{9});
  m.step(a, U32{9}, prompt);
  m.release(a[0]);

  const Ids b = m.claim(1);
  ASSERT_EQ(m.match_prefix(b[0], prompt), 8u);
  m.fetch(b, U32{1});
  m.step(b, U32{1}, U32{9});
  const Ids c = {m.fork(b[0])};
  const kvcache::KVCacheBatch forked = m.fetch(c, U32{1});
  ASSERT_EQ(forked.block_copies().size(), 1u);
  m.step(c, U32{1}, U32{10});
  m.release(c[0]);
  m.release(b[0]);

  const Ids d = m.claim(1);
  m.fetch(d, U32{13});
  m.step(d, U32{13}, iota(100, 13));
}

TEST(Metrics, StatsAfterScriptedLifecycle) {
  PagedKVCacheManager m = small_prefix_manager();
  scripted_lifecycle(m);
  ManagerStats want;
  want.blocks_total = 4;
  want.blocks_used = 4;  // d's 4 pages; nothing free or cached
  want.page_size = 4;
  want.active_sequences = 1;
  want.pool_bytes = 512;
  want.sequences_claimed = 3;
  want.sequences_forked = 1;
  want.sequences_released = 3;
  want.fetches = 4;
  want.steps = 4;
  want.committed_tokens = 9 + 1 + 1 + 13;
  want.prefix_lookups = 2;
  want.prefix_prompt_tokens = 18;
  want.prefix_hit_tokens = 8;
  want.blocks_published = 5;
  want.evictions = 2;
  want.cow_copies = 1;
  EXPECT_EQ(m.stats(), want);
  EXPECT_EQ(m.stats().pool_bytes, PagedKVCacheManager::estimated_memory_size(m.params(), 4));
  m.check_invariants();
}

TEST(Metrics, TextAfterScriptedLifecycle) {
  PagedKVCacheManager m = small_prefix_manager();
  scripted_lifecycle(m);
  const std::string text = kvcache::metrics_text(m);
  EXPECT_EQ(kvtest::exposition_problems(text), "");
  const std::string pool = "{strategy=\"paged\",tier=\"device\"}";
  const std::string plain = "{strategy=\"paged\"}";
  const std::map<std::string, std::uint64_t> want = {
      {"kvcache_blocks_capacity" + pool, 4},
      {"kvcache_blocks_free" + pool, 0},
      {"kvcache_blocks_used" + pool, 4},
      {"kvcache_blocks_cached" + pool, 0},
      {"kvcache_blocks_pinned" + pool, 0},
      {"kvcache_page_size" + plain, 4},
      {"kvcache_pool_bytes" + pool, 512},
      {"kvcache_sequences_active" + plain, 1},
      {"kvcache_sequences_claimed_total" + plain, 3},
      {"kvcache_sequences_forked_total" + plain, 1},
      {"kvcache_sequences_released_total" + plain, 3},
      {"kvcache_fetches_total" + plain, 4},
      {"kvcache_steps_total" + plain, 4},
      {"kvcache_committed_tokens_total" + plain, 24},
      {"kvcache_prefix_lookups_total" + plain, 2},
      {"kvcache_prefix_prompt_tokens_total" + plain, 18},
      {"kvcache_prefix_hit_tokens_total" + plain, 8},
      {"kvcache_prefix_published_blocks_total" + plain, 5},
      {"kvcache_evictions_total" + pool, 2},
      {"kvcache_cow_copies_total" + plain, 1},
  };
  EXPECT_EQ(kvtest::exposition_samples(text), want);
  EXPECT_NE(text.find("# HELP kvcache_evictions_total Cached blocks evicted to make room.\n"
                      "# TYPE kvcache_evictions_total counter\n"
                      "kvcache_evictions_total{strategy=\"paged\",tier=\"device\"} 2\n"),
            std::string::npos)
      << text;
}

TEST(Metrics, CachedAndPinnedBlocksBeforeEviction) {
  PagedKVCacheManager m = small_prefix_manager();
  const U32 prompt = iota(1, 9);
  const Ids a = m.claim(1);
  m.fetch(a, U32{9});
  m.step(a, U32{9}, prompt);
  m.release(a[0]);
  EXPECT_EQ(m.pin_prefix(prompt, 1), 8u);
  const ManagerStats s = m.stats();
  EXPECT_EQ(s.blocks_free, 2u);
  EXPECT_EQ(s.blocks_cached, 2u);
  EXPECT_EQ(s.blocks_pinned, 2u);
  EXPECT_EQ(s.blocks_used, 0u);
  EXPECT_EQ(s.sequences_released, 1u);
}

TEST(Metrics, ResetMetricsZeroesPrefixCountersOnly) {
  PagedKVCacheManager m = small_prefix_manager();
  scripted_lifecycle(m);
  m.reset_metrics();
  const ManagerStats s = m.stats();
  EXPECT_EQ(s.prefix_lookups, 0u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.cow_copies, 0u);
  EXPECT_EQ(s.blocks_published, 0u);
  EXPECT_EQ(s.fetches, 4u);  // lifecycle counters run on
  EXPECT_EQ(s.sequences_claimed, 3u);
}

TEST(Metrics, RefusedCallsCountNothing) {
  PagedKVCacheManager m = small_prefix_manager();
  const Ids a = m.claim(1);
  const ManagerStats before = m.stats();
  EXPECT_THROW(m.fetch(a, U32{65}), kvcache::CapacityExceeded);
  EXPECT_THROW(m.step(a, U32{1}, U32{7}), kvcache::CapacityExceeded);
  EXPECT_THROW(m.release(a[0] + 1), kvcache::UnknownSequence);
  EXPECT_THROW(m.claim(4), kvcache::CapacityExceeded);
  EXPECT_EQ(m.stats(), before);
}

TEST(Metrics, ContinuousManager) {
  kvcache::ContinuousBatchingKVCacheManager m(kvtest::continuous_params(2, 1, 8), 3, 16);
  const Ids s = m.claim(2);
  m.fetch(s, U32{5, 3});
  m.step(s, U32{5, 3});
  m.release(s[1]);
  const std::string text = kvcache::metrics_text(m, "engine:kv");
  EXPECT_EQ(kvtest::exposition_problems(text), "");
  const auto samples = kvtest::exposition_samples(text);
  const std::string pool = "{strategy=\"continuous\",tier=\"device\"}";
  const std::string plain = "{strategy=\"continuous\"}";
  EXPECT_EQ(samples.at("engine:kv_blocks_capacity" + pool), 3u);
  EXPECT_EQ(samples.at("engine:kv_blocks_free" + pool), 2u);
  EXPECT_EQ(samples.at("engine:kv_blocks_used" + pool), 1u);
  EXPECT_EQ(samples.at("engine:kv_blocks_cached" + pool), 0u);
  EXPECT_EQ(samples.at("engine:kv_page_size" + plain), 16u);
  // 3 slots x 16 tokens x (K, V) x 2 layers x 8 floats.
  EXPECT_EQ(samples.at("engine:kv_pool_bytes" + pool), 3u * 16 * 2 * 2 * 8 * 4);
  EXPECT_EQ(samples.at("engine:kv_sequences_claimed_total" + plain), 2u);
  EXPECT_EQ(samples.at("engine:kv_committed_tokens_total" + plain), 8u);
  EXPECT_EQ(samples.at("engine:kv_prefix_lookups_total" + plain), 0u);
  EXPECT_EQ(samples.size(), kvcache::metric_catalog().size());
}

TEST(Metrics, CatalogNamesFollowConventions) {
  for (const kvcache::MetricInfo& m : kvcache::metric_catalog()) {
    const bool total = std::string_view(m.name).ends_with("_total");
    EXPECT_EQ(total, m.type == kvcache::MetricType::counter) << m.name;
    EXPECT_FALSE(m.help.empty()) << m.name;
  }
}

TEST(Metrics, RefusesPrefixesThatAreNotNames) {
  PagedKVCacheManager m = small_prefix_manager();
  for (const char* bad : {"", "9kv", "kv-cache", "kv cache", "kv\n"}) {
    KV_EXPECT_THROW(kvcache::metrics_text(m, bad), kvcache::InvalidArgument,
                    "is not a Prometheus metric name");
  }
  EXPECT_EQ(kvtest::exposition_problems(kvcache::metrics_text(m, "_a:b9")), "");
}

TEST(Metrics, ExpositionCheckerRejectsBadText) {
  const std::string good = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 3\n";
  EXPECT_EQ(kvtest::exposition_problems(good), "");
  for (const std::string& bad : {
           std::string("# HELP a A.\n# TYPE a counter\na 3\n"),  // counter w/o _total
           std::string("# HELP a_total A.\n# TYPE a_total gauge\na_total 3\n"),  // gauge _total
           std::string("a 3\n# HELP a A.\n# TYPE a gauge\n"),                    // sample first
           std::string("# HELP 9a A.\n# TYPE 9a gauge\n9a 3\n"),                 // bad name
           std::string("# HELP a A.\n# TYPE a gauge\na{x=1} 3\n"),               // unquoted label
           std::string("# HELP a A.\n# TYPE a gauge\na 3"),                      // no final newline
           std::string("# HELP a A.\n# HELP a A.\n# TYPE a gauge\na 3\n"),       // HELP twice
       }) {
    EXPECT_NE(kvtest::exposition_problems(bad), "") << bad;
  }
}

// Threads run the lifecycle while another reads the text: each reading is
// valid and consistent (free + used + cached = capacity), and the counters
// add up at the end.
TEST(MetricsConcurrency, TextWhileThreadsRunLifecycle) {
  auto p = kvtest::paged_params(1, 1, 4, 4);
  p.enable_prefix_caching = true;
  PagedKVCacheManager m(p, 64, 16, 64);
  constexpr int kThreads = 4, kRounds = 200;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      const std::string text = kvcache::metrics_text(m);
      ASSERT_EQ(kvtest::exposition_problems(text), "");
      const auto s = kvtest::exposition_samples(text);
      const std::string pool = "{strategy=\"paged\",tier=\"device\"}";
      ASSERT_EQ(s.at("kvcache_blocks_free" + pool) + s.at("kvcache_blocks_used" + pool) +
                    s.at("kvcache_blocks_cached" + pool),
                64u);
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      const U32 prompt = iota(static_cast<std::uint32_t>(t % 2) * 1000, 9);
      for (int r = 0; r < kRounds; ++r) {
        const Ids s = m.claim(1);
        const std::uint32_t hit = m.match_prefix(s[0], prompt);
        m.fetch(s, U32{9 - hit});
        m.step(s, U32{9 - hit}, U32(prompt.begin() + hit, prompt.end()));
        m.release(s[0]);
      }
    });
  }
  for (auto& w : workers) w.join();
  done = true;
  reader.join();
  const ManagerStats s = m.stats();
  EXPECT_EQ(s.sequences_claimed, std::uint64_t{kThreads * kRounds});
  EXPECT_EQ(s.sequences_released, std::uint64_t{kThreads * kRounds});
  EXPECT_EQ(s.fetches, std::uint64_t{kThreads * kRounds});
  EXPECT_EQ(s.prefix_lookups, std::uint64_t{kThreads * kRounds});
  EXPECT_EQ(s.prefix_hit_tokens + s.committed_tokens, std::uint64_t{kThreads * kRounds * 9});
  m.check_invariants();
}

}  // namespace
