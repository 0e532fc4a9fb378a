// estimate_ttft (kvcache/replay/trace_replay.h): the stated TTFT cost model
// applied to a replay's hits.
#include <cmath>
#include <string>
#include <utility>

#include "kvcache/error.h"
#include "kvcache/replay/trace_replay.h"

namespace kvcache {

namespace {

void check_positive(const char* field, double v) {
  if (!(v > 0) || !std::isfinite(v)) {
    throw InvalidArgument("TTFT model " + std::string(field) + " " + std::to_string(v) +
                          " is not a finite number > 0");
  }
}

void check_model(const TtftModel& m) {
  for (const auto& [field, v] :
       {std::pair{"flops_per_token", m.flops_per_token}, std::pair{"flops_per_s", m.flops_per_s},
        std::pair{"kv_bytes_per_token", m.kv_bytes_per_token},
        std::pair{"host_bytes_per_s", m.host_bytes_per_s},
        std::pair{"disk_bytes_per_s", m.disk_bytes_per_s}})
    check_positive(field, v);
}

// Seconds to bring one token of KV back from `medium`.
double load_s_per_token(const TtftModel& m, const std::string& medium) {
  if (medium == "device") return 0;
  return m.kv_bytes_per_token / (medium == "host" ? m.host_bytes_per_s : m.disk_bytes_per_s);
}

}  // namespace

TtftEstimate estimate_ttft(const ReplayResult& r, const TtftModel& m) {
  check_model(m);
  TtftEstimate e;
  if (r.requests == 0) {
    e.saving_s.assign(r.media.size(), 0);
    return e;
  }
  const double requests = static_cast<double>(r.requests);
  const double compute = m.flops_per_token / m.flops_per_s;  // seconds a prompt token
  e.without_cache_s = static_cast<double>(r.prompt_tokens) * compute / requests;
  e.with_cache_s = static_cast<double>(r.prompt_tokens - r.tokens_hit) * compute / requests;
  for (const ReplayMedium& medium : r.media) {
    const double tokens = static_cast<double>(medium.tokens_hit) / requests;
    const double load = load_s_per_token(m, medium.name);
    e.with_cache_s += tokens * load;
    e.saving_s.push_back(tokens * (compute - load));
  }
  return e;
}

}  // namespace kvcache
