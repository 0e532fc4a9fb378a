// The paged manager with tiers below its pool: write-back of evicted pages,
// onboarding in match_prefix as pending loads, failures, events, figures.
// The tier is tests/tier/memory_tier.h (the contract's reference tier).
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "kvcache/kernels/attention.h"
#include "kvcache/metrics.h"
#include "kvcache/paged_manager.h"
#include "manager/exposition_format.h"
#include "manager/tier_test_util.h"
#include "tier/memory_tier.h"

namespace kvcache {
namespace {

using testing::MemoryTier;

struct Event {
  PageEvent::Kind kind;
  std::string medium;
  std::uint64_t hash;
  PageKey key;
  std::uint32_t page;
  std::size_t tokens;
};

// A manager of `pages` pages over one MemoryTier (or the tiers given).
struct Rig {
  explicit Rig(PoolArrangement arrangement, std::uint32_t pages = 4, bool synchronous = true,
               OffloadAdmission admission = OffloadAdmission::every_page,
               std::vector<std::shared_ptr<Tier>> tiers = {})
      : params(testing::tier_test_params(arrangement)) {
    if (tiers.empty()) {
      tier = std::make_shared<MemoryTier>(TierFingerprint::of(params, "model"),
                                          MemoryTier::Options{.synchronous = synchronous});
      tiers.push_back(tier);
    }
    PrefixCacheConfig config;
    config.on_event = [this](const PageEvent& e) {
      events.push_back({e.kind, std::string(e.medium), e.hash, e.key, e.page, e.tokens.size()});
    };
    config.tiers.tiers = std::move(tiers);
    config.tiers.model_id = "model";
    config.tiers.admission = admission;
    config.tiers.offload_batch = 1;  // each call's write-backs go at once
    m = std::make_unique<PagedKVCacheManager>(params, pages, 4, 64, std::move(config));
  }
  std::vector<Event> of(PageEvent::Kind kind, std::string_view medium) const {
    std::vector<Event> out;
    for (const Event& e : events)
      if (e.kind == kind && e.medium == medium) out.push_back(e);
    return out;
  }
  std::size_t count(PageEvent::Kind kind, std::string_view medium) const {
    std::size_t n = 0;
    for (const Event& e : events) n += e.kind == kind && e.medium == medium;
    return n;
  }

