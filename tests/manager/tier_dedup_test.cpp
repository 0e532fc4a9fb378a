// Load de-duplication: sequences whose prompts share pages a tier holds
// attach the device pages a load job in flight fills instead of reading them
// again. Each load() call of the tier below waits until the test finishes it
// (GatedTier), so the order in which jobs end is the test's to choose.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "kvcache/paged_manager.h"
#include "manager/tier_test_util.h"
#include "tier/memory_tier.h"
#include "tier/ticket_state.h"

namespace kvcache {
namespace {

using testing::MemoryTier;

// A tier whose loads wait for finish(call): the pages live in a synchronous
// MemoryTier (stores, contains and stats go straight to it); finish(k) reads
// the pages of the k-th load() call from it then, except those whose key
// fail() named, which come back `failed` without a read.
class GatedTier final : public Tier {
 public:
  explicit GatedTier(const TierFingerprint& fp) : inner_(fp) {}
  ~GatedTier() override {
    for (std::size_t k = 0; k < calls(); ++k) finish(k);
  }

  std::string_view name() const override { return inner_.name(); }
  const TierFingerprint& fingerprint() const override { return inner_.fingerprint(); }
  bool enabled() const override { return inner_.enabled(); }
  std::vector<std::uint8_t> contains(std::span<const PageKey> keys) override {
    return inner_.contains(keys);
  }
  TierTicket store(std::span<const PageWrite> pages) override { return inner_.store(pages); }
  TierTicket load(std::span<const PageRead> pages) override {
    std::lock_guard lock(mu_);
    calls_.push_back({TierTicket::State::for_loads(pages.size()), {pages.begin(), pages.end()}});
    return TierTicket(calls_.back().state);
  }
  TierStats stats() const override { return inner_.stats(); }

  std::size_t calls() const {
    std::lock_guard lock(mu_);
    return calls_.size();
  }
  // Pages asked for by the k-th load() call.
  std::size_t pages_of(std::size_t k) const {
    std::lock_guard lock(mu_);
    return calls_.at(k).reads.size();
  }
  void fail(const PageKey& key) {
    std::lock_guard lock(mu_);
    fail_.push_back(key);
  }
  // Performs the k-th load() call (a second time: nothing).
  void finish(std::size_t k) {
    Call call;
    {
      std::lock_guard lock(mu_);
      call = calls_.at(k);
    }
    for (std::size_t i = 0; i < call.reads.size(); ++i) {
      if (call.state->done()) break;
      LoadResult r = LoadResult::failed;
      if (!failing(call.reads[i].key))
        r = inner_.load(std::span(&call.reads[i], 1)).load_results()[0];
      call.state->finish_load(i, r);
    }
  }
  MemoryTier& inner() { return inner_; }

 private:
  struct Call {
    std::shared_ptr<TierTicket::State> state;
    std::vector<PageRead> reads;
  };
  bool failing(const PageKey& key) const {
    std::lock_guard lock(mu_);
    return std::find(fail_.begin(), fail_.end(), key) != fail_.end();
  }

  MemoryTier inner_;
  mutable std::mutex mu_;
  std::deque<Call> calls_;
  std::vector<PageKey> fail_;
};

KVCacheParams dedup_params(PoolArrangement arrangement) {
  return testing::tier_test_params(arrangement, /*num_layers=*/2);
}

// Every element of one token's K and V: [layer][kv][head][dim].
using TokenKV = std::vector<float>;

// A manager of 8 pages over a GatedTier.
struct Rig {
  explicit Rig(PoolArrangement arrangement, bool pool_apart = false)
      : params(dedup_params(arrangement)) {
    tier = std::make_shared<GatedTier>(TierFingerprint::of(params));
    PrefixCacheConfig config;
    config.tiers.tiers.push_back(tier);
    config.tiers.pool_apart = pool_apart;
    config.tiers.offload_delay = std::chrono::microseconds{0};  // each call's write-backs go
    m = std::make_unique<PagedKVCacheManager>(params, 8, 6, 64, std::move(config));
  }
  ~Rig() {
    for (std::size_t k = 0; k < tier->calls(); ++k) tier->finish(k);  // before the manager goes
  }

