// Llama-style decoder: config/presets, seeded weights, the cached forward
// pass over a KVCacheBatch and the no-cache oracle.

#include "kvcache/engine/model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "engine/kernels_bridge.h"
#include "engine/linalg.h"
#include "kvcache/error.h"

namespace kvcache::engine {
namespace {

std::string num(std::size_t v) { return std::to_string(v); }

void require_positive(const char* field, std::uint32_t v) {
  if (v == 0) throw InvalidArgument(std::string("model config: ") + field + " must be > 0");
}

// splitmix64: a tiny, portable, deterministic generator for weights.
struct SplitMix {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float uniform() { return static_cast<float>((next() >> 40) * 0x1.0p-23 - 1.0); }
};

std::vector<float> random_matrix(SplitMix& rng, std::size_t rows, std::size_t cols, float scale) {
  std::vector<float> m(rows * cols);
  for (float& x : m) x = rng.uniform() * scale;
  return m;
}

std::vector<float> random_norm(SplitMix& rng, std::size_t n) {
  std::vector<float> w(n);
  for (float& x : w) x = 1.0f + 0.1f * rng.uniform();
  return w;
}

void check_len(const std::string& name, std::size_t got, std::size_t want) {
  if (got != want) {
    throw InvalidArgument("weight " + name + " has " + num(got) + " elements, config needs " +
                          num(want));
  }
}

}  // namespace

void ModelConfig::validate() const {
  require_positive("vocab_size", vocab_size);
  require_positive("hidden_size", hidden_size);
  require_positive("intermediate_size", intermediate_size);
  require_positive("num_layers", num_layers);
  require_positive("n_q_heads", n_q_heads);
  require_positive("n_kv_heads", n_kv_heads);
  require_positive("head_dim", head_dim);
  require_positive("max_position", max_position);
  if (n_q_heads % n_kv_heads != 0) {
    throw InvalidArgument("model config: n_q_heads " + num(n_q_heads) +
                          " is not a multiple of n_kv_heads " + num(n_kv_heads));
  }
  if (head_dim % 2 != 0) {
    throw InvalidArgument("model config: head_dim " + num(head_dim) + " must be even (RoPE)");
  }
  if (!(rope_theta > 0.0f) || !(rms_norm_eps > 0.0f)) {
    throw InvalidArgument("model config: rope_theta and rms_norm_eps must be > 0");
  }
}

KVCacheParams ModelConfig::cache_params(CacheStrategy strategy, std::uint32_t page_size,
                                        DType dtype) const {
  KVCacheParams p;
  p.dtype = dtype;
  p.num_layers = num_layers;
  p.n_kv_heads = n_kv_heads;
  p.head_dim = head_dim;
  p.cache_strategy = strategy;
  p.page_size = strategy == CacheStrategy::paged ? page_size : 0;
  return p;
}

std::size_t ModelConfig::num_parameters() const {
  const std::size_t h = hidden_size, qd = std::size_t{n_q_heads} * head_dim,
                    kvd = std::size_t{n_kv_heads} * head_dim, f = intermediate_size;
  const std::size_t layer = 2 * h + h * qd * 2 + h * kvd * 2 + 3 * h * f;
  return std::size_t{vocab_size} * h * (tie_word_embeddings ? 1 : 2) + h + num_layers * layer;
}

ModelConfig model_preset(std::string_view name) {
  ModelConfig c;
  c.name = std::string(name);
  if (name == "tiny") {
    c.vocab_size = 97, c.hidden_size = 32, c.intermediate_size = 64, c.num_layers = 2;
    c.n_q_heads = 4, c.n_kv_heads = 2, c.head_dim = 8;
  } else if (name == "small") {
    c.vocab_size = 2048, c.hidden_size = 256, c.intermediate_size = 704, c.num_layers = 4;
    c.n_q_heads = 4, c.n_kv_heads = 2, c.head_dim = 64;
  } else if (name == "base") {
    c.vocab_size = 4096, c.hidden_size = 512, c.intermediate_size = 1408, c.num_layers = 8;
    c.n_q_heads = 8, c.n_kv_heads = 2, c.head_dim = 64;
  } else {
    throw InvalidArgument("unknown model preset '" + std::string(name) +
                          "' (known: tiny, small, base)");
  }
  return c;
}

std::vector<std::string_view> model_preset_names() { return {"tiny", "small", "base"}; }

ModelWeights ModelWeights::random(const ModelConfig& c, std::uint64_t seed) {
  c.validate();
  SplitMix rng{seed};
  const std::size_t h = c.hidden_size, qd = std::size_t{c.n_q_heads} * c.head_dim,
                    kvd = std::size_t{c.n_kv_heads} * c.head_dim, f = c.intermediate_size;
  // Uniform(-a, a) has variance a^2/3: a = sqrt(3/fan_in) keeps unit variance.
  auto scale = [](std::size_t fan_in) { return std::sqrt(3.0f / static_cast<float>(fan_in)); };
  ModelWeights w;
  w.embed_tokens = random_matrix(rng, c.vocab_size, h, 1.0f);
  for (std::uint32_t l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.input_norm = random_norm(rng, h);
    lw.q_proj = random_matrix(rng, qd, h, scale(h));
    lw.k_proj = random_matrix(rng, kvd, h, scale(h));
    lw.v_proj = random_matrix(rng, kvd, h, scale(h));
    lw.o_proj = random_matrix(rng, h, qd, 0.5f * scale(qd));
    lw.post_norm = random_norm(rng, h);
    lw.gate_proj = random_matrix(rng, f, h, scale(h));
    lw.up_proj = random_matrix(rng, f, h, scale(h));
    lw.down_proj = random_matrix(rng, h, f, 0.5f * scale(f));
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = random_norm(rng, h);
  if (!c.tie_word_embeddings) w.lm_head = random_matrix(rng, c.vocab_size, h, 2.0f * scale(h));
  return w;
}

void ModelWeights::check(const ModelConfig& c) const {
  c.validate();
  const std::size_t h = c.hidden_size, qd = std::size_t{c.n_q_heads} * c.head_dim,
                    kvd = std::size_t{c.n_kv_heads} * c.head_dim, f = c.intermediate_size;
  check_len("embed_tokens", embed_tokens.size(), c.vocab_size * h);
  if (layers.size() != c.num_layers) {
    throw InvalidArgument("weights have " + num(layers.size()) + " layers, config needs " +
                          num(c.num_layers));
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const LayerWeights& lw = layers[l];
    const std::string p = "layers." + num(l) + ".";
    check_len(p + "input_layernorm", lw.input_norm.size(), h);
    check_len(p + "q_proj", lw.q_proj.size(), qd * h);
    check_len(p + "k_proj", lw.k_proj.size(), kvd * h);
    check_len(p + "v_proj", lw.v_proj.size(), kvd * h);
    check_len(p + "o_proj", lw.o_proj.size(), h * qd);
    check_len(p + "post_attention_layernorm", lw.post_norm.size(), h);
    check_len(p + "gate_proj", lw.gate_proj.size(), f * h);
    check_len(p + "up_proj", lw.up_proj.size(), f * h);
    check_len(p + "down_proj", lw.down_proj.size(), h * f);
  }
  check_len("norm", final_norm.size(), h);
  check_len("lm_head", lm_head.size(), c.tie_word_embeddings ? 0 : c.vocab_size * h);
}

namespace {

// The model's RoPE table, built once config and weights have been checked
// (a malformed config gets InvalidArgument, not an allocation of its size).
RopeTable rope_table_of(const ModelConfig& c, const ModelWeights& w) {
  w.check(c);  // validates c too
  return RopeTable(RopeOptions{true, c.rope_theta, 0}, c.head_dim,
                   std::min(c.max_position, Model::kRopeTablePositions));
}

}  // namespace

Model::Model(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      rope_table_(rope_table_of(config_, weights_)) {}

void Model::check_tokens(std::span<const TokenId> tokens) const {
  for (TokenId t : tokens) {
    if (t < 0 || static_cast<std::uint32_t>(t) >= config_.vocab_size) {
      throw InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                            num(config_.vocab_size) + ")");
    }
  }
}

namespace {

// Shared layer body: everything but attention, which the caller supplies.
// K is rotated here only with rotate_k (the cached path has store_kv rotate
// it on the way into the cache).
template <class Attend>
void run_layers(const ModelConfig& c, const ModelWeights& w, const RopeTable& rope, bool rotate_k,
                std::size_t rows, std::span<const std::uint32_t> positions, ForwardScratch& s,
                Attend&& attend) {
  const std::size_t h = c.hidden_size, qd = std::size_t{c.n_q_heads} * c.head_dim,
                    kvd = std::size_t{c.n_kv_heads} * c.head_dim, f = c.intermediate_size;
  s.h.resize(rows * h);
  s.q.resize(rows * qd);
  s.k.resize(rows * kvd);
  s.v.resize(rows * kvd);
  s.attn.resize(rows * qd);
  s.mlp_gate.resize(rows * f);
  s.mlp_up.resize(rows * f);
  for (std::uint32_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    rms_norm(s.x.data(), rows, h, lw.input_norm.data(), c.rms_norm_eps, s.h.data());
    linear(s.h.data(), rows, h, lw.q_proj.data(), qd, s.q.data());
    linear(s.h.data(), rows, h, lw.k_proj.data(), kvd, s.k.data());
    linear(s.h.data(), rows, h, lw.v_proj.data(), kvd, s.v.data());
    apply_rope(s.q.data(), rows, c.n_q_heads, c.head_dim, positions, rope);
    if (rotate_k) apply_rope(s.k.data(), rows, c.n_kv_heads, c.head_dim, positions, rope);
    attend(l);
    linear(s.attn.data(), rows, qd, lw.o_proj.data(), h, s.x.data(), /*accumulate=*/true);
    rms_norm(s.x.data(), rows, h, lw.post_norm.data(), c.rms_norm_eps, s.h.data());
    linear(s.h.data(), rows, h, lw.gate_proj.data(), f, s.mlp_gate.data());
    linear(s.h.data(), rows, h, lw.up_proj.data(), f, s.mlp_up.data());
    silu_mul(s.mlp_gate.data(), s.mlp_up.data(), rows * f);
    linear(s.mlp_gate.data(), rows, f, lw.down_proj.data(), h, s.x.data(), /*accumulate=*/true);
  }
}

void embed(const ModelConfig& c, const ModelWeights& w, std::span<const TokenId> tokens,
           ForwardScratch& s) {
  const std::size_t h = c.hidden_size;
  s.x.resize(tokens.size() * h);
  for (std::size_t r = 0; r < tokens.size(); ++r) {
    std::copy_n(w.embed_tokens.data() + static_cast<std::size_t>(tokens[r]) * h, h,
                s.x.data() + r * h);
  }
}

void lm_head(const ModelConfig& c, const ModelWeights& w, std::span<const std::uint32_t> rows,
             std::span<float> logits, ForwardScratch& s) {
  const std::size_t h = c.hidden_size;
  s.rows.resize(rows.size() * h);
  s.logits_rows.resize(rows.size() * h);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(s.x.data() + std::size_t{rows[i]} * h, h, s.rows.data() + i * h);
  }
  rms_norm(s.rows.data(), rows.size(), h, w.final_norm.data(), c.rms_norm_eps,
           s.logits_rows.data());
  const float* head = c.tie_word_embeddings ? w.embed_tokens.data() : w.lm_head.data();
  linear(s.logits_rows.data(), rows.size(), h, head, c.vocab_size, logits.data());
}

// Plain causal GQA attention over rows [0, n) of q/k/v (no cache): the oracle.
void attention_no_cache(const ModelConfig& c, std::size_t n, const float* q, const float* k,
                        const float* v, float* out) {
  const std::size_t dim = c.head_dim, qd = std::size_t{c.n_q_heads} * dim,
                    kvd = std::size_t{c.n_kv_heads} * dim;
  const std::uint32_t group = c.n_q_heads / c.n_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  std::vector<double> p(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::uint32_t head = 0; head < c.n_q_heads; ++head) {
      const float* qi = q + i * qd + head * dim;
      const std::size_t kvh = head / group;
      double mx = -std::numeric_limits<double>::infinity();
      for (std::size_t t = 0; t <= i; ++t) {
        double s = 0;
        for (std::size_t d = 0; d < dim; ++d) s += double(qi[d]) * k[t * kvd + kvh * dim + d];
        p[t] = s * scale;
        mx = std::max(mx, p[t]);
      }
      double sum = 0;
      for (std::size_t t = 0; t <= i; ++t) sum += (p[t] = std::exp(p[t] - mx));
      float* o = out + i * qd + head * dim;
      for (std::size_t d = 0; d < dim; ++d) {
        double acc = 0;
        for (std::size_t t = 0; t <= i; ++t) acc += p[t] * v[t * kvd + kvh * dim + d];
        o[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

void check_batch(const ModelConfig& c, const KVCacheBatch& batch,
                 std::span<const std::uint32_t> row_offsets, std::size_t num_tokens) {
  const KVCacheParams& p = batch.params();
  if (p.num_layers != c.num_layers || p.n_kv_heads != c.n_kv_heads || p.head_dim != c.head_dim ||
      p.n_devices != 1) {
    throw InvalidArgument("cache " + p.to_string() + " does not fit model '" + c.name +
                          "' (needs L" + num(c.num_layers) + " kv" + num(c.n_kv_heads) + " d" +
                          num(c.head_dim) + " on one device)");
  }
  if (row_offsets.size() != std::size_t{batch.batch_size()} + 1) {
    throw InvalidArgument("row_offsets has " + num(row_offsets.size()) +
                          " entries, the batch needs " + num(batch.batch_size() + 1));
  }
  if (row_offsets.back() != num_tokens) {
    throw InvalidArgument("row_offsets ends at " + num(row_offsets.back()) + " but " +
                          num(num_tokens) + " tokens were given");
  }
}

}  // namespace

void Model::forward(std::span<const TokenId> tokens, std::span<const std::uint32_t> row_offsets,
                    const KVCacheBatch& batch, std::span<const std::uint32_t> logit_rows,
                    std::span<float> logits, ForwardScratch& s) const {
  check_tokens(tokens);
  check_batch(config_, batch, row_offsets, tokens.size());
  if (logits.size() != logit_rows.size() * config_.vocab_size) {
    throw InvalidArgument("logits has " + num(logits.size()) + " floats, expected " +
                          num(logit_rows.size() * config_.vocab_size));
  }
  for (std::uint32_t r : logit_rows) {
    if (r >= tokens.size()) {
      throw InvalidArgument("logit row " + num(r) + " is past the " + num(tokens.size()) +
                            " tokens of the batch");
    }
  }
  const std::size_t rows = tokens.size();
  s.positions.resize(rows);
  const auto lengths = batch.cache_lengths();
  for (std::uint32_t b = 0; b + 1 < row_offsets.size(); ++b) {
    for (std::uint32_t r = row_offsets[b]; r < row_offsets[b + 1]; ++r) {
      s.positions[r] = lengths[b] + (r - row_offsets[b]);
    }
  }
  embed(config_, weights_, tokens, s);
  StoreOptions store;
  store.rope_k = RopeOptions{true, config_.rope_theta, 0};
  store.rope_table = &rope_table_;
  run_layers(config_, weights_, rope_table_, /*rotate_k=*/false, rows, s.positions, s,
             [&](std::uint32_t layer) {
               store_and_attend(batch, layer, s.k, s.v, store, s.q, config_.n_q_heads, row_offsets,
                                s.attn);
             });
  lm_head(config_, weights_, logit_rows, logits, s);
}

std::vector<float> Model::forward_no_cache(std::span<const TokenId> tokens) const {
  check_tokens(tokens);
  ForwardScratch s;
  const std::size_t n = tokens.size();
  s.positions.resize(n);
  for (std::size_t i = 0; i < n; ++i) s.positions[i] = static_cast<std::uint32_t>(i);
  embed(config_, weights_, tokens, s);
  run_layers(config_, weights_, rope_table_, /*rotate_k=*/true, n, s.positions, s,
             [&](std::uint32_t) {
               attention_no_cache(config_, n, s.q.data(), s.k.data(), s.v.data(), s.attn.data());
             });
  std::vector<std::uint32_t> all(n);
  for (std::size_t i = 0; i < n; ++i) all[i] = static_cast<std::uint32_t>(i);
  std::vector<float> logits(n * config_.vocab_size);
  lm_head(config_, weights_, all, logits, s);
  return logits;
}

KVScales Model::calibrate_kv_scales(std::span<const TokenId> tokens, DType dtype,
                                    float headroom) const {
  if (!is_fp8(dtype)) {
    throw InvalidArgument("calibrate_kv_scales: dtype " + std::string(dtype_name(dtype)) +
                          " has no static scales (fp8_e4m3 and fp8_e5m2 do)");
  }
  if (tokens.empty()) throw InvalidArgument("calibrate_kv_scales: no calibration tokens");
  if (!(headroom >= 1.0f) || !std::isfinite(headroom)) {
    throw InvalidArgument("calibrate_kv_scales: headroom " + std::to_string(headroom) +
                          " must be finite and >= 1");
  }
  check_tokens(tokens);
  ForwardScratch s;
  const std::size_t n = tokens.size();
  s.positions.resize(n);
  for (std::size_t i = 0; i < n; ++i) s.positions[i] = static_cast<std::uint32_t>(i);
  embed(config_, weights_, tokens, s);
  KVScales scales(config_.num_layers, config_.n_kv_heads);
  run_layers(config_, weights_, rope_table_, /*rotate_k=*/true, n, s.positions, s,
             [&](std::uint32_t layer) {
               for (std::uint32_t kv = 0; kv < 2; ++kv) {
                 std::vector<float> head = fp8_head_scales(dtype, config_.n_kv_heads,
                                                           config_.head_dim, kv == 0 ? s.k : s.v);
                 for (float& x : head) x *= headroom;
                 scales.set(layer, kv, head);
               }
               attention_no_cache(config_, n, s.q.data(), s.k.data(), s.v.data(), s.attn.data());
             });
  return scales;
}

}  // namespace kvcache::engine
