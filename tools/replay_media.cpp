#include "replay_media.h"

#include <cstdio>
#include <string>

#include "table.h"

namespace kvcache::tools {

namespace {

std::string fixed(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string first_request(const ReplayMedium& m) {
  return m.first_hit_request == ReplayMedium::kNoRequest ? "-" : with_commas(m.first_hit_request);
}

}  // namespace

std::string ttft_model_text(const TtftModel& m) {
  return fixed("%.3g", m.flops_per_token / 1e9) + " GFLOP/token prefilled at " +
         fixed("%.4g", m.flops_per_s / 1e12) + " TFLOP/s, " +
         fixed("%.4g", m.kv_bytes_per_token / 1024) + " KiB of KV/token, host " +
         fixed("%.4g", m.host_bytes_per_s / 1e9) + " GB/s, disk " +
         fixed("%.4g", m.disk_bytes_per_s / 1e9) + " GB/s";
}

void print_media(std::ostream& out, const ReplayResult& r, const TtftModel& model) {
  const TtftEstimate e = estimate_ttft(r, model);
  Table t({"medium", "hit share", "block hit", "pages hit", "first hit", "stored", "loaded",
           "dropped", "load failures", "TTFT saved ms"});
  for (std::size_t i = 0; i < r.media.size(); ++i) {
    const ReplayMedium& m = r.media[i];
    const bool tier = i > 0;
    t.add_row({m.name, fixed("%.4f", r.hit_share(i)), fixed("%.4f", r.medium_block_hit_rate(i)),
               with_commas(m.pages_hit), first_request(m),
               tier ? with_commas(m.pages_stored) + " (" + format_bytes(m.bytes_stored) + ")" : "-",
               tier ? with_commas(m.pages_loaded) + " (" + format_bytes(m.bytes_loaded) + ")" : "-",
               tier ? with_commas(m.offload_dropped) : "-",
               tier ? with_commas(m.load_failures) : "-", fixed("%.2f", e.saving_s[i] * 1e3)});
  }
  t.add_row({"total", "1.0000", fixed("%.4f", r.block_hit_rate()), "", "", "", "", "", "",
             fixed("%.2f", e.saving_s_total() * 1e3)});
  t.print(out);
  out << "modelled TTFT per request: " << fixed("%.2f", e.without_cache_s * 1e3)
      << " ms without the cache, " << fixed("%.2f", e.with_cache_s * 1e3) << " ms with it ("
      << ttft_model_text(model) << "; sequential, no overlap)\n";
}

nlohmann::json media_json(const ReplayResult& r, const TtftModel& model) {
  const TtftEstimate e = estimate_ttft(r, model);
  nlohmann::json media = nlohmann::json::array();
  for (std::size_t i = 0; i < r.media.size(); ++i) {
    const ReplayMedium& m = r.media[i];
    media.push_back({{"name", m.name},
                     {"hit_share", r.hit_share(i)},
                     {"block_hit_rate", r.medium_block_hit_rate(i)},
                     {"pages_hit", m.pages_hit},
                     {"tokens_hit", m.tokens_hit},
                     {"first_hit_request", m.first_hit_request == ReplayMedium::kNoRequest
                                               ? nlohmann::json(nullptr)
                                               : nlohmann::json(m.first_hit_request)},
                     {"pages_at_start", m.pages_at_start},
                     {"pages_held", m.pages_held},
                     {"pages_stored", m.pages_stored},
                     {"bytes_stored", m.bytes_stored},
                     {"pages_loaded", m.pages_loaded},
                     {"bytes_loaded", m.bytes_loaded},
                     {"evictions", m.evictions},
                     {"offload_dropped", m.offload_dropped},
                     {"load_failures", m.load_failures},
                     {"ttft_saving_ms", e.saving_s[i] * 1e3}});
  }
  return {{"media", media},
          {"ttft_model",
           {{"flops_per_token", model.flops_per_token},
            {"flops_per_s", model.flops_per_s},
            {"kv_bytes_per_token", model.kv_bytes_per_token},
            {"host_bytes_per_s", model.host_bytes_per_s},
            {"disk_bytes_per_s", model.disk_bytes_per_s}}},
          {"ttft_ms",
           {{"without_cache", e.without_cache_s * 1e3},
            {"with_cache", e.with_cache_s * 1e3},
            {"saving", e.saving_s_total() * 1e3}}}};
}

}  // namespace kvcache::tools