  KVCacheParams params;
  std::shared_ptr<MemoryTier> tier;
  std::vector<Event> events;
  std::unique_ptr<PagedKVCacheManager> m;
};

// K and V a sequence was written with: [layer][kv][token][head][dim].
using Written = std::vector<float>;

std::size_t at(const KVCacheParams& p, std::uint32_t layer, std::uint32_t kv, std::uint32_t tok,
               std::uint32_t head, std::uint32_t d, std::uint32_t tokens) {
  return (((std::size_t{layer} * 2 + kv) * tokens + tok) * p.n_kv_heads + head) * p.head_dim + d;
}

// Fetches room for tokens.size() new tokens of seq (at its cache length),
// writes random K and V there with store_kv, commits them with their ids.
Written prefill(PagedKVCacheManager& m, SeqId seq, const std::vector<std::uint32_t>& tokens,
                std::mt19937& rng) {
  const KVCacheParams& p = m.params();
  const auto n = static_cast<std::uint32_t>(tokens.size());
  const std::uint32_t start = m.cache_length(seq);
  const KVCacheBatch batch = m.fetch(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{n});
  const auto col = batch.paged<float>();
  std::uniform_real_distribution<float> dist(-4, 4);
  Written w(std::size_t{p.num_layers} * 2 * n * p.n_kv_heads * p.head_dim);
  for (float& x : w) x = dist(rng);
  const std::size_t per = std::size_t{n} * p.n_kv_heads * p.head_dim;
  const std::vector<std::uint32_t> rows{0, n};
  for (std::uint32_t l = 0; l < p.num_layers; ++l) {
    store_kv(col.get_key_cache(l), col.get_value_cache(l),
             std::span<const float>(w).subspan(at(p, l, 0, 0, 0, 0, n), per),
             std::span<const float>(w).subspan(at(p, l, 1, 0, 0, 0, n), per), rows);
  }
  m.step(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{n}, tokens);
  (void)start;
  return w;
}

// Every element of tokens [0, upto) of seq (fetched with one new token)
// equals what `w` (written for `total` tokens from position 0) says.
void expect_holds(PagedKVCacheManager& m, SeqId seq, const Written& w, std::uint32_t total,
                  std::uint32_t upto) {
  const KVCacheParams& p = m.params();
  const KVCacheBatch batch = m.fetch(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{1});
  const auto col = batch.paged<float>();
  std::size_t differ = 0;
  for (std::uint32_t l = 0; l < p.num_layers; ++l)
    for (std::uint32_t kv = 0; kv < 2; ++kv) {
      const auto cache = kv == 0 ? col.get_key_cache(l) : col.get_value_cache(l);
      for (std::uint32_t t = 0; t < upto; ++t)
        for (std::uint32_t h = 0; h < p.n_kv_heads; ++h)
          for (std::uint32_t d = 0; d < p.head_dim; ++d)
            differ += *cache.ptr(0, h, t, d) != w[at(p, l, kv, t, h, d, total)];
    }
  EXPECT_EQ(differ, 0u) << "elements that differ from what was written";
}

using testing::iota_tokens;

// Writes prompt A (13 tokens: 3 full pages), releases it, then fills the
// 4-page pool with another request so A's 3 cached pages are evicted.
Written write_and_evict(Rig& r, const std::vector<std::uint32_t>& a, std::mt19937& rng) {
  const SeqId s = r.m->claim(1)[0];
  Written w = prefill(*r.m, s, a, rng);
  r.m->release(s);
  r.m->check_invariants();
  const SeqId other = r.m->claim(1)[0];
  prefill(*r.m, other, iota_tokens(16, 1000), rng);
  r.m->check_invariants();
  r.m->release(other);
  r.m->check_invariants();
  return w;
}

class TierManager : public ::testing::TestWithParam<PoolArrangement> {};

INSTANTIATE_TEST_SUITE_P(Arrangements, TierManager,
                         ::testing::Values(PoolArrangement::interleaved,
                                           PoolArrangement::per_layer),
                         [](const auto& info) {
                           return std::string(arrangement_name(info.param));
                         });

TEST_P(TierManager, EvictedPagesComeBackByteExact) {
  Rig r(GetParam());
  std::mt19937 rng(1);
  const auto a = iota_tokens(13, 7);
  const Written w = write_and_evict(r, a, rng);
  EXPECT_EQ(r.tier->keys().size(), 3u) << "every evicted published page went down";
  EXPECT_EQ(r.count(PageEvent::Kind::stored, "host"), 3u);
  EXPECT_EQ(r.count(PageEvent::Kind::removed, "device"), 3u);

  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 12u);
  EXPECT_EQ(r.m->cache_length(c), 12u);
  EXPECT_TRUE(r.m->has_pending_loads(c));
  r.m->check_invariants();
  const ManagerSnapshot before = r.m->snapshot();
  EXPECT_THROW(r.m->fetch(std::vector<SeqId>{c}, std::vector<std::uint32_t>{1}), InvalidArgument);
  EXPECT_THROW(r.m->fork(c), InvalidArgument);
  EXPECT_THROW(r.m->truncate(c, 4), InvalidArgument);
  EXPECT_EQ(r.m->snapshot(), before) << "refused calls changed nothing";
  EXPECT_EQ(r.m->stats().pending_loads, 3u);

  EXPECT_EQ(r.m->poll_loads(), std::vector<SeqId>{c});
  EXPECT_FALSE(r.m->has_pending_loads(c));
  r.m->check_invariants();
  EXPECT_EQ(r.m->cache_length(c), 12u);
  expect_holds(*r.m, c, w, 13, 12);
  r.m->check_invariants();

