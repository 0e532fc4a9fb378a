// Logits of a cache dtype against a reference dtype's (see kv_accuracy.h).

#include "kvcache/engine/kv_accuracy.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kvcache/error.h"
#include "kvcache/paged_manager.h"

namespace kvcache::engine {
namespace {

std::string num(std::uint64_t v) { return std::to_string(v); }

// One sequence on a paged cache of its own, fed tokens by the caller.
class CachedRun {
 public:
  CachedRun(const Model& model, DType dtype, std::uint32_t page_size, std::uint32_t tokens,
            const KVScales* scales)
      : model_(model),
        manager_(model.config().cache_params(CacheStrategy::paged, page_size, dtype),
                 (tokens + page_size - 1) / page_size, 1, tokens) {
    if (scales != nullptr) manager_.set_kv_scales(*scales);  // refused once a sequence is claimed
    seq_ = manager_.claim(1).at(0);
  }
  ~CachedRun() { manager_.release(seq_); }
  CachedRun(const CachedRun&) = delete;
  CachedRun& operator=(const CachedRun&) = delete;

  // Feeds `tokens`, returns the logits after the last of them.
  std::span<const float> feed(std::span<const TokenId> tokens) {
    const std::uint32_t n = static_cast<std::uint32_t>(tokens.size());
    const KVCacheBatch batch = manager_.fetch(std::span(&seq_, 1), std::span(&n, 1));
    const std::uint32_t offsets[2] = {0, n};
    const std::uint32_t last = n - 1;
    logits_.resize(model_.config().vocab_size);
    model_.forward(tokens, offsets, batch, std::span(&last, 1), logits_, scratch_);
    manager_.step(std::span(&seq_, 1), std::span(&n, 1));
    return logits_;
  }

 private:
  const Model& model_;
  PagedKVCacheManager manager_;
  SeqId seq_ = 0;
  ForwardScratch scratch_;
  std::vector<float> logits_;
};

// log-softmax of x in double.
std::vector<double> log_softmax(std::span<const float> x) {
  const double mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (float v : x) sum += std::exp(double(v) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = double(x[i]) - lse;
  return out;
}

// KL(p || q) of two logit vectors' softmaxes, nats.
double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits) {
  const auto lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0;
  for (std::size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(kl, 0.0);
}

TokenId argmax(std::span<const float> x) {
  return static_cast<TokenId>(std::max_element(x.begin(), x.end()) - x.begin());
}

void check_args(const Model& model, std::span<const TokenId> prompt, std::uint32_t new_tokens,
                const KVCompareOptions& o) {
  if (prompt.empty()) throw InvalidArgument("compare_kv_dtypes: the prompt is empty");
  if (new_tokens == 0) throw InvalidArgument("compare_kv_dtypes: new_tokens is 0");
  if (o.page_size == 0) throw InvalidArgument("compare_kv_dtypes: page_size is 0");
  const std::uint64_t len = std::uint64_t{prompt.size()} + new_tokens;
  if (len > model.config().max_position) {
    throw InvalidArgument("compare_kv_dtypes: prompt " + num(prompt.size()) + " + new_tokens " +
                          num(new_tokens) + " = " + num(len) +
                          " tokens exceeds the model's max_position " +
                          num(model.config().max_position));
  }
}

// The compared cache's static scales: given, calibrated, or none (not fp8).
std::optional<KVScales> scales_for(const Model& model, std::span<const TokenId> prompt,
                                   const KVCompareOptions& o) {
  if (!is_fp8(o.dtype)) return std::nullopt;
  if (o.scales) return o.scales;
  const std::size_t n = std::min<std::size_t>(prompt.size(), std::max(o.calibration_tokens, 1u));
  return model.calibrate_kv_scales(prompt.first(n), o.dtype, o.headroom);
}

}  // namespace

KVCompareReport compare_kv_dtypes(const Model& model, std::span<const TokenId> prompt,
                                  std::uint32_t new_tokens, const KVCompareOptions& o) {
  check_args(model, prompt, new_tokens, o);
  const auto scales = scales_for(model, prompt, o);
  const auto total = static_cast<std::uint32_t>(prompt.size() + new_tokens);
  CachedRun ref(model, o.reference, o.page_size, total, nullptr);
  CachedRun test(model, o.dtype, o.page_size, total, scales ? &*scales : nullptr);
  KVCompareReport r;
  r.reference = o.reference, r.dtype = o.dtype;
  r.prompt_tokens = static_cast<std::uint32_t>(prompt.size());
  if (scales) r.scales = *scales;
  r.tokens.reserve(new_tokens);
  std::span<const TokenId> input = prompt;
  std::uint32_t agree = 0;
  double kl_sum = 0;
  for (std::uint32_t i = 0; i < new_tokens; ++i) {
    const auto a = ref.feed(input);
    const auto b = test.feed(input);
    for (std::size_t v = 0; v < a.size(); ++v)
      r.max_logit_diff = std::max(r.max_logit_diff, std::fabs(double(a[v]) - double(b[v])));
    const double kl = kl_divergence(a, b);
    kl_sum += kl;
    r.max_kl = std::max(r.max_kl, kl);
    agree += argmax(a) == argmax(b);
    r.tokens.push_back(argmax(a));
    input = std::span(&r.tokens.back(), 1);
  }
  r.positions = new_tokens;
  r.mean_kl = kl_sum / new_tokens;
  r.top1_agreement = double(agree) / new_tokens;
  return r;
}

}  // namespace kvcache::engine
