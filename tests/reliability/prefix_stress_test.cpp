// Concurrency stress on SHARED pages: 8 threads (4x the cores) on one paged
// manager with prefix caching, a pool small enough that eviction runs all the
// time. Every thread's prompts start with one of two system prompts, so
// threads attach each other's cached pages (match_prefix) while others evict;
// sequences are forked and the child writes into the shared partial page
// (copy-on-write) while the parent keeps reading. K/V values are a function of
// (token id, position), so any page served from the cache, forked or copied
// must hold exactly that. Bounded by operation count; afterwards invariants
// hold, no sequence is left and every page is free or cached.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "kvcache/kvcache.h"

namespace kvcache {
namespace {

constexpr std::uint32_t kThreads = 8, kRequestsPerThread = 150, kPage = 16, kDim = 4;

float value(std::uint32_t token, std::uint32_t pos, std::uint32_t kv) {
  return 1.0f + static_cast<float>(token * 4096 + pos * 2 + kv);
}

struct Tally {
  std::atomic<std::uint64_t> corrupted{0}, reused_tokens{0}, forks{0}, out_of_pages{0};
};

class Client {
 public:
  Client(PagedKVCacheManager& m, std::uint32_t seed, Tally& t) : m_(m), rng_(seed), t_(t) {}

  void run() {
    for (std::uint32_t r = 0; r < kRequestsPerThread; ++r) {
      try {
        request();
      } catch (const OutOfPages&) {
        ++t_.out_of_pages;  // a clean refusal; cleanup below released everything
      }
      for (SeqId id : live_) m_.release(id);
      live_.clear();
    }
  }

 private:
  std::vector<std::uint32_t> prompt() {
    const std::uint32_t system = rng_() % 2;  // two shared system prompts of 3 pages
    std::vector<std::uint32_t> tokens;
    for (std::uint32_t i = 0; i < 3 * kPage; ++i) tokens.push_back(100 + system * 64 + i % 60);
    const std::uint32_t suffix = 1 + rng_() % 40;
    for (std::uint32_t i = 0; i < suffix; ++i) tokens.push_back(rng_() % 1000);
    return tokens;
  }

  // Writes tokens [from, to) of `tokens` for the batch's only entry, then commits them.
  void extend(SeqId id, const std::vector<std::uint32_t>& tokens, std::uint32_t from, std::uint32_t to) {
    const std::vector<SeqId> ids{id};
    KVCacheBatch b = m_.fetch(ids, std::vector<std::uint32_t>{to - from});
    auto coll = b.paged<float>();
    auto k = coll.get_key_cache(0), v = coll.get_value_cache(0);
    for (std::uint32_t pos = from; pos < to; ++pos)
      for (std::uint32_t d = 0; d < kDim; ++d) {
        *k.ptr(0, 0, pos, d) = value(tokens[pos], pos, 0);
        *v.ptr(0, 0, pos, d) = value(tokens[pos], pos, 1);
      }
    m_.step(ids, std::vector<std::uint32_t>{to - from},
            std::span<const std::uint32_t>(tokens).subspan(from, to - from));
  }

  void verify(SeqId id, const std::vector<std::uint32_t>& tokens, std::uint32_t length) {
    const std::vector<SeqId> ids{id};
    KVCacheBatch b = m_.fetch(ids, std::vector<std::uint32_t>{0});
    auto coll = b.paged<float>();
    auto k = coll.get_key_cache(0), v = coll.get_value_cache(0);
    for (std::uint32_t pos = 0; pos < length; ++pos)
      if (*k.ptr(0, 0, pos, 0) != value(tokens[pos], pos, 0) ||
          *v.ptr(0, 0, pos, kDim - 1) != value(tokens[pos], pos, 1)) {
        ++t_.corrupted;
        return;
      }
  }

  void request() {
    std::vector<std::uint32_t> tokens = prompt();
    const SeqId id = m_.claim(1)[0];
    live_.push_back(id);
    const std::uint32_t reused = m_.match_prefix(id, tokens);
    t_.reused_tokens += reused;
    extend(id, tokens, reused, static_cast<std::uint32_t>(tokens.size()));
    if (rng_() % 2 == 0) {  // fork: the child writes into the shared partial page
      const SeqId child = m_.fork(id);
      live_.push_back(child);
      ++t_.forks;
      std::vector<std::uint32_t> child_tokens = tokens;
      child_tokens.push_back(2000 + rng_() % 100);
      extend(child, child_tokens, static_cast<std::uint32_t>(tokens.size()),
             static_cast<std::uint32_t>(child_tokens.size()));
      verify(child, child_tokens, static_cast<std::uint32_t>(child_tokens.size()));
    }
    tokens.push_back(3000 + rng_() % 100);  // the parent decodes its own token
    extend(id, tokens, static_cast<std::uint32_t>(tokens.size() - 1),
           static_cast<std::uint32_t>(tokens.size()));
    verify(id, tokens, static_cast<std::uint32_t>(tokens.size()));
  }

  PagedKVCacheManager& m_;
  std::mt19937 rng_;
  Tally& t_;
  std::vector<SeqId> live_;
};

TEST(PrefixStress, SharedAndForkedSequencesUnderEviction) {
  KVCacheParams p;
  p.num_layers = 1;
  p.n_kv_heads = 1;
  p.head_dim = kDim;
  p.cache_strategy = CacheStrategy::paged;
  p.page_size = kPage;
  p.enable_prefix_caching = true;
  // 8 threads x up to 2 sequences x up to 6 pages fit, with little room to spare: eviction runs.
  PagedKVCacheManager m(p, 120, kThreads * 2, 256);
  Tally t;
  std::vector<std::thread> threads;
  for (std::uint32_t i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] { Client(m, 100 + i, t).run(); });
  for (auto& th : threads) th.join();
  m.check_invariants();
  EXPECT_EQ(m.num_active_sequences(), 0u);
  EXPECT_EQ(t.corrupted.load(), 0u);
  EXPECT_GT(t.reused_tokens.load(), 0u) << "no request attached a cached prefix";
  EXPECT_GT(t.forks.load(), 0u);
  const PrefixCacheMetrics metrics = m.metrics();
  EXPECT_GT(metrics.evictions, 0u) << "the pool never ran dry: eviction was not exercised";
  EXPECT_GT(metrics.cow_copies, 0u) << "no fork wrote into a shared page";
  EXPECT_EQ(metrics.reused_tokens, t.reused_tokens.load());
  std::printf("prefix stress: %llu reused tokens, %llu forks, %llu evictions, %llu CoW copies, %llu out-of-pages\n",
              static_cast<unsigned long long>(metrics.reused_tokens),
              static_cast<unsigned long long>(t.forks.load()),
              static_cast<unsigned long long>(metrics.evictions),
              static_cast<unsigned long long>(metrics.cow_copies),
              static_cast<unsigned long long>(t.out_of_pages.load()));
  m.reset_prefix_cache();
  m.check_invariants();
  EXPECT_EQ(m.free_blocks(), m.total_blocks()) << "pages leaked";
}

}  // namespace
}  // namespace kvcache
