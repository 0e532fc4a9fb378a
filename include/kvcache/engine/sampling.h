// kvcache/engine/sampling.h — choosing the next token from logits.
//
// temperature == 0: greedy (argmax; the lowest id wins ties). Otherwise
// softmax(logits / temperature), restricted to the smallest set of most
// likely tokens whose mass reaches top_p, sampled with the caller's
// generator — a request seeded the same way samples the same tokens.
// Pure functions; thread-safe given distinct generators.
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "kvcache/engine/model.h"

namespace kvcache::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0 => greedy
  float top_p = 1.0f;        // (0, 1]
  std::uint64_t seed = 0;    // per-request generator seed

  // Throws InvalidArgument: temperature < 0 or not finite, top_p outside (0, 1].
  void validate() const;
};

TokenId argmax(std::span<const float> logits);

// Throws InvalidArgument for empty logits.
TokenId sample(std::span<const float> logits, const SamplingParams& params, std::mt19937_64& rng);

}  // namespace kvcache::engine
