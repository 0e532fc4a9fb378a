// Synthetic chat workload and the Mooncake trace reader.

#include "kvcache/engine/workload.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "kvcache/engine/trace_file.h"
#include "kvcache/error.h"

namespace kvcache::engine {
namespace {

std::uint32_t lognormal(std::mt19937_64& rng, double median, double sigma, std::uint32_t max) {
  std::normal_distribution<double> n(0.0, sigma);
  const double v = median * std::exp(n(rng));
  return static_cast<std::uint32_t>(std::clamp(std::round(v), 1.0, double(max)));
}

// Tokens of a block depend only on its id: equal ids give equal tokens.
void append_block(std::vector<TokenId>& out, std::uint64_t block_id, std::uint32_t n,
                  std::uint32_t vocab) {
  std::mt19937_64 rng(block_id * 0x9e3779b97f4a7c15ull + 17);
  for (std::uint32_t i = 0; i < n; ++i) out.push_back(static_cast<TokenId>(rng() % vocab));
}

}  // namespace

std::vector<WorkloadRequest> chat_workload(const ChatWorkloadOptions& o) {
  if (o.vocab_size == 0 || !(o.rate > 0) || !std::isfinite(o.rate)) {
    throw InvalidArgument("chat workload: vocab_size " + std::to_string(o.vocab_size) +
                          " and rate " + std::to_string(o.rate) + " must be > 0 (the rate finite)");
  }
  const std::uint64_t per_request = std::uint64_t{o.system_prompt_tokens} + o.user_max;
  if (per_request != 0 && o.requests > kMaxWorkloadTokens / per_request) {
    throw InvalidArgument("chat workload: " + std::to_string(o.requests) + " requests x (" +
                          std::to_string(o.system_prompt_tokens) + " system + up to " +
                          std::to_string(o.user_max) + " user tokens) exceeds the limit of " +
                          std::to_string(kMaxWorkloadTokens) + " prompt tokens");
  }
  std::mt19937_64 rng(o.seed);
  std::vector<TokenId> system;
  append_block(system, o.seed ^ 0x5157u, o.system_prompt_tokens, o.vocab_size);
  std::exponential_distribution<double> gap(o.rate);
  std::vector<WorkloadRequest> out;
  double t = 0;
  for (std::uint32_t i = 0; i < o.requests; ++i) {
    WorkloadRequest r;
    r.arrival = t;
    t += gap(rng);
    r.prompt = system;
    append_block(r.prompt, rng(), lognormal(rng, o.user_median, 0.8, o.user_max), o.vocab_size);
    r.output_tokens = lognormal(rng, o.output_median, 0.7, o.output_max);
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

// One trace request as a workload request: lengths scaled (at most 2^20 x 16
// tokens each, trace_file.h and kMaxTraceScale) and capped by
// max_total_tokens; the prompt built from the hash ids' blocks, padded with a
// block of its own when the ids run out.
WorkloadRequest scaled_request(const TraceRequest& t, std::size_t lineno, std::uint32_t block,
                               const TraceOptions& o) {
  WorkloadRequest r;
  auto in_len = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(t.input_length * o.scale));
  r.output_tokens =
      std::max<std::uint32_t>(1, static_cast<std::uint32_t>(t.output_length * o.scale));
  if (o.max_total_tokens) {
    r.output_tokens = std::min(r.output_tokens, o.max_total_tokens / 2);
    in_len = std::min(in_len, o.max_total_tokens - r.output_tokens);
  }
  for (const std::uint64_t id : t.hash_ids) {
    if (r.prompt.size() >= in_len) break;
    append_block(r.prompt, id, std::min<std::uint32_t>(block, in_len - r.prompt.size()),
                 o.vocab_size);
  }
  if (r.prompt.size() < in_len) {
    append_block(r.prompt, 0xfeedull + lineno, in_len - r.prompt.size(), o.vocab_size);
  }
  return r;
}

}  // namespace

std::vector<WorkloadRequest> load_mooncake_trace(const std::string& path, const TraceOptions& o) {
  if (!(o.scale > 0 && o.scale <= kMaxTraceScale) || o.vocab_size == 0) {
    throw InvalidArgument("trace: scale " + std::to_string(o.scale) + " must be in (0, " +
                          std::to_string(kMaxTraceScale) + "] and vocab_size " +
                          std::to_string(o.vocab_size) + " > 0");
  }
  const auto block = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(512 * o.scale));
  std::vector<WorkloadRequest> out;
  double t0 = -1;
  std::uint64_t tokens = 0;
  for_each_trace_request(path, [&](TraceRequest&& t, std::size_t lineno) {
    if (t0 < 0) t0 = t.timestamp_ms;
    WorkloadRequest r = scaled_request(t, lineno, block, o);
    r.arrival = (t.timestamp_ms - t0) / 1000.0;
    tokens += r.prompt.size();
    if (tokens > kMaxWorkloadTokens) {
      throw InvalidArgument("the prompts up to here hold " + std::to_string(tokens) +
                            " tokens, more than the limit of " +
                            std::to_string(kMaxWorkloadTokens));
    }
    out.push_back(std::move(r));
    return o.max_requests == 0 || out.size() < o.max_requests;
  });
  return out;
}

}  // namespace kvcache::engine
