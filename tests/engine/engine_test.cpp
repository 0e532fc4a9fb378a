// End-to-end tests of the engine: the cached, batched, scheduled forward pass
// must reproduce a no-cache reference that recomputes the whole sequence at
// every step, token for token and logit for logit, for every cache kind and
// scheduling situation (chunked prefill, preemption, mixed batches).

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>

#include "engine/linalg.h"
#include "engine/reference.h"
#include "kvcache/continuous_manager.h"
#include "kvcache/engine/model.h"
#include "kvcache/engine/sampling.h"
#include "kvcache/engine/scheduler.h"
#include "kvcache/error.h"
#include "kvcache/kernels/rope.h"
#include "kvcache/paged_manager.h"

namespace kvcache::engine {
namespace {

using test_ref::expect_matches_reference;
using test_ref::max_rel_diff;
using test_ref::random_prompt;
using test_ref::tiny_model;

std::unique_ptr<KVCacheManager> make_manager(const std::string& kind, std::uint32_t page_size,
                                             std::uint32_t pages_or_slots,
                                             std::uint32_t max_seq_len = 128) {
  const ModelConfig& c = tiny_model().config();
  if (kind == "continuous") {
    return std::make_unique<ContinuousBatchingKVCacheManager>(
        c.cache_params(CacheStrategy::continuous, 0), pages_or_slots, max_seq_len);
  }
  return std::make_unique<PagedKVCacheManager>(c.cache_params(CacheStrategy::paged, page_size),
                                               pages_or_slots, 32, max_seq_len);
}

struct Case {
  std::string name;
  std::string kind;
  std::uint32_t page_size;
  std::uint32_t blocks;
  std::uint32_t max_num_tokens;
  bool staggered;  // add requests while others run (mixed prefill/decode batches)
  bool expect_preemption;
};

class EndToEnd : public ::testing::TestWithParam<Case> {};

TEST_P(EndToEnd, GreedyEqualsNoCacheReference) {
  const Case& c = GetParam();
  auto manager = make_manager(c.kind, c.page_size, c.blocks);
  SchedulerConfig sc;
  sc.max_num_tokens = c.max_num_tokens;
  sc.max_num_seqs = std::min<std::uint32_t>(8, manager->max_batch_size());
  sc.record_logits = true;
  sc.watermark = 0;
  Scheduler scheduler(tiny_model(), *manager, sc);
  std::mt19937 rng(7);
  std::vector<std::vector<TokenId>> prompts;
  std::vector<RequestOutput> done;
  auto add = [&](std::uint32_t n) {
    for (std::uint32_t i = 0; i < n; ++i) {
      Request r;
      r.id = prompts.size();
      r.prompt = random_prompt(rng, 1 + rng() % 40);
      r.max_new_tokens = 1 + rng() % 12;
      prompts.push_back(r.prompt);
      scheduler.add_request(std::move(r));
    }
  };
  add(c.staggered ? 3 : 10);
  for (int round = 0; c.staggered && round < 4; ++round) {
    scheduler.step();
    scheduler.step();
    add(2);
  }
  scheduler.run_to_completion();
  for (auto& f : scheduler.take_finished()) done.push_back(std::move(f));
  ASSERT_EQ(done.size(), prompts.size());
  for (const RequestOutput& out : done) {
    expect_matches_reference(prompts[out.id], out);
  }
  EXPECT_EQ(manager->num_active_sequences(), 0u);
  EXPECT_EQ(manager->free_blocks(), manager->total_blocks());
  manager->check_invariants();
  if (c.expect_preemption) {
    EXPECT_GT(scheduler.stats().preemptions, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Engine, EndToEnd,
    ::testing::Values(Case{"continuous", "continuous", 0, 8, 256, false, false},
                      Case{"continuous_chunked_mixed", "continuous", 0, 4, 7, true, false},
                      Case{"paged1", "paged", 1, 2000, 256, false, false},
                      Case{"paged16", "paged", 16, 200, 256, false, false},
                      Case{"paged16_chunked_mixed", "paged", 16, 200, 9, true, false},
                      Case{"paged1_chunked_mixed", "paged", 1, 2000, 5, true, false},
                      // 64 tokens of pool: decode growth forces preemption + resume.
                      Case{"paged4_preemption", "paged", 4, 16, 64, false, true},
                      Case{"paged1_preemption_mixed", "paged", 1, 60, 16, true, true}),
    [](const auto& info) { return info.param.name; });

TEST(Model, CachedPrefillEqualsNoCacheForBothManagers) {
  std::mt19937 rng(3);
  const std::vector<TokenId> prompt = random_prompt(rng, 37);
  const std::vector<float> want = tiny_model().forward_no_cache(prompt);
  const std::uint32_t vocab = tiny_model().config().vocab_size;
  for (const std::string kind : {"continuous", "paged"}) {
    auto m = make_manager(kind, 16, 8);
    const SeqId id = m->claim(1)[0];
    // Two chunks: 20 tokens, then 17 on top of the cache.
    ForwardScratch scratch;
    std::vector<float> logits(2 * vocab);
    std::uint32_t done = 0;
    for (std::uint32_t chunk : {20u, 17u}) {
      const std::vector<std::uint32_t> n = {chunk}, offs = {0, chunk};
      KVCacheBatch b = m->fetch(std::span(&id, 1), n);
      const std::vector<std::uint32_t> rows = {0, chunk - 1};
      tiny_model().forward(std::span(prompt).subspan(done, chunk), offs, b, rows, logits, scratch);
      for (std::uint32_t i = 0; i < 2; ++i) {
        const std::uint32_t pos = done + rows[i];
        EXPECT_LE(max_rel_diff(std::span(logits).subspan(i * vocab, vocab),
                               std::span(want).subspan(pos * vocab, vocab)),
                  1e-4)
            << kind << " position " << pos;
      }
      m->step(std::span(&id, 1), n);
      done += chunk;
    }
    m->release(id);
  }
}

// The model rotates Q with the angles the fused store uses for K: its table
// (min(max_position, kRopeTablePositions) positions), and past the table's
// end the per-position angles; either way bit for bit apply_rope_reference.
TEST(Model, RopeOnQMatchesTheStoresRotationOfK) {
  const Model& m = tiny_model();
  const ModelConfig& c = m.config();
  EXPECT_EQ(m.rope_table().max_positions(), std::min(c.max_position, Model::kRopeTablePositions));
  EXPECT_TRUE(m.rope_table().matches(RopeOptions{true, c.rope_theta, 0}, c.head_dim));
  const RopeTable small(RopeOptions{true, 500.0f, 0}, 6, 4);
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> x(3 * 2 * 6);  // [3 rows][2 heads][6]
  for (float& e : x) e = u(rng);
  const std::vector<std::uint32_t> positions = {2, 9, 3};  // 9 is past the table
  std::vector<float> want = x;
  for (std::size_t r = 0; r < 3; ++r) {
    apply_rope_reference(std::span(want).subspan(r * 12, 12), 2, 6, positions[r],
                         RopeOptions{true, 500.0f, 0});
  }
  apply_rope(x.data(), 3, 2, 6, positions, small);
  EXPECT_EQ(x, want);
}

TEST(Model, RejectsBadInput) {
  auto m = make_manager("paged", 4, 8);
  const SeqId id = m->claim(1)[0];
  const std::vector<std::uint32_t> n = {2}, offs = {0, 2}, rows = {1};
  KVCacheBatch b = m->fetch(std::span(&id, 1), n);
  ForwardScratch s;
  std::vector<float> logits(tiny_model().config().vocab_size);
  const std::vector<TokenId> bad = {1, 1000};
  EXPECT_THROW(tiny_model().forward(bad, offs, b, rows, logits, s), InvalidArgument);
  const std::vector<TokenId> ok = {1, 2};
  std::vector<float> short_logits(3);
  EXPECT_THROW(tiny_model().forward(ok, offs, b, rows, short_logits, s), InvalidArgument);
  const std::vector<std::uint32_t> bad_rows = {2};
  EXPECT_THROW(tiny_model().forward(ok, offs, b, bad_rows, logits, s), InvalidArgument);
  ModelConfig other = model_preset("tiny");
  other.n_kv_heads = 4;
  const Model wrong = Model::from_seed(other, 1);
  EXPECT_THROW(wrong.forward(ok, offs, b, rows, logits, s), InvalidArgument);
  ModelConfig broken = model_preset("tiny");
  broken.n_q_heads = 3;
  EXPECT_THROW(broken.validate(), InvalidArgument);
  EXPECT_THROW(model_preset("huge"), InvalidArgument);
  // Weights that do not fit an absurd head_dim are refused before the RoPE
  // table of that head_dim (4096 x 2^30 floats) is allocated.
  ModelConfig absurd = model_preset("tiny");
  absurd.head_dim = 1u << 30;
  try {
    Model(absurd, tiny_model().weights());
    ADD_FAILURE() << "a model whose weights do not fit its config was built";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("q_proj"), std::string::npos) << e.what();
  }
}

TEST(Scheduler, RejectsBadRequestsAndQueuesNothing) {
  auto m = make_manager("paged", 4, 8, 64);  // 32 tokens of pool
  Scheduler s(tiny_model(), *m, SchedulerConfig{.max_num_tokens = 16, .max_num_seqs = 4});
  Request r;
  r.prompt = {};
  EXPECT_THROW(s.add_request(r), InvalidArgument);
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 0;
  EXPECT_THROW(s.add_request(r), InvalidArgument);
  r.max_new_tokens = 30;  // 33 > 32 tokens of pool
  EXPECT_THROW(s.add_request(r), InvalidArgument);
  r.max_new_tokens = 2;
  r.prompt = {1, -1};
  EXPECT_THROW(s.add_request(r), InvalidArgument);
  r.prompt = {1, 2};
  r.sampling.top_p = 0;
  EXPECT_THROW(s.add_request(r), InvalidArgument);
  r.sampling.top_p = 1;
  r.reuse_hint = static_cast<ReuseHint>(9);
  try {
    s.add_request(r);
    ADD_FAILURE() << "a bad reuse_hint was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("reuse_hint 9"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(s.has_work());
  EXPECT_THROW(Scheduler(tiny_model(), *m, SchedulerConfig{.max_num_seqs = 999}), InvalidArgument);
}

TEST(Scheduler, StopsOnEndToken) {
  auto m = make_manager("paged", 4, 64);
  // Find what greedy emits first, then make it the end token.
  std::mt19937 rng(11);
  const std::vector<TokenId> prompt = random_prompt(rng, 9);
  const std::vector<float> l = tiny_model().forward_no_cache(prompt);
  const std::uint32_t vocab = tiny_model().config().vocab_size;
  const TokenId first = argmax(std::span(l).subspan((prompt.size() - 1) * vocab, vocab));
  Scheduler s(tiny_model(), *m, SchedulerConfig{.max_num_seqs = 8});
  s.add_request(Request{.id = 5, .prompt = prompt, .max_new_tokens = 10, .end_token = first});
  s.run_to_completion();
  const auto done = s.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].tokens, std::vector<TokenId>{first});
  EXPECT_EQ(done[0].reason, FinishReason::end_token);
}

TEST(Scheduler, SeededSamplingIsReproducibleAcrossCacheKinds) {
  std::mt19937 rng(5);
  const std::vector<TokenId> prompt = random_prompt(rng, 12);
  std::vector<std::vector<TokenId>> outs;
  for (const std::string kind : {"continuous", "paged"}) {
    auto m = kind == "paged" ? make_manager(kind, 1, 200) : make_manager(kind, 0, 4);
    Scheduler s(tiny_model(), *m, SchedulerConfig{.max_num_tokens = 5, .max_num_seqs = 4});
    Request r{.id = 1, .prompt = prompt, .max_new_tokens = 20};
    r.sampling = {.temperature = 1.5f, .top_p = 0.9f, .seed = 99};
    s.add_request(r);
    s.run_to_completion();
    outs.push_back(s.take_finished().at(0).tokens);
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0].size(), 20u);
}

// Parallel sampling: one request with n = 4 samples beside an ordinary one.
// The prompt (13 tokens, pages of 4: its last page partial) is prefilled in
// chunks, then forked; every sample's logits must be those of a no-cache
// recompute of its own tokens, which fails if a sample read another's K/V
// (the shared partial page must be copied before each write). With a pool
// of 12 pages the samples do not fit together: some are preempted and
// recomputed alone, with the same check. Continuous slots cannot share: there
// each sample computes the prompt, with the same results.
TEST(Scheduler, ParallelSamplesForkThePromptAndEachMatchesTheReference) {
  std::mt19937 rng(21);
  const std::vector<TokenId> prompt = random_prompt(rng, 13), other = random_prompt(rng, 6);
  for (const std::uint32_t pages : {200u, 12u, 0u}) {
    SCOPED_TRACE("pages " + std::to_string(pages) + " (0: continuous)");
    auto m = pages > 0 ? make_manager("paged", 4, pages, 64) : make_manager("continuous", 0, 8, 64);
    SchedulerConfig sc{.max_num_tokens = 7, .max_num_seqs = 8, .watermark = 0};
    sc.record_logits = true;
    Scheduler s(tiny_model(), *m, sc);
    Request r{.id = 3, .prompt = prompt, .max_new_tokens = 8};
    r.sampling = {.temperature = 1.5f, .top_p = 0.95f, .seed = 42};
    r.n = 4;
    s.add_request(r);
    s.add_request(Request{.id = 9, .prompt = other, .max_new_tokens = 5});
    s.run_to_completion();
    std::vector<RequestOutput> done = s.take_finished();
    ASSERT_EQ(done.size(), 5u);
    std::vector<std::vector<TokenId>> samples(4);
    for (const RequestOutput& out : done) {
      if (out.id == 9) {
        EXPECT_EQ(out.sample_index, 0u);
        test_ref::expect_matches_reference(other, out);
        continue;
      }
      ASSERT_EQ(out.id, 3u);
      ASSERT_LT(out.sample_index, 4u);
      EXPECT_TRUE(samples[out.sample_index].empty()) << "sample " << out.sample_index << " twice";
      EXPECT_EQ(out.tokens.size(), 8u);
      EXPECT_EQ(out.prompt_tokens, 13u);
      test_ref::expect_logits_match_reference(prompt, out);
      samples[out.sample_index] = out.tokens;
    }
    // Seeds 42 .. 45 at temperature 1.5: the samples went different ways.
    EXPECT_TRUE(std::any_of(samples.begin() + 1, samples.end(),
                            [&](const auto& x) { return x != samples[0]; }));
    if (pages > 0) {
      // The samples shared the prompt: the partial page was copied, not recomputed.
      EXPECT_GE(static_cast<PagedKVCacheManager&>(*m).metrics().cow_copies, 1u);
    }
    if (pages == 12u) {
      EXPECT_GT(s.stats().preemptions, 0u);
    }
    EXPECT_EQ(m->num_active_sequences(), 0u);
    EXPECT_EQ(m->free_blocks(), m->total_blocks());
    m->check_invariants();
  }
}

TEST(Scheduler, ParallelSamplesAreValidated) {
  auto paged = make_manager("paged", 4, 64, 64);
  Scheduler s(tiny_model(), *paged, SchedulerConfig{.max_num_seqs = 4});
  Request r{.id = 1, .prompt = {1, 2, 3}, .max_new_tokens = 2};
  r.n = 0;
  EXPECT_THROW(s.add_request(r), InvalidArgument);
  r.n = 5;
  try {
    s.add_request(r);
    ADD_FAILURE() << "n above max_num_seqs was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("n 5 samples must be in [1, max_num_seqs 4]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(s.has_work());
}

TEST(Sampling, GreedyTopPAndValidation) {
  const std::vector<float> logits = {0.1f, 3.0f, 2.9f, -1.0f};
  std::mt19937_64 rng(1);
  EXPECT_EQ(sample(logits, SamplingParams{}, rng), 1);
  // top_p tiny keeps only the most likely token.
  EXPECT_EQ(sample(logits, SamplingParams{.temperature = 1.0f, .top_p = 1e-6f}, rng), 1);
  // High temperature, full mass: every token shows up eventually.
  std::vector<int> seen(4);
  for (int i = 0; i < 2000; ++i) {
    ++seen[sample(logits, SamplingParams{.temperature = 5.0f, .top_p = 1.0f}, rng)];
  }
  for (int c : seen) EXPECT_GT(c, 0);
  EXPECT_THROW((SamplingParams{.temperature = -1.0f}.validate()), InvalidArgument);
  EXPECT_THROW((SamplingParams{.top_p = 1.5f}.validate()), InvalidArgument);
}

TEST(Scheduler, PriorityRunsHighFirst) {
  auto m = make_manager("continuous", 0, 1);  // one slot: strictly one at a time
  SchedulerConfig sc{.max_num_tokens = 64, .max_num_seqs = 1, .use_priority = true};
  Scheduler s(tiny_model(), *m, sc);
  for (int i = 0; i < 3; ++i) {
    s.add_request(
        Request{.id = std::uint64_t(i), .prompt = {1, 2, 3}, .max_new_tokens = 2, .priority = i});
  }
  s.run_to_completion();
  const auto done = s.take_finished();
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0].id, 2u);
  EXPECT_EQ(done[1].id, 1u);
  EXPECT_EQ(done[2].id, 0u);
}

}  // namespace
}  // namespace kvcache::engine
