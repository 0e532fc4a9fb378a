// The demo's workload replay (engine::serve) at reduced size: figures must be
// sane and internally consistent, and nothing may be left claimed or leaked.

#include "kvcache/engine/serve.h"

#include <gtest/gtest.h>

#include <random>

#include "kvcache/engine/model.h"
#include "kvcache/engine/workload.h"
#include "kvcache/error.h"

namespace kvcache::engine {
namespace {

std::vector<WorkloadRequest> small_workload() {
  ChatWorkloadOptions o;
  o.requests = 10;
  o.system_prompt_tokens = 48;
  o.user_median = 8, o.user_max = 32;
  o.output_median = 6, o.output_max = 24;
  o.rate = 200;
  o.vocab_size = model_preset("tiny").vocab_size;
  return chat_workload(o);
}

TEST(Serve, ReportsAreConsistentForEveryConfiguration) {
  const Model model = Model::from_seed(model_preset("tiny"), 3);
  const auto workload = small_workload();
  std::uint64_t paged_prefill = 0, prefix_prefill = 0;
  for (ServeMode mode : {ServeMode::continuous, ServeMode::paged, ServeMode::paged_prefix}) {
    ServeOptions o;
    o.mode = mode;
    o.max_seq_len = 128;
    o.page_size = 4;
    o.max_num_tokens = 32;
    o.memory_bytes =
        4 * 128 * model.config().cache_params(CacheStrategy::paged, 4).bytes_per_token();
    const ServeReport r = serve(model, workload, o);
    SCOPED_TRACE(r.config);
    ASSERT_FALSE(r.pending) << r.note;
    std::uint64_t want_out = 0;
    for (const auto& w : workload) want_out += w.output_tokens;
    EXPECT_EQ(r.requests, workload.size());
    EXPECT_EQ(r.requested_output_tokens, want_out);
    EXPECT_EQ(r.generated_tokens, want_out);
    EXPECT_EQ(r.active_sequences_left, 0u);
    EXPECT_EQ(r.blocks_not_free, 0u);  // every block free or an evictable cache entry
    if (mode != ServeMode::paged_prefix) {
      EXPECT_EQ(r.blocks_cached, 0u);
    }
    EXPECT_GE(r.prefill_tokens, mode == ServeMode::paged_prefix ? 1u : r.prompt_tokens);
    EXPECT_GT(r.elapsed_s, 0);
    EXPECT_GT(r.output_tokens_per_s, 0);
    EXPECT_LE(r.ttft_p50_s, r.ttft_p99_s);
    EXPECT_GE(r.ttft_p50_s, 0);
    EXPECT_GE(r.peak_running, 1u);
    EXPECT_LE(r.peak_running, r.requests);
    EXPECT_GT(r.kv_utilisation, 0);
    EXPECT_LE(r.kv_utilisation, 1.0) << "a shared page must count once";
    EXPECT_GE(r.prefix_hit_rate, 0);
    EXPECT_LE(r.prefix_hit_rate, 1);
    if (mode == ServeMode::paged_prefix) {
      // Every request shares the 48-token system prompt (12 pages of 4).
      EXPECT_GT(r.prefix_hit_rate, 0);
      EXPECT_GT(r.blocks_cached, 0u);
      prefix_prefill = r.prefill_tokens;
    } else {
      EXPECT_EQ(r.prefix_hit_rate, 0);
    }
    if (mode == ServeMode::paged) paged_prefill = r.prefill_tokens;
    if (mode == ServeMode::continuous) {
      EXPECT_LE(r.peak_running, 4u);
    }
    EXPECT_GE(r.overhead_s, 0);
  }
  // Prefix caching computes fewer prompt tokens than plain paging. (TTFT is
  // measured on real compute time, so it is not compared in a pass/fail test.)
  EXPECT_LT(prefix_prefill, paged_prefill);
}

TEST(Serve, RefusesABudgetWithoutRoom) {
  const Model model = Model::from_seed(model_preset("tiny"), 3);
  ServeOptions o;
  o.mode = ServeMode::continuous;
  o.memory_bytes = 100;
  EXPECT_THROW(serve(model, small_workload(), o), InvalidArgument);
}

// Conversations returning to their prefixes after others pushed them out of
// a pool of 16 pages, with a host tier below it: evicted pages are written
// down (whether a later match finds a page depends on the tier's threads
// having finished its copy: tests/engine/tier_engine_test.cpp checks the
// loads with synchronous tiers), the figures come back, nothing leaks.
TEST(Serve, TiersModeLoadsEvictedPrefixesBackAndNeedsATier) {
  const Model model = Model::from_seed(model_preset("tiny"), 3);
  std::vector<WorkloadRequest> workload;
  std::mt19937 rng(5);
  std::uniform_int_distribution<TokenId> tok(0, TokenId(model.config().vocab_size) - 1);
  std::vector<std::vector<TokenId>> convs(6);
  for (int turn = 0; turn < 3; ++turn) {
    for (auto& c : convs) {
      for (int i = 0; i < 40; ++i) c.push_back(tok(rng));
      workload.push_back({double(workload.size()), c, 2});  // one at a time
    }
  }
  ServeOptions o;
  o.mode = ServeMode::paged_tiers;
  o.page_size = 16;
  o.max_seq_len = 256;
  o.memory_bytes =
      16 * 16 * model.config().cache_params(CacheStrategy::paged, 16).bytes_per_token();
  EXPECT_THROW(serve(model, workload, o), InvalidArgument);  // no tier given
  o.tiers.host_bytes = 1 << 20;
  const ServeReport r = serve(model, workload, o);
  EXPECT_EQ(r.config, "paged + prefix + tiers");
  ASSERT_EQ(r.tiers.size(), 1u);
  EXPECT_EQ(r.tiers[0].name, "host");
  EXPECT_GT(r.tiers[0].pages_offloaded, 0u);
  EXPECT_EQ(r.tiers[0].offload_dropped, 0u);  // staging sized for the pool
  EXPECT_EQ(r.load_failed_tokens, 0u);
  EXPECT_EQ(r.active_sequences_left, 0u);
  EXPECT_EQ(r.blocks_not_free, 0u);
  o.mode = ServeMode::paged_prefix;
  EXPECT_TRUE(serve(model, workload, o).tiers.empty());
}

TEST(Workload, ChatWorkloadSharesTheSystemPromptAndIsDeterministic) {
  const auto a = small_workload(), b = small_workload();
  ASSERT_EQ(a.size(), 10u);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_TRUE(std::equal(a[0].prompt.begin(), a[0].prompt.begin() + 48, a[i].prompt.begin()));
    if (i) {
      EXPECT_GE(a[i].arrival, a[i - 1].arrival);
    }
  }
}

}  // namespace
}  // namespace kvcache::engine