  const ManagerStats st = r.m->stats();
  ASSERT_EQ(st.tiers.size(), 1u);
  EXPECT_EQ(st.tiers[0].name, "host");
  // A's 3 pages, then the other request's 3 that the loads took, then the one the fetch took.
  EXPECT_EQ(st.tiers[0].pages_offloaded, 7u);
  EXPECT_EQ(st.tiers[0].pages_onboarded, 3u);
  EXPECT_EQ(st.tiers[0].pages_loaded, 3u);
  EXPECT_EQ(st.tiers[0].load_failures, 0u);
  EXPECT_EQ(st.prefix_hit_tokens, 12u);
  EXPECT_EQ(st.pending_loads, 0u);
  // The loaded pages are published again: a second request finds them on the device.
  EXPECT_EQ(r.m->metrics().pages_published, 3u + 4u + 3u);
}

TEST_P(TierManager, KeysChainAsPageKeyAndCorruptPageTruncates) {
  Rig r(GetParam(), 4, /*synchronous=*/false);
  std::mt19937 rng(2);
  const auto a = iota_tokens(13, 7);
  const Written w = write_and_evict(r, a, rng);
  EXPECT_EQ(r.tier->queued(), 3u) << "the evicted pages wait in the tier's queue";
  r.tier->complete_all();
  r.m->poll_loads();  // finishes the write-backs
  const std::uint64_t digest = TierFingerprint::of(r.params, "model").digest();
  const std::span<const std::uint32_t> toks(a);
  const PageKey k0 = page_key({}, toks.subspan(0, 4), digest);
  const PageKey k1 = page_key(k0, toks.subspan(4, 4), digest);
  ASSERT_TRUE(r.tier->corrupt(k1));

  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 12u);
  EXPECT_TRUE(r.m->poll_loads().empty()) << "nothing finished yet";
  r.m->check_invariants();
  std::thread([&] { r.tier->complete_all(); }).join();
  r.m->wait_loads(c);
  EXPECT_FALSE(r.m->has_pending_loads(c));
  EXPECT_EQ(r.m->cache_length(c), 4u) << "the hit ends at the corrupt page";
  EXPECT_EQ(r.m->snapshot().sequences[0].blocks.size(), 1u);
  r.m->check_invariants();
  EXPECT_EQ(r.count(PageEvent::Kind::removed, "host"), 1u);
  const ManagerStats st = r.m->stats();
  EXPECT_EQ(st.tiers[0].load_failures, 1u);
  EXPECT_EQ(st.tiers[0].pages_onboarded, 1u);
  EXPECT_EQ(st.tiers[0].corrupt, 1u);
  EXPECT_EQ(st.blocks_free + st.blocks_used + st.blocks_cached, st.blocks_total);
  expect_holds(*r.m, c, w, 13, 4);
  r.m->check_invariants();
}

TEST_P(TierManager, FailedFirstLoadLeavesNothing) {
  Rig r(GetParam());
  std::mt19937 rng(3);
  const auto a = iota_tokens(13, 7);
  write_and_evict(r, a, rng);
  r.tier->fail_loads(1);
  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 12u);
  r.m->wait_loads(c);
  EXPECT_EQ(r.m->cache_length(c), 0u);
  r.m->check_invariants();
  EXPECT_EQ(r.m->stats().tiers[0].load_failures, 1u);
  // The sequence computes its prompt as if nothing had matched.
  std::mt19937 rng2(4);
  prefill(*r.m, c, a, rng2);
  r.m->check_invariants();
}

TEST_P(TierManager, ReleaseWhileLoadingFreesPagesWhenLoadsEnd) {
  Rig r(GetParam(), 4, /*synchronous=*/false);
  std::mt19937 rng(5);
  const auto a = iota_tokens(13, 7);
  write_and_evict(r, a, rng);
  r.tier->complete_all();
  r.m->wait_tiers();
  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 12u);
  r.m->release(c);
  r.m->check_invariants();
  EXPECT_EQ(r.m->stats().pending_loads, 3u) << "the tier may still write those pages";
  EXPECT_LT(r.m->free_blocks() + r.m->stats().blocks_cached, 4u);
  r.tier->complete_all();
  r.m->wait_tiers();
  r.m->check_invariants();
  const ManagerStats st = r.m->stats();
  EXPECT_EQ(st.pending_loads, 0u);
  EXPECT_EQ(st.blocks_used, 0u);
  EXPECT_EQ(st.blocks_free + st.blocks_cached, 4u);
}

