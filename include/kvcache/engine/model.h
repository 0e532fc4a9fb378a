// kvcache/engine/model.h — a small Llama-architecture decoder on the kvcache API.
//
// Embedding -> N x [RMSNorm -> Q/K/V -> RoPE on Q -> store_kv with RoPE on K
// fused (StoreOptions::rope_k) + attention (GQA, through the cache) -> O ->
// residual -> RMSNorm -> SwiGLU MLP -> residual]
// -> RMSNorm -> LM head. All math in fp32; matrix products through BLAS.
// Weights use the Hugging Face Llama layout ([out_features][in_features],
// rotate-half RoPE), so a safetensors checkpoint loads without permutation.
//
// `forward` runs one ragged batch against a KVCacheBatch from either manager:
// entry b contributes tokens [row_offsets[b], row_offsets[b+1]) at positions
// cache_length(b) + i; the caller has fetched room for them and steps the
// manager afterwards (the model never touches manager state).
// `forward_no_cache` recomputes a whole sequence with plain causal attention:
// the oracle the cached path is tested against.
//
// Thread-safety: a Model is immutable after construction; forward() uses a
// per-call scratch arena passed by the caller (ForwardScratch), so distinct
// scratches may run concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/batch.h"
#include "kvcache/kernels/rope_table.h"
#include "kvcache/kv_scales.h"
#include "kvcache/params.h"

namespace kvcache::engine {

using TokenId = std::int32_t;

struct ModelConfig {
  std::string name = "custom";
  std::uint32_t vocab_size = 256;
  std::uint32_t hidden_size = 64;
  std::uint32_t intermediate_size = 128;
  std::uint32_t num_layers = 2;
  std::uint32_t n_q_heads = 4;
  std::uint32_t n_kv_heads = 2;
  std::uint32_t head_dim = 16;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-5f;
  std::uint32_t max_position = 4096;
  bool tie_word_embeddings = false;

  // Throws InvalidArgument naming the field: zero sizes, n_q_heads not a
  // multiple of n_kv_heads, odd head_dim (RoPE pairs).
  void validate() const;
  // The KV cache shape this model needs (given strategy / page size, f32
  // unless `dtype` says otherwise: any DType; an 8-bit cache is
  // docs/quantization.md's, int8 needing head_dim a multiple of 4).
  KVCacheParams cache_params(CacheStrategy strategy, std::uint32_t page_size,
                             DType dtype = DType::f32) const;
  std::size_t num_parameters() const;
};

// "tiny" (tests: 2 layers, hidden 32), "small" (demo: 4 layers, hidden 256),
// "base" (8 layers, hidden 512). Throws InvalidArgument for unknown names.
ModelConfig model_preset(std::string_view name);
std::vector<std::string_view> model_preset_names();

// Weights in HF Llama layout; every matrix is row-major [out][in].
struct LayerWeights {
  std::vector<float> input_norm;  // [hidden]
  std::vector<float> q_proj;      // [heads*head_dim][hidden]
  std::vector<float> k_proj;      // [kv_heads*head_dim][hidden]
  std::vector<float> v_proj;      // [kv_heads*head_dim][hidden]
  std::vector<float> o_proj;      // [hidden][heads*head_dim]
  std::vector<float> post_norm;   // [hidden]
  std::vector<float> gate_proj;   // [intermediate][hidden]
  std::vector<float> up_proj;     // [intermediate][hidden]
  std::vector<float> down_proj;   // [hidden][intermediate]
};

struct ModelWeights {
  std::vector<float> embed_tokens;  // [vocab][hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> lm_head;     // [vocab][hidden]; empty when tied to embed_tokens

  // Deterministic weights from a seed (scaled so activations stay O(1)).
  static ModelWeights random(const ModelConfig& config, std::uint64_t seed);
  // Throws InvalidArgument naming the first tensor whose size does not match config.
  void check(const ModelConfig& config) const;
};

// Reusable buffers of one forward pass (grow on demand, never shrink).
struct ForwardScratch {
  std::vector<float> x, h, q, k, v, attn, mlp_gate, mlp_up, rows, logits_rows;
  std::vector<std::uint32_t> positions;
};

class Model {
 public:
  // Throws InvalidArgument (bad config or weight sizes).
  Model(ModelConfig config, ModelWeights weights);
  static Model from_seed(const ModelConfig& config, std::uint64_t seed) {
    return Model(config, ModelWeights::random(config, seed));
  }

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // The RoPE angles of positions [0, min(max_position, kRopeTablePositions)),
  // shared by Q's rotation and the fused store's rotation of K (positions
  // past it are computed per token). Built once by the constructor:
  // positions x head_dim floats (16 MiB at 32768 x 128).
  const RopeTable& rope_table() const { return rope_table_; }
  static constexpr std::uint32_t kRopeTablePositions = 32768;

  // One ragged step. tokens: all new tokens, entry b owns
  // [row_offsets[b], row_offsets[b+1]). logit_rows: indices into tokens
  // whose logits are wanted (e.g. the last token of each finished prefill);
  // logits receives logit_rows.size() * vocab floats. The batch must come
  // from a fetch of exactly these entries with these token counts and a
  // cache of this model's shape, of any dtype (an fp8 batch carries its
  // manager's static scales: calibrate_kv_scales). Throws InvalidArgument on
  // shape mismatch or token ids outside the vocabulary.
  void forward(std::span<const TokenId> tokens, std::span<const std::uint32_t> row_offsets,
               const KVCacheBatch& batch, std::span<const std::uint32_t> logit_rows,
               std::span<float> logits, ForwardScratch& scratch) const;

  // Logits of every position of `tokens` ([tokens.size()][vocab]), computed
  // without a cache (full causal attention recomputed). The test oracle.
  std::vector<float> forward_no_cache(std::span<const TokenId> tokens) const;

  // Static K/V scales for an fp8 cache (kv_scales.h) from a calibration pass
  // over `tokens` without a cache: fp8_head_scales of every layer's K (after
  // RoPE, as the cache holds it) and V over these tokens, each multiplied by
  // `headroom` (>= 1: values up to headroom x the calibration's largest keep
  // their own code; larger ones saturate). Throws InvalidArgument for a
  // dtype that is not fp8, no tokens, ids outside the vocabulary or a
  // headroom that is not finite and >= 1.
  KVScales calibrate_kv_scales(std::span<const TokenId> tokens, DType dtype,
                               float headroom = 1.0f) const;

 private:
  void check_tokens(std::span<const TokenId> tokens) const;
  ModelConfig config_;
  ModelWeights weights_;
  RopeTable rope_table_;
};

}  // namespace kvcache::engine
