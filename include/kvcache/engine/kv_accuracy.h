// kvcache/engine/kv_accuracy.h — how far a cache dtype moves the model's
// logits from a reference dtype's.
//
// `compare_kv_dtypes` runs one prompt through the model twice in lockstep,
// each on a paged cache of its own dtype (same page size): the prompt in one
// prefill, then `new_tokens` - 1 decode steps. Both are fed the reference's
// greedy tokens (teacher forcing: the compared cache never picks a token, so
// position i means the same context in both). At each of the `new_tokens`
// positions whose next token is predicted (the prompt's last, then every
// generated one) it compares the two logit vectors: the largest absolute
// difference, the KL divergence KL(reference || compared) of their softmaxes
// (nats, in double), and whether their top-1 tokens agree.
//
// fp8 caches need static K/V scales: `scales` when given (its shape must be
// the model's), else Model::calibrate_kv_scales over the prompt's first
// `calibration_tokens` tokens with `headroom` (docs/quantization.md).
//
// Thread-safety: a free function over a const Model; the managers it builds
// are its own.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kvcache/dtype.h"
#include "kvcache/engine/model.h"
#include "kvcache/kv_scales.h"

namespace kvcache::engine {

struct KVCompareOptions {
  DType reference = DType::f32;
  DType dtype = DType::int8;
  std::uint32_t page_size = 16;
  std::uint32_t calibration_tokens = 256;  // fp8: the prompt's first tokens calibrate
  float headroom = 1.0f;                   // fp8: calibrate_kv_scales's headroom
  std::optional<KVScales> scales{};        // fp8: these scales instead of calibrating
};

struct KVCompareReport {
  DType reference = DType::f32, dtype = DType::int8;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t positions = 0;     // compared logit vectors (= new_tokens)
  double max_logit_diff = 0;       // max over positions and vocabulary of |a - b|
  double mean_kl = 0, max_kl = 0;  // KL(reference || compared), nats
  double top1_agreement = 0;       // fraction of positions with equal argmax
  std::vector<TokenId> tokens;     // the reference's greedy tokens
  KVScales scales{};               // fp8: the scales the compared cache used
};

// Throws InvalidArgument: empty prompt or ids outside the vocabulary,
// new_tokens 0, prompt + new_tokens past the model's max_position, a page
// size of 0, scales of another shape, a cache the dtype cannot hold (int8
// with head_dim not a multiple of 4).
KVCompareReport compare_kv_dtypes(const Model& model, std::span<const TokenId> prompt,
                                  std::uint32_t new_tokens, const KVCompareOptions& options);

}  // namespace kvcache::engine