TEST_P(TierManager, SecondTierServesWhatTheFirstLacks) {
  // Manager A writes pages to tier `disk`; manager B, with an empty `host`
  // in front of `disk`, finds them in the second tier (a restart).
  const KVCacheParams p = testing::tier_test_params(GetParam());
  auto disk = std::make_shared<MemoryTier>(TierFingerprint::of(p, "model"),
                                           MemoryTier::Options{.name = "disk"});
  std::mt19937 rng(6);
  const auto a = iota_tokens(13, 7);
  Written w;
  {
    Rig first(GetParam(), 4, true, OffloadAdmission::every_page, {disk});
    w = write_and_evict(first, a, rng);
  }
  auto host = std::make_shared<MemoryTier>(TierFingerprint::of(p, "model"));
  Rig second(GetParam(), 4, true, OffloadAdmission::every_page, {host, disk});
  const SeqId c = second.m->claim(1)[0];
  EXPECT_EQ(second.m->match_prefix(c, a), 12u);
  second.m->poll_loads();
  expect_holds(*second.m, c, w, 13, 12);
  const ManagerStats st = second.m->stats();
  // The first page's key alone (no tier holding it, the rest is not hashed),
  // then the run's three keys in one query.
  EXPECT_EQ(st.tiers[0].lookups, 4u);
  EXPECT_EQ(st.tiers[1].pages_onboarded, 3u);
  second.m->check_invariants();
}

// A page the tier evicts for room (Tier::take_evicted) reaches the event
// callback as `removed` with the tier's medium and the page's key.
TEST(TierManagerEvents, ATierEvictionIsARemovedEventWithItsMediumAndKey) {
  const KVCacheParams p = testing::tier_test_params(PoolArrangement::interleaved);
  auto tier = std::make_shared<MemoryTier>(TierFingerprint::of(p, "model"),
                                           MemoryTier::Options{.capacity_pages = 2});
  Rig r(PoolArrangement::interleaved, 4, true, OffloadAdmission::every_page, {tier});
  std::mt19937 rng(11);
  write_and_evict(r, iota_tokens(13, 7), rng);  // 3 pages down to a 2-page tier
  const std::vector<Event> stored = r.of(PageEvent::Kind::stored, "host");
  const std::vector<Event> removed = r.of(PageEvent::Kind::removed, "host");
  ASSERT_EQ(stored.size(), 3u);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0].key, stored[0].key);  // the tier's oldest page
  EXPECT_EQ(removed[0].page, 4u);            // the sentinel: no device page
  EXPECT_EQ(removed[0].hash, 0u);
  EXPECT_EQ(removed[0].tokens, 0u);
  EXPECT_EQ(tier->keys().size(), 2u);
  r.m->check_invariants();
}

// An eviction on the tier's own time (a deferred tier finishing its stores
// after the call) is reported at the manager's next call.
TEST(TierManagerEvents, AnEvictionAfterTheCallIsReportedAtTheNext) {
  const KVCacheParams p = testing::tier_test_params(PoolArrangement::interleaved);
  auto tier = std::make_shared<MemoryTier>(
      TierFingerprint::of(p, "model"),
      MemoryTier::Options{.name = "disk", .synchronous = false, .capacity_pages = 1});
  Rig r(PoolArrangement::interleaved, 4, true, OffloadAdmission::every_page, {tier});
  std::mt19937 rng(12);
  write_and_evict(r, iota_tokens(13, 7), rng);
  EXPECT_EQ(r.count(PageEvent::Kind::removed, "disk"), 0u);
  EXPECT_EQ(tier->complete_all(), 3u);  // the stores run now: two evictions
  EXPECT_EQ(r.count(PageEvent::Kind::removed, "disk"), 0u);
  r.m->poll_loads();
  const std::vector<Event> stored = r.of(PageEvent::Kind::stored, "disk");
  const std::vector<Event> removed = r.of(PageEvent::Kind::removed, "disk");
  ASSERT_EQ(stored.size(), 3u);
  ASSERT_EQ(removed.size(), 2u);
  EXPECT_EQ(removed[0].key, stored[0].key);
  EXPECT_EQ(removed[1].key, stored[1].key);
  EXPECT_EQ(tier->keys(), std::vector<PageKey>{stored[2].key});
}

