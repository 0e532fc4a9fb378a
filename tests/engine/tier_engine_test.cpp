// The engine with tiers below the device pool: a request whose cached prefix
// is in a tier is admitted while its pages load, stays out of every batch
// until they have arrived (the manager's fetch would throw for it), and its
// TTFT includes the load. Greedy tokens equal the no-cache reference and the
// same run without tiers; a load that fails or finds a corrupt page falls
// back to computing the rest of the prompt. Tiers: the reference MemoryTier
// (tests/tier/memory_tier.h: deferred completion, faults) and a HostTier.

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "engine/reference.h"
#include "kvcache/engine/scheduler.h"
#include "kvcache/host_tier.h"
#include "kvcache/paged_manager.h"
#include "tier/memory_tier.h"

namespace kvcache::engine {
namespace {

using test_ref::expect_matches_reference;
using test_ref::random_prompt;
using test_ref::tiny_model;

constexpr std::uint32_t kPage = 8;
constexpr std::uint32_t kPages = 32;  // 256 tokens: the filler request takes all of them
constexpr std::uint32_t kMaxLen = 256;
constexpr std::uint32_t kShared = 48;  // the shared prompt: 6 pages

KVCacheParams params() {
  KVCacheParams p = tiny_model().config().cache_params(CacheStrategy::paged, kPage);
  p.enable_prefix_caching = true;
  return p;
}

std::shared_ptr<testing::MemoryTier> memory_tier(bool synchronous) {
  testing::MemoryTier::Options o;
  o.synchronous = synchronous;
  return std::make_shared<testing::MemoryTier>(TierFingerprint::of(params()), o);
}

// Finishes a deferred tier's queued work when it goes out of scope (before
// the manager, which waits for its tickets), also when an ASSERT returns.
struct CompleteAtExit {
  testing::MemoryTier& tier;
  ~CompleteAtExit() { tier.complete_all_from_now_on(); }
};

std::unique_ptr<PagedKVCacheManager> manager(std::shared_ptr<Tier> tier) {
  PrefixCacheConfig c;
  if (tier) c.tiers.tiers = {std::move(tier)};
  c.tiers.offload_batch = 1;  // each call's write-backs go at once: the tests count them
  return std::make_unique<PagedKVCacheManager>(params(), kPages, 16, kMaxLen, std::move(c));
}

SchedulerConfig config(std::function<double()> clock = {}) {
  SchedulerConfig sc;
  sc.max_num_tokens = 64;
  sc.max_num_seqs = 8;
  sc.watermark = 0;
  sc.prefix_caching = true;
  sc.record_logits = true;
  sc.clock = std::move(clock);
  return sc;
}

Request request(std::uint64_t id, std::vector<TokenId> prompt, std::uint32_t max_new) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  return r;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class TierEngine : public ::testing::Test {
 protected:
  std::mt19937 rng{29};
  std::vector<TokenId> shared = random_prompt(rng, kShared);
  std::vector<TokenId> filler = random_prompt(rng, kMaxLen - 6);
  std::vector<TokenId> tail = random_prompt(rng, 5);
  std::vector<TokenId> other = random_prompt(rng, 20);

  // Puts the shared prompt's 6 pages into the tier and out of the device
  // pool: a request computes them, then one that needs the whole pool
  // evicts them (written back). `complete` finishes a deferred tier's stores.
  void populate(Scheduler& s, testing::MemoryTier* complete = nullptr) {
    s.add_request(request(100, shared, 2));
    s.run_to_completion();
    s.add_request(request(101, filler, 6));
    s.run_to_completion();
    if (complete != nullptr) complete->complete_all();
    (void)s.take_finished();
  }
};

TEST_F(TierEngine, LoadingRequestStaysOutOfTheBatchUntilItsLoadsFinish) {
  auto tier = memory_tier(/*synchronous=*/false);
  auto m = manager(tier);
  CompleteAtExit complete{*tier};
  double now = 0;
  {
    Scheduler s(tiny_model(), *m, config([&] { return now; }));
    populate(s, tier.get());
    ASSERT_EQ(tier->keys().size(), kShared / kPage);
    s.add_request(request(1, concat(shared, tail), 4));  // its prefix is in the tier only
    s.add_request(request(2, other, 8));
    now = 1;
    EXPECT_EQ(s.step().num_seqs, 1u);  // request 2 alone; 1 admitted, loading
    EXPECT_EQ(s.num_running(), 2u);
    EXPECT_GT(tier->queued(), 0u);
    now = 2;
    EXPECT_EQ(s.step().num_seqs, 1u);  // still loading: request 2 decodes alone
    tier->complete_all();
    now = 3;
    EXPECT_EQ(s.step().num_seqs, 2u);  // the pages arrived: both in the batch
    while (s.has_work()) {
      now += 1;
      s.step();
    }
    std::map<std::uint64_t, RequestOutput> out;
    for (auto& o : s.take_finished()) out[o.id] = std::move(o);
    ASSERT_EQ(out.size(), 2u);
    expect_matches_reference(concat(shared, tail), out[1]);
    expect_matches_reference(other, out[2]);
    EXPECT_EQ(out[1].prefix_hit_tokens, kShared);
    EXPECT_DOUBLE_EQ(out[1].load_seconds, 2.0);  // admitted at 1, loaded at 3
    EXPECT_GE(out[1].first_token_time, 3.0);     // its TTFT holds the load
    EXPECT_DOUBLE_EQ(out[2].load_seconds, 0.0);
    EXPECT_EQ(s.stats().tier_matches, 1u);
    EXPECT_EQ(s.stats().load_waits, 0u);  // something else always ran
    EXPECT_EQ(m->stats().tiers.at(0).pages_onboarded, kShared / kPage);
  }
  tier->complete_all();  // write-backs queued meanwhile: the manager waits for them
  EXPECT_EQ(m->num_active_sequences(), 0u);
  m->check_invariants();
}

TEST_F(TierEngine, WaitsForTheLoadsWhenNothingElseCanRunAndCountsTheWaitInTtft) {
  auto tier = memory_tier(/*synchronous=*/false);
  auto m = manager(tier);
  CompleteAtExit complete{*tier};
  std::atomic<double> now{0};
  Scheduler s(tiny_model(), *m, config([&] { return now.load(); }));
  populate(s, tier.get());
  s.add_request(request(1, concat(shared, tail), 3));
  // The tier's own thread, as it were: finishes the loads at t = 100.
  std::thread io([&] {
    while (tier->queued() == 0) std::this_thread::yield();
    now = 100;
    tier->complete_all();
  });
  s.step();  // admits, finds nothing else to run, blocks in wait_loads
  io.join();
  s.run_to_completion();
  const std::vector<RequestOutput> out = s.take_finished();
  ASSERT_EQ(out.size(), 1u);
  expect_matches_reference(concat(shared, tail), out[0]);
  EXPECT_EQ(out[0].prefix_hit_tokens, kShared);
  // The pages arrive at t = 100 at the earliest: so does the first token.
  // (Whether the clock moved before or after the scheduler began to wait
  // is up to the threads; the wait itself is not.)
  EXPECT_GE(out[0].first_token_time - out[0].arrival_time, 100.0);
  EXPECT_LE(out[0].load_seconds, out[0].first_token_time - out[0].arrival_time);
  EXPECT_EQ(s.stats().load_waits, 1u);
  EXPECT_LE(s.stats().load_wait_seconds, 100.0);
  tier->complete_all();
}

TEST_F(TierEngine, RequestThatDoesNotFitWhileLoadingIsNotMatchedAgain) {
  auto tier = memory_tier(/*synchronous=*/false);
  auto m = manager(tier);
  CompleteAtExit complete{*tier};
  {
    Scheduler s(tiny_model(), *m, config());
    populate(s, tier.get());
    const std::vector<TokenId> big = random_prompt(rng, 60);
    s.add_request(request(2, big, 150));  // grows to 27 of the 32 pages
    s.step();                             // request 2's prompt
    const std::vector<TokenId> long_tail = random_prompt(rng, 150);
    s.add_request(request(1, concat(shared, long_tail), 4));
    s.step();  // request 1 matches into the tier, starts loading, does not fit yet
    // (19 pages more for its prompt; 32 - 8 for request 2 - 6 loading = 18)
    ASSERT_EQ(s.num_waiting(), 1u);
    ASSERT_EQ(m->stats().pending_loads, kShared / kPage);
    const std::uint64_t matches = m->metrics().match_calls;
    s.step();
    s.step();
    // Parked with its loads: neither matched nor loaded again.
    EXPECT_EQ(m->metrics().match_calls, matches);
    EXPECT_EQ(m->stats().pending_loads, kShared / kPage);
    EXPECT_EQ(s.stats().tier_matches, 1u);
    // From here the tier completes on a thread of its own, as a real one
    // does (the scheduler may block on a load).
    std::atomic<bool> serving{true};
    std::thread io([&] {
      while (serving) tier->complete_all(), std::this_thread::yield();
    });
    try {
      s.run_to_completion();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
    serving = false;
    io.join();
    std::map<std::uint64_t, RequestOutput> out;
    for (auto& o : s.take_finished()) out[o.id] = std::move(o);
    ASSERT_EQ(out.size(), 2u);
    expect_matches_reference(concat(shared, long_tail), out[1]);
    expect_matches_reference(big, out[2]);
    EXPECT_GT(out[1].load_seconds, 0.0);
  }
  tier->complete_all();
  EXPECT_EQ(m->num_active_sequences(), 0u);
  m->check_invariants();
}

// Conversations that come back, in a pool too small to keep them: later
// turns find their earlier prompt in the tier.
std::vector<std::vector<Request>> conversation_rounds(std::mt19937& rng) {
  const std::vector<TokenId> system = random_prompt(rng, 24);
  std::vector<std::vector<TokenId>> convs;
  for (int k = 0; k < 6; ++k) convs.push_back(concat(system, random_prompt(rng, 40)));
  std::vector<std::vector<Request>> rounds;
  for (std::uint64_t r = 0; r < 3; ++r) {
    std::vector<Request> round;
    for (std::uint64_t k = 0; k < convs.size(); ++k) {
      round.push_back(request(r * 10 + k, concat(convs[k], random_prompt(rng, 3)), 4));
      convs[k] = concat(convs[k], random_prompt(rng, 8));
    }
    rounds.push_back(std::move(round));
  }
  return rounds;
}

struct Served {
  std::map<std::uint64_t, RequestOutput> out;
  SchedulerStats stats;
};

Served serve_rounds(PagedKVCacheManager& m, const std::vector<std::vector<Request>>& rounds) {
  Served r;
  Scheduler s(tiny_model(), m, config());
  for (const auto& round : rounds) {
    for (const Request& q : round) s.add_request(q);
    s.run_to_completion();
  }
  for (auto& o : s.take_finished()) r.out[o.id] = std::move(o);
  r.stats = s.stats();
  return r;
}

TEST_F(TierEngine, GreedyTokensEqualWithAndWithoutTiers) {
  const auto rounds = conversation_rounds(rng);
  auto plain = manager(nullptr);
  const Served without = serve_rounds(*plain, rounds);
  // Synchronous: a write-back is held by the time the next call looks
  // (an asynchronous tier may still be copying: the run would differ).
  HostTierOptions sync;
  sync.synchronous = true;
  const TierFingerprint fp = TierFingerprint::of(params());
  auto host = std::make_shared<HostTier>(fp, std::uint64_t{512} * fp.page_bytes(), sync);
  std::vector<std::shared_ptr<Tier>> tiers = {memory_tier(true), host};
  for (const auto& tier : tiers) {
    SCOPED_TRACE(std::string(tier->name()) + (tier == host ? " (HostTier)" : " (MemoryTier)"));
    auto m = manager(tier);
    const Served with = serve_rounds(*m, rounds);
    m->wait_tiers();
    ASSERT_EQ(with.out.size(), without.out.size());
    for (const auto& [id, o] : with.out) {
      EXPECT_EQ(o.tokens, without.out.at(id).tokens) << "request " << id;
    }
    EXPECT_GT(with.stats.tier_matches, 0u);
    EXPECT_GT(m->stats().tiers.at(0).pages_onboarded, 0u);
    EXPECT_LT(with.stats.prefill_tokens, without.stats.prefill_tokens);
    EXPECT_GT(with.stats.prefix_hit_tokens, without.stats.prefix_hit_tokens);
    EXPECT_EQ(with.stats.load_failed_tokens, 0u);
    EXPECT_EQ(m->num_active_sequences(), 0u);
    m->check_invariants();
  }
  for (const auto& round : rounds) {
    for (const Request& q : round) expect_matches_reference(q.prompt, without.out.at(q.id));
  }
}

// The shared prompt's page keys, as the manager chains them.
std::vector<PageKey> shared_keys(const std::vector<TokenId>& shared) {
  const std::uint64_t digest = TierFingerprint::of(params()).digest();
  std::vector<PageKey> keys;
  PageKey parent{};
  for (std::uint32_t j = 0; j < kShared / kPage; ++j) {
    std::vector<std::uint32_t> page(shared.begin() + j * kPage, shared.begin() + (j + 1) * kPage);
    parent = page_key(parent, page, digest);
    keys.push_back(parent);
  }
  return keys;
}

TEST_F(TierEngine, CorruptPageEndsTheHitThereAndTheRestIsComputed) {
  auto tier = memory_tier(true);
  auto m = manager(tier);
  Scheduler s(tiny_model(), *m, config());
  populate(s);
  ASSERT_TRUE(tier->corrupt(shared_keys(shared).at(2)));
  s.add_request(request(1, concat(shared, tail), 4));
  s.run_to_completion();
  const std::vector<RequestOutput> out = s.take_finished();
  ASSERT_EQ(out.size(), 1u);
  expect_matches_reference(concat(shared, tail), out[0]);
  EXPECT_EQ(out[0].prefix_hit_tokens, 2 * kPage);  // pages 0 and 1 loaded
  EXPECT_EQ(s.stats().load_failed_tokens, kShared - 2 * kPage);
  EXPECT_EQ(m->stats().tiers.at(0).load_failures, 1u);
  EXPECT_EQ(tier->stats().corrupt, 1u);
}

TEST_F(TierEngine, FailedLoadFallsBackToComputingThePrompt) {
  auto tier = memory_tier(true);
  auto m = manager(tier);
  Scheduler s(tiny_model(), *m, config());
  populate(s);
  tier->fail_loads(1);  // the first page: nothing of the prefix arrives
  s.add_request(request(1, concat(shared, tail), 4));
  s.run_to_completion();
  const std::vector<RequestOutput> out = s.take_finished();
  ASSERT_EQ(out.size(), 1u);
  expect_matches_reference(concat(shared, tail), out[0]);
  EXPECT_EQ(out[0].prefix_hit_tokens, 0u);
  EXPECT_EQ(s.stats().load_failed_tokens, kShared);
  EXPECT_EQ(s.stats().prefix_hit_tokens, 0u);
  EXPECT_EQ(m->num_active_sequences(), 0u);
  m->check_invariants();
}

}  // namespace
}  // namespace kvcache::engine
