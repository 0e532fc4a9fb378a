// Synthetic chat workload and the Mooncake trace reader.

#include "kvcache/engine/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

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
  if (o.vocab_size == 0 || !(o.rate > 0)) {
    throw InvalidArgument("chat workload: vocab_size and rate must be > 0");
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

std::vector<WorkloadRequest> load_mooncake_trace(const std::string& path, const TraceOptions& o) {
  if (!(o.scale > 0) || o.vocab_size == 0) {
    throw InvalidArgument("trace: scale and vocab_size must be > 0");
  }
  std::ifstream in(path);
  if (!in) throw InvalidArgument("trace: cannot open '" + path + "'");
  const auto block = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(512 * o.scale));
  std::vector<WorkloadRequest> out;
  std::string line;
  double t0 = -1;
  for (std::size_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (o.max_requests && out.size() >= o.max_requests) break;
    WorkloadRequest r;
    try {
      const auto j = nlohmann::json::parse(line);
      const double ts = j.at("timestamp").get<double>();
      if (t0 < 0) t0 = ts;
      r.arrival = (ts - t0) / 1000.0;
      const auto input = j.at("input_length").get<std::uint64_t>();
      const auto output = j.at("output_length").get<std::uint64_t>();
      auto in_len = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(input * o.scale));
      r.output_tokens = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(output * o.scale));
      if (o.max_total_tokens) {
        r.output_tokens = std::min(r.output_tokens, o.max_total_tokens / 2);
        in_len = std::min(in_len, o.max_total_tokens - r.output_tokens);
      }
      for (const auto& id : j.at("hash_ids")) {
        if (r.prompt.size() >= in_len) break;
        append_block(r.prompt, id.get<std::uint64_t>(),
                     std::min<std::uint32_t>(block, in_len - r.prompt.size()), o.vocab_size);
      }
      if (r.prompt.size() < in_len) {
        append_block(r.prompt, 0xfeedull + lineno, in_len - r.prompt.size(), o.vocab_size);
      }
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgument("trace " + path + " line " + std::to_string(lineno) + ": " + e.what());
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) throw InvalidArgument("trace: '" + path + "' holds no requests");
  return out;
}

}  // namespace kvcache::engine