  std::size_t token_elems() const {
    return std::size_t{params.num_layers} * 2 * params.n_kv_heads * params.head_dim;
  }
  template <class F>
  void each_element(const KVCacheBatch& batch, std::uint32_t upto, F&& f) const {
    const auto col = batch.paged<float>();
    for (std::uint32_t t = 0; t < upto; ++t)
      for (std::uint32_t l = 0; l < params.num_layers; ++l)
        for (std::uint32_t kv = 0; kv < 2; ++kv) {
          const auto cache = kv == 0 ? col.get_key_cache(l) : col.get_value_cache(l);
          for (std::uint32_t h = 0; h < params.n_kv_heads; ++h)
            for (std::uint32_t d = 0; d < params.head_dim; ++d) {
              const std::size_t e =
                  ((std::size_t{l} * 2 + kv) * params.n_kv_heads + h) * params.head_dim + d;
              f(t, e, *cache.ptr(0, h, t, d));
            }
        }
  }
  // Computes a fresh sequence's prompt: random K/V written through the views.
  std::vector<TokenKV> prefill(SeqId seq, const std::vector<std::uint32_t>& prompt) {
    const auto n = static_cast<std::uint32_t>(prompt.size());
    const KVCacheBatch batch = m->fetch(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{n});
    std::uniform_real_distribution<float> dist(-4, 4);
    std::vector<TokenKV> w(n, TokenKV(token_elems()));
    for (TokenKV& t : w)
      for (float& x : t) x = dist(rng);
    each_element(batch, n, [&](std::uint32_t t, std::size_t e, float& x) { x = w[t][e]; });
    m->complete_offloads(batch);  // a pool apart: its write-backs go down (bytes unchecked)
    m->step(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{n}, prompt);
    return w;
  }
  // The elements of seq's first `upto` tokens that differ from `w`.
  std::size_t differing(SeqId seq, const std::vector<TokenKV>& w, std::uint32_t upto) {
    const KVCacheBatch batch = m->fetch(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{1});
    std::size_t differ = 0;
    each_element(batch, upto,
                 [&](std::uint32_t t, std::size_t e, float& x) { differ += x != w[t][e]; });
    return differ;
  }
  // Writes `prompt`, releases it, then fills the pool with another request
  // so its full pages are evicted to the tier.
  std::vector<TokenKV> write_and_evict(const std::vector<std::uint32_t>& prompt) {
    const SeqId s = m->claim(1)[0];
    std::vector<TokenKV> w = prefill(s, prompt);
    m->release(s);
    const SeqId other = m->claim(1)[0];
    prefill(other, testing::iota_tokens(32, 1000));
    m->release(other);
    m->check_invariants();
    return w;
  }
  PageKey key_of_page(const std::vector<std::uint32_t>& prompt, std::size_t page) const {
    const std::uint64_t digest = TierFingerprint::of(params).digest();
    PageKey k{};
    for (std::size_t j = 0; j <= page; ++j)
      k = page_key(k, std::span(prompt).subspan(j * params.page_size, params.page_size), digest);
    return k;
  }
  std::vector<std::uint32_t> blocks_of(SeqId seq) const {
    for (const auto& s : m->snapshot().sequences)
      if (s.id == seq) return s.blocks;
    return {};
  }
  std::set<SeqId> poll() {
    const std::vector<SeqId> ready = m->poll_loads();
    return {ready.begin(), ready.end()};
  }

