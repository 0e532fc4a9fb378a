// Greedy and temperature / top-p sampling.

#include "kvcache/engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "kvcache/error.h"

namespace kvcache::engine {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    throw InvalidArgument("temperature " + std::to_string(temperature) + " must be >= 0");
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    throw InvalidArgument("top_p " + std::to_string(top_p) + " must be in (0, 1]");
  }
}

TokenId argmax(std::span<const float> logits) {
  if (logits.empty()) throw InvalidArgument("argmax of empty logits");
  return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

TokenId sample(std::span<const float> logits, const SamplingParams& p, std::mt19937_64& rng) {
  if (p.temperature == 0.0f) return argmax(logits);
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<std::pair<float, TokenId>> probs(logits.size());
  double sum = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float e = std::exp((logits[i] - mx) / p.temperature);
    probs[i] = {e, static_cast<TokenId>(i)};
    sum += e;
  }
  // Most likely first; ties by id so the order is deterministic.
  std::sort(probs.begin(), probs.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::size_t keep = 0;
  double mass = 0;
  while (keep < probs.size() && (keep == 0 || mass < p.top_p * sum)) mass += probs[keep++].first;
  const double u = std::uniform_real_distribution<double>(0.0, mass)(rng);
  double acc = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += probs[i].first;
    if (u < acc) return probs[i].second;
  }
  return probs[keep - 1].second;
}

}  // namespace kvcache::engine
