// tests/engine/reference.h — shared helpers of the engine tests: the tiny
// model, random prompts, and the no-cache greedy reference that recomputes
// the whole sequence at every step.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "kvcache/engine/model.h"
#include "kvcache/engine/sampling.h"
#include "kvcache/engine/scheduler.h"

namespace kvcache::engine::test_ref {

inline const Model& tiny_model() {
  static const Model model = Model::from_seed(model_preset("tiny"), 1234);
  return model;
}

inline std::vector<TokenId> random_prompt(std::mt19937& rng, std::uint32_t len) {
  std::uniform_int_distribution<TokenId> d(
      0, static_cast<TokenId>(tiny_model().config().vocab_size) - 1);
  std::vector<TokenId> p(len);
  for (TokenId& t : p) t = d(rng);
  return p;
}

// Max of |a - b| / max(1, |b|).
inline double max_rel_diff(std::span<const float> a, std::span<const float> b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / std::max(1.0, std::abs(double(b[i]))));
  }
  return worst;
}

// Recomputes everything at every step along out's own tokens, checked
// against out (recorded with SchedulerConfig::record_logits): the logits of
// every token within 1e-4 relative; with `greedy`, every token the argmax.
inline void expect_logits_match_reference(const std::vector<TokenId>& prompt,
                                          const RequestOutput& out, bool greedy = false) {
  const Model& m = tiny_model();
  const std::uint32_t vocab = m.config().vocab_size;
  std::vector<TokenId> seq = prompt;
  ASSERT_EQ(out.logits.size(), out.tokens.size());
  for (std::size_t i = 0; i < out.tokens.size(); ++i) {
    const std::vector<float> all = m.forward_no_cache(seq);
    const std::span<const float> last(all.data() + (seq.size() - 1) * vocab, vocab);
    ASSERT_LE(max_rel_diff(out.logits[i], last), 1e-4)
        << "request " << out.id << " sample " << out.sample_index << " token " << i;
    if (greedy) {
      ASSERT_EQ(out.tokens[i], argmax(last)) << "request " << out.id << " token " << i;
    }
    seq.push_back(out.tokens[i]);
  }
}

// Greedy generation by recomputing everything at every step, checked against
// out: token for token, logits within 1e-4 relative.
inline void expect_matches_reference(const std::vector<TokenId>& prompt, const RequestOutput& out) {
  expect_logits_match_reference(prompt, out, /*greedy=*/true);
}

}  // namespace kvcache::engine::test_ref