  KVCacheParams params;
  std::shared_ptr<GatedTier> tier;
  std::unique_ptr<PagedKVCacheManager> m;
  std::mt19937 rng{42};
};

class TierDedup : public ::testing::TestWithParam<PoolArrangement> {};

INSTANTIATE_TEST_SUITE_P(Arrangements, TierDedup,
                         ::testing::Values(PoolArrangement::interleaved,
                                           PoolArrangement::per_layer),
                         [](const auto& info) {
                           return std::string(arrangement_name(info.param));
                         });

TEST_P(TierDedup, TwoSequencesShareOneLoad) {
  Rig r(GetParam());
  const auto a = testing::iota_tokens(13, 7);  // 3 full pages to match
  const auto w = r.write_and_evict(a);
  const SeqId lead = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(lead, a), 12u);
  const std::uint64_t lookups = r.m->stats().tiers[0].lookups;
  const SeqId follow = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(follow, a), 12u);
  r.m->check_invariants();
  EXPECT_EQ(r.tier->calls(), 1u) << "the follower started no load of its own";
  EXPECT_EQ(r.m->stats().tiers[0].lookups, lookups) << "nor asked the tier about pages in flight";
  EXPECT_EQ(r.blocks_of(follow), r.blocks_of(lead)) << "it attached the same device pages";
  EXPECT_EQ(r.m->stats().pending_loads, 3u);
  EXPECT_TRUE(r.m->has_pending_loads(follow));
  const ManagerSnapshot before = r.m->snapshot();
  EXPECT_THROW(r.m->fetch(std::vector<SeqId>{follow}, std::vector<std::uint32_t>{1}),
               InvalidArgument);
  EXPECT_THROW(r.m->fork(follow), InvalidArgument);
  EXPECT_THROW(r.m->truncate(follow, 4), InvalidArgument);
  EXPECT_EQ(r.m->snapshot(), before) << "refused calls changed nothing";

  EXPECT_TRUE(r.poll().empty());
  r.tier->finish(0);
  EXPECT_EQ(r.poll(), (std::set<SeqId>{lead, follow}));
  r.m->check_invariants();
  EXPECT_EQ(r.m->cache_length(lead), 12u);
  EXPECT_EQ(r.m->cache_length(follow), 12u);
  EXPECT_EQ(r.differing(lead, w, 12), 0u);
  EXPECT_EQ(r.differing(follow, w, 12), 0u);
  r.m->check_invariants();
  const ManagerStats st = r.m->stats();
  EXPECT_EQ(st.tiers[0].pages_loaded, 3u) << "one prompt's reads";
  EXPECT_EQ(st.tiers[0].pages_onboarded, 3u);
  EXPECT_EQ(st.tiers[0].load_failures, 0u);
  EXPECT_EQ(st.prefix_hit_tokens, 24u) << "reused tokens count once per sequence";
  EXPECT_EQ(st.pending_loads, 0u);
}

TEST_P(TierDedup, ThreeSequencesShareOneLoad) {
  Rig r(GetParam());
  const auto a = testing::iota_tokens(13, 7);
  const auto w = r.write_and_evict(a);
  std::vector<SeqId> ids = r.m->claim(3);
  for (SeqId id : ids) EXPECT_EQ(r.m->match_prefix(id, a), 12u);
  r.m->check_invariants();
  ASSERT_EQ(r.tier->calls(), 1u);  // (wait_loads below would wait for a second forever)
  r.tier->finish(0);
  r.m->wait_loads(ids[2]);
  r.m->check_invariants();
  for (SeqId id : ids) {
    EXPECT_FALSE(r.m->has_pending_loads(id));
    EXPECT_EQ(r.m->cache_length(id), 12u);
    EXPECT_EQ(r.differing(id, w, 12), 0u);
  }
  const ManagerStats st = r.m->stats();
  EXPECT_EQ(st.tiers[0].pages_loaded, 3u);
  EXPECT_EQ(st.tiers[0].pages_onboarded, 3u);
  EXPECT_EQ(st.prefix_hit_tokens, 36u);
  EXPECT_EQ(st.blocks_used, 3u + 3u) << "three shared pages, and a page each fetch took";
}