TEST(TierManagerMetrics, PerTierSamplesLabelledWithTheTierName) {
  Rig r(PoolArrangement::interleaved);
  std::mt19937 rng(10);
  const auto a = iota_tokens(13, 7);
  write_and_evict(r, a, rng);
  const SeqId c = r.m->claim(1)[0];
  r.m->match_prefix(c, a);
  r.m->poll_loads();
  const std::string text = metrics_text(*r.m);
  EXPECT_EQ(kvtest::exposition_problems(text), "");
  const auto samples = kvtest::exposition_samples(text);
  const std::string host = "{strategy=\"paged\",tier=\"host\"}";
  EXPECT_EQ(samples.at("kvcache_tier_onboarded_pages_total" + host), 3u);
  EXPECT_EQ(samples.at("kvcache_tier_offloaded_pages_total" + host), 6u);
  EXPECT_EQ(samples.at("kvcache_tier_loaded_bytes_total" + host),
            3 * TierFingerprint::of(r.params).page_bytes());
  EXPECT_EQ(samples.at("kvcache_tier_capacity_bytes" + host), 0u) << "unlimited";
  EXPECT_EQ(samples.at("kvcache_tier_enabled" + host), 1u);
  EXPECT_EQ(samples.size(), metric_catalog().size() + tier_metric_catalog().size());
  // Without tiers: no tier_* metric at all.
  PagedKVCacheManager plain(r.params, 4, 4, 64);
  EXPECT_EQ(metrics_text(plain).find("tier_"), std::string::npos);
}

TEST(TierManagerConfig, FingerprintPrefixCachingAndDevicesAreChecked) {
  const KVCacheParams p = testing::tier_test_params(PoolArrangement::interleaved);
  auto make = [](const KVCacheParams& params, TierFingerprint fp) {
    PrefixCacheConfig config;
    config.tiers.tiers.push_back(std::make_shared<MemoryTier>(std::move(fp)));
    config.tiers.model_id = "model";
    return PagedKVCacheManager(params, 4, 4, 64, std::move(config));
  };
  try {
    make(p, TierFingerprint::of(p, "other"));
    FAIL() << "a tier of another model was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("model_id"), std::string::npos) << e.what();
  }
  KVCacheParams half = p;
  half.dtype = DType::f16;
  try {
    make(p, TierFingerprint::of(half, "model"));
    FAIL() << "a tier of another dtype was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("dtype"), std::string::npos) << e.what();
  }
  KVCacheParams off = p;
  off.enable_prefix_caching = false;
  EXPECT_THROW(make(off, TierFingerprint::of(off, "model")), InvalidArgument);
  PrefixCacheConfig none;
  none.tiers.tiers.push_back(nullptr);
  EXPECT_THROW(PagedKVCacheManager(p, 4, 4, 64, std::move(none)), InvalidArgument);
  EXPECT_NO_THROW(make(p, TierFingerprint::of(p, "model")));
}

TEST(TierManagerAdmission, ReusedOnlyKeepsPagesNoRequestReused) {
  Rig r(PoolArrangement::interleaved, 4, true, OffloadAdmission::reused);
  std::mt19937 rng(7);
  const auto a = iota_tokens(13, 7);
  write_and_evict(r, a, rng);
  EXPECT_TRUE(r.tier->keys().empty()) << "pages used once stay out of the tier";
  // Reuse A's pages once, then evict them: they go down.
  const SeqId s = r.m->claim(1)[0];
  prefill(*r.m, s, a, rng);
  r.m->release(s);
  const SeqId t = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(t, a), 12u);
  r.m->release(t);
  const SeqId u = r.m->claim(1)[0];
  prefill(*r.m, u, iota_tokens(16, 2000), rng);
  r.m->check_invariants();
  EXPECT_EQ(r.tier->keys().size(), 3u);
}