// The follower's prompt goes two pages past the leader's: it attaches the
// leader's three and loads only its own two, and stays loading until both
// jobs are finished, whichever ends first.
TEST_P(TierDedup, FollowerLoadsOnlyThePagesPastTheLeaders) {
  for (const bool leader_first : {true, false}) {
    SCOPED_TRACE(leader_first ? "leader's job first" : "follower's job first");
    Rig r(GetParam());
    const auto b = testing::iota_tokens(21, 7);  // 5 full pages
    const auto a = std::vector<std::uint32_t>(b.begin(), b.begin() + 13);
    const auto w = r.write_and_evict(b);
    const SeqId lead = r.m->claim(1)[0];
    EXPECT_EQ(r.m->match_prefix(lead, a), 12u);
    const SeqId follow = r.m->claim(1)[0];
    EXPECT_EQ(r.m->match_prefix(follow, b), 20u);
    r.m->check_invariants();
    ASSERT_EQ(r.tier->calls(), 2u);
    EXPECT_EQ(r.tier->pages_of(1), 2u) << "only the pages past the leader's";
    const auto fb = r.blocks_of(follow);
    ASSERT_EQ(fb.size(), 5u);
    EXPECT_EQ(std::vector<std::uint32_t>(fb.begin(), fb.begin() + 3), r.blocks_of(lead));
    if (leader_first) {
      r.tier->finish(0);
      EXPECT_EQ(r.poll(), std::set<SeqId>{lead});
      EXPECT_TRUE(r.m->has_pending_loads(follow));
      r.m->check_invariants();
      EXPECT_EQ(r.differing(lead, w, 12), 0u) << "the leader computes meanwhile";
      EXPECT_THROW(r.m->fetch(std::vector<SeqId>{follow}, std::vector<std::uint32_t>{1}),
                   InvalidArgument);
      r.tier->finish(1);
      EXPECT_EQ(r.poll(), std::set<SeqId>{follow});
    } else {
      r.tier->finish(1);
      EXPECT_TRUE(r.poll().empty()) << "the follower waits for the leader's pages too";
      EXPECT_TRUE(r.m->has_pending_loads(follow));
      r.m->check_invariants();
      r.tier->finish(0);
      EXPECT_EQ(r.poll(), (std::set<SeqId>{lead, follow}));
    }
    r.m->check_invariants();
    EXPECT_EQ(r.m->cache_length(follow), 20u);
    EXPECT_EQ(r.differing(follow, w, 20), 0u);
    const ManagerStats st = r.m->stats();
    EXPECT_EQ(st.tiers[0].pages_loaded, 5u);
    EXPECT_EQ(st.tiers[0].pages_onboarded, 5u);
    EXPECT_EQ(st.prefix_hit_tokens, 32u);
  }
}

// wait_loads(follower) waits for every job it depends on, not only its own.
TEST_P(TierDedup, WaitLoadsOfAFollowerWaitsForEveryJob) {
  Rig r(GetParam());
  const auto b = testing::iota_tokens(21, 7);
  const auto a = std::vector<std::uint32_t>(b.begin(), b.begin() + 13);
  const auto w = r.write_and_evict(b);
  const SeqId lead = r.m->claim(1)[0];
  r.m->match_prefix(lead, a);
  const SeqId follow = r.m->claim(1)[0];
  r.m->match_prefix(follow, b);
  std::thread io([&] {
    r.tier->finish(1);  // the follower's own job, then the leader's
    r.tier->finish(0);
  });
  r.m->wait_loads(follow);
  io.join();
  EXPECT_FALSE(r.m->has_pending_loads(follow));
  EXPECT_EQ(r.m->cache_length(follow), 20u);
  EXPECT_EQ(r.differing(follow, w, 20), 0u);
  r.m->check_invariants();
}

// A page that fails ends the hit at that page for every sequence that
// attached it; the follower's own later pages go too. Each page is read
// (or failed) once and counted once.
TEST_P(TierDedup, AFailedPageTruncatesEverySequenceThatAttachedIt) {
  Rig r(GetParam());
  const auto b = testing::iota_tokens(21, 7);
  const auto a = std::vector<std::uint32_t>(b.begin(), b.begin() + 13);
  const auto w = r.write_and_evict(b);
  r.tier->fail(r.key_of_page(b, 1));
  const SeqId lead = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(lead, a), 12u);
  const SeqId follow = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(follow, b), 20u);
  r.tier->finish(0);
  r.tier->finish(1);
  EXPECT_EQ(r.poll(), (std::set<SeqId>{lead, follow}));
  r.m->check_invariants();
  EXPECT_EQ(r.m->cache_length(lead), 4u);
  EXPECT_EQ(r.m->cache_length(follow), 4u) << "its own pages past the failure went too";
  EXPECT_EQ(r.blocks_of(follow), r.blocks_of(lead));
  EXPECT_EQ(r.blocks_of(lead).size(), 1u);
  const ManagerStats st = r.m->stats();
  EXPECT_EQ(st.tiers[0].load_failures, 1u);
  EXPECT_EQ(st.tiers[0].pages_onboarded, 1u);
  EXPECT_EQ(st.tiers[0].pages_loaded, 4u) << "pages 0, 2 and the follower's 3, 4: once each";
  EXPECT_EQ(st.prefix_hit_tokens, 8u);
  EXPECT_EQ(st.blocks_used, 1u);
  EXPECT_EQ(r.differing(lead, w, 4), 0u);
  EXPECT_EQ(r.differing(follow, w, 4), 0u);
  r.m->check_invariants();
}

// A failure in the follower's own job leaves the leader whole.
TEST_P(TierDedup, AFailureInTheFollowersJobLeavesTheLeaderWhole) {
  Rig r(GetParam());
  const auto b = testing::iota_tokens(21, 7);
  const auto a = std::vector<std::uint32_t>(b.begin(), b.begin() + 13);
  const auto w = r.write_and_evict(b);
  r.tier->fail(r.key_of_page(b, 4));
  const SeqId lead = r.m->claim(1)[0];
  r.m->match_prefix(lead, a);
  const SeqId follow = r.m->claim(1)[0];
  r.m->match_prefix(follow, b);
  r.tier->finish(0);
  r.tier->finish(1);
  r.m->poll_loads();
  r.m->check_invariants();
  EXPECT_EQ(r.m->cache_length(lead), 12u);
  EXPECT_EQ(r.m->cache_length(follow), 16u);
  EXPECT_EQ(r.differing(follow, w, 16), 0u);
  const ManagerStats st = r.m->stats();
  EXPECT_EQ(st.tiers[0].load_failures, 1u);
  EXPECT_EQ(st.tiers[0].pages_onboarded, 4u);
}

// The leader released while the follower waits: the pages stay (the job's
// and the follower's references) and the follower gets them.
TEST_P(TierDedup, LeaderReleasedWhileLoadingLeavesTheFollowerItsPages) {
  Rig r(GetParam());
  const auto a = testing::iota_tokens(13, 7);
  const auto w = r.write_and_evict(a);
  const SeqId lead = r.m->claim(1)[0];
  r.m->match_prefix(lead, a);
  const SeqId follow = r.m->claim(1)[0];
  r.m->match_prefix(follow, a);
  r.m->release(lead);
  r.m->check_invariants();
  EXPECT_TRUE(r.m->has_pending_loads(follow));
  EXPECT_EQ(r.m->stats().pending_loads, 3u);
  r.tier->finish(0);
  EXPECT_EQ(r.poll(), std::set<SeqId>{follow});
  r.m->check_invariants();
  EXPECT_EQ(r.m->cache_length(follow), 12u);
  EXPECT_EQ(r.differing(follow, w, 12), 0u);
  const ManagerStats st = r.m->stats();
  EXPECT_EQ(st.tiers[0].pages_onboarded, 3u);
  EXPECT_EQ(st.prefix_hit_tokens, 12u);
  // A third request finds them published on the device.
  const SeqId third = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(third, a), 12u);
  EXPECT_FALSE(r.m->has_pending_loads(third));
  r.m->check_invariants();
}