// Write-backs wait in staging for a batch (offload_batch, offload_delay);
// the destructor hands what is staged to the tier, emitting no event.
TEST(TierManagerBatching, StagedPagesWaitForABatchAndGoDownAtDestruction) {
  const KVCacheParams p = testing::tier_test_params(PoolArrangement::interleaved);
  auto tier = std::make_shared<MemoryTier>(TierFingerprint::of(p, "model"));
  std::size_t events = 0;
  {
    PrefixCacheConfig config;
    config.on_event = [&events](const PageEvent& e) { events += e.medium == "host"; };
    config.tiers.tiers = {tier};
    config.tiers.model_id = "model";
    config.tiers.offload_batch = 8;                        // 16 staging slots: 8 is the cap
    config.tiers.offload_delay = std::chrono::seconds{1};  // never due by time here
    PagedKVCacheManager m(p, 4, 4, 64, std::move(config));
    std::mt19937 rng(5);
    const SeqId a = m.claim(1)[0];
    prefill(m, a, iota_tokens(13, 7), rng);
    m.release(a);
    const SeqId b = m.claim(1)[0];
    prefill(m, b, iota_tokens(16, 1000), rng);  // evicts A's 3 published pages
    EXPECT_TRUE(tier->keys().empty()) << "3 staged pages wait for a batch of 8";
    EXPECT_EQ(m.stats().tiers.at(0).offload_dropped, 0u);
    EXPECT_EQ(events, 0u);
  }
  EXPECT_EQ(tier->keys().size(), 3u) << "the destructor handed the staged pages over";
  EXPECT_EQ(events, 0u) << "no event from the destructor";
}

TEST(TierManagerDisabled, ADisabledTierIsSkipped) {
  Rig r(PoolArrangement::interleaved);
  std::mt19937 rng(8);
  const auto a = iota_tokens(13, 7);
  write_and_evict(r, a, rng);
  r.tier->set_enabled(false);
  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 0u);
  EXPECT_FALSE(r.m->has_pending_loads(c));
  r.m->check_invariants();
}

// Loads and write-backs complete on another thread while requests come and go.
TEST(TierManagerConcurrency, TicketsCompleteOnAnotherThread) {
  Rig r(PoolArrangement::per_layer, 6, /*synchronous=*/false);
  std::atomic<bool> stop{false};
  std::thread io([&] {
    while (!stop.load()) {
      if (r.tier->complete_all() == 0) std::this_thread::yield();
    }
  });
  std::mt19937 rng(9);
  std::vector<std::vector<std::uint32_t>> prompts;
  for (std::uint32_t i = 0; i < 4; ++i) prompts.push_back(iota_tokens(13, 100 * i));
  std::vector<Written> written(prompts.size());
  std::vector<bool> known(prompts.size(), false);
  for (int round = 0; round < 60; ++round) {
    const std::size_t i = rng() % prompts.size();
    const SeqId s = r.m->claim(1)[0];
    const std::uint32_t hit = r.m->match_prefix(s, prompts[i]);
    if (r.m->has_pending_loads(s)) r.m->wait_loads(s);
    r.m->check_invariants();
    const std::uint32_t have = r.m->cache_length(s);
    ASSERT_LE(have, hit);
    if (!known[i]) {
      ASSERT_EQ(have, 0u) << "nothing of a prompt never written can be cached";
      written[i] = prefill(*r.m, s, prompts[i], rng);
      known[i] = true;
    } else {
      expect_holds(*r.m, s, written[i], 13, have);
      r.m->step(std::vector<SeqId>{s}, std::vector<std::uint32_t>{0}, std::vector<std::uint32_t>{});
    }
    r.m->release(s);
    r.m->check_invariants();
    if (round % 2 == 0) r.m->wait_tiers();  // the write-backs, done by the other thread
  }
  stop = true;
  io.join();
  r.tier->complete_all();
  r.m->wait_tiers();
  r.m->check_invariants();
  const ManagerStats stats = r.m->stats();
  const TierFigures& f = stats.tiers[0];
  EXPECT_GT(f.pages_onboarded, 0u)
      << f.pages_offloaded << " offloaded, " << f.offload_dropped << " dropped, " << f.lookups
      << " lookups, " << f.hits << " hits";
}

}  // namespace
}  // namespace kvcache