// The follower released while loading: the leader is untouched, and once
// both are gone nothing is held.
TEST_P(TierDedup, FollowerReleasedWhileLoadingLeavesTheLeaderAlone) {
  Rig r(GetParam());
  const auto b = testing::iota_tokens(21, 7);
  const auto a = std::vector<std::uint32_t>(b.begin(), b.begin() + 13);
  const auto w = r.write_and_evict(b);
  const SeqId lead = r.m->claim(1)[0];
  r.m->match_prefix(lead, a);
  const SeqId follow = r.m->claim(1)[0];
  r.m->match_prefix(follow, b);
  r.m->release(follow);
  r.m->check_invariants();
  EXPECT_TRUE(r.m->has_pending_loads(lead));
  EXPECT_EQ(r.m->stats().pending_loads, 5u) << "the follower's own job may still be written";
  r.tier->finish(0);
  EXPECT_EQ(r.poll(), std::set<SeqId>{lead});
  EXPECT_EQ(r.m->cache_length(lead), 12u);
  EXPECT_EQ(r.differing(lead, w, 12), 0u);
  r.tier->finish(1);
  r.m->wait_tiers();
  r.m->check_invariants();
  r.m->release(lead);
  r.m->check_invariants();
  const ManagerStats st = r.m->stats();
  EXPECT_EQ(st.pending_loads, 0u);
  EXPECT_EQ(st.blocks_used, 0u);
  EXPECT_EQ(st.tiers[0].pages_onboarded, 3u) << "the released follower's job counts nothing";
  EXPECT_EQ(st.prefix_hit_tokens, 12u);
}

// A pool apart: a fetch hands each loaded page's upload out once, to the
// first sequence finished with it, not again to those that attached it.
TEST(TierDedupApart, EachLoadedPageIsHandedOutOnce) {
  Rig r(PoolArrangement::interleaved, /*pool_apart=*/true);
  const auto b = testing::iota_tokens(21, 7);
  const auto a = std::vector<std::uint32_t>(b.begin(), b.begin() + 13);
  r.write_and_evict(b);
  const SeqId lead = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(lead, a), 12u);
  const SeqId follow = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(follow, b), 20u);
  const auto fb = r.blocks_of(follow);
  ASSERT_EQ(fb.size(), 5u);
  r.tier->finish(0);
  EXPECT_EQ(r.poll(), std::set<SeqId>{lead});
  const KVCacheBatch first = r.m->fetch(std::vector<SeqId>{lead}, std::vector<std::uint32_t>{1});
  const std::set<std::uint32_t> up1(first.block_loads().begin(), first.block_loads().end());
  EXPECT_EQ(up1, std::set<std::uint32_t>(fb.begin(), fb.begin() + 3));
  r.m->complete_offloads(first);
  r.tier->finish(1);
  EXPECT_EQ(r.poll(), std::set<SeqId>{follow});
  const KVCacheBatch second = r.m->fetch(std::vector<SeqId>{follow}, std::vector<std::uint32_t>{1});
  const std::set<std::uint32_t> up2(second.block_loads().begin(), second.block_loads().end());
  EXPECT_EQ(up2, std::set<std::uint32_t>(fb.begin() + 3, fb.end())) << "its own pages only";
  r.m->complete_offloads(second);
  r.m->check_invariants();
}

}  // namespace
}  // namespace kvcache
