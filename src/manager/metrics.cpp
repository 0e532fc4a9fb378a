// Prometheus text exposition of ManagerStats (kvcache/metrics.h); the table
// below is the metric set docs/metrics.md lists.
#include "kvcache/metrics.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "kvcache/error.h"

namespace kvcache {

namespace {

using Value = std::uint64_t (*)(const ManagerStats&);

struct Metric {
  MetricInfo info;
  Value value;
};

constexpr MetricType gauge = MetricType::gauge;
constexpr MetricType counter = MetricType::counter;

// clang-format off
constexpr std::array kMetrics{
  Metric{{"blocks_capacity", gauge, "Blocks in the pool: pages (paged) or slots (continuous).", true},
         [](const ManagerStats& s) -> std::uint64_t { return s.blocks_total; }},
  Metric{{"blocks_free", gauge, "Blocks on the free list.", true},
         [](const ManagerStats& s) -> std::uint64_t { return s.blocks_free; }},
  Metric{{"blocks_used", gauge, "Blocks held by at least one sequence.", true},
         [](const ManagerStats& s) -> std::uint64_t { return s.blocks_used; }},
  Metric{{"blocks_cached", gauge, "Prefix-cached blocks held by no sequence (evictable).", true},
         [](const ManagerStats& s) -> std::uint64_t { return s.blocks_cached; }},
  Metric{{"blocks_pinned", gauge, "Prefix-cached blocks pinned by pin_prefix (used or cached).", true},
         [](const ManagerStats& s) -> std::uint64_t { return s.blocks_pinned; }},
  Metric{{"page_size", gauge, "Tokens one block holds: page_size (paged) or max_seq_len (continuous).", false},
         [](const ManagerStats& s) -> std::uint64_t { return s.page_size; }},
  Metric{{"pool_bytes", gauge, "Bytes of the block pool over all devices.", true},
         [](const ManagerStats& s) -> std::uint64_t { return s.pool_bytes; }},
  Metric{{"sequences_active", gauge, "Sequences claimed and not released.", false},
         [](const ManagerStats& s) -> std::uint64_t { return s.active_sequences; }},
  Metric{{"sequences_claimed_total", counter, "Sequence ids handed out by claim.", false},
         [](const ManagerStats& s) { return s.sequences_claimed; }},
  Metric{{"sequences_forked_total", counter, "Sequences made by fork (sharing their parent's pages).", false},
         [](const ManagerStats& s) { return s.sequences_forked; }},
  Metric{{"sequences_released_total", counter, "Sequences released.", false},
         [](const ManagerStats& s) { return s.sequences_released; }},
  Metric{{"fetches_total", counter, "Successful fetch calls.", false},
         [](const ManagerStats& s) { return s.fetches; }},
  Metric{{"steps_total", counter, "Successful step calls.", false},
         [](const ManagerStats& s) { return s.steps; }},
  Metric{{"committed_tokens_total", counter, "Tokens committed by step.", false},
         [](const ManagerStats& s) { return s.committed_tokens; }},
  Metric{{"prefix_lookups_total", counter, "Prefix-cache lookups (match_prefix calls).", false},
         [](const ManagerStats& s) { return s.prefix_lookups; }},
  Metric{{"prefix_prompt_tokens_total", counter, "Prompt tokens looked up in the prefix cache.", false},
         [](const ManagerStats& s) { return s.prefix_prompt_tokens; }},
  Metric{{"prefix_hit_tokens_total", counter, "Prompt tokens found in the prefix cache and reused.", false},
         [](const ManagerStats& s) { return s.prefix_hit_tokens; }},
  Metric{{"prefix_published_blocks_total", counter, "Full pages entered into the prefix cache's index.", false},
         [](const ManagerStats& s) { return s.blocks_published; }},
  Metric{{"evictions_total", counter, "Cached blocks evicted to make room.", true},
         [](const ManagerStats& s) { return s.evictions; }},
  Metric{{"cow_copies_total", counter, "Copy-on-write copies of shared pages.", false},
         [](const ManagerStats& s) { return s.cow_copies; }},
};
// clang-format on

// Per tier below the device pool (ManagerStats::tiers): one sample per tier,
// labelled tier="<name>" (and device="<d>" when the manager has several devices).
struct TierMetric {
  MetricInfo info;
  std::string (*value)(const TierFigures&);
};

template <std::uint64_t TierFigures::*Field>
std::string field(const TierFigures& f) {
  return std::to_string(f.*Field);
}

std::string capacity(const TierFigures& f) {
  return f.capacity_bytes == UINT64_MAX ? "0" : std::to_string(f.capacity_bytes);
}

// clang-format off
const std::array kTierMetrics{
  TierMetric{{"tier_enabled", gauge, "1 while the tier serves, 0 once it disabled itself.", true},
             [](const TierFigures& f) { return std::string(f.enabled ? "1" : "0"); }},
  TierMetric{{"tier_pages", gauge, "Pages the tier holds.", true}, field<&TierFigures::pages_held>},
  TierMetric{{"tier_bytes", gauge, "Page bytes the tier holds (headers excluded).", true}, field<&TierFigures::bytes_held>},
  TierMetric{{"tier_capacity_bytes", gauge, "The tier's capacity in page bytes (0: unlimited).", true}, capacity},
  TierMetric{{"tier_lookups_total", counter, "Page keys asked of the tier.", true}, field<&TierFigures::lookups>},
  TierMetric{{"tier_hits_total", counter, "Page keys the tier held when asked.", true}, field<&TierFigures::hits>},
  TierMetric{{"tier_stored_pages_total", counter, "Pages the tier stored.", true}, field<&TierFigures::pages_stored>},
  TierMetric{{"tier_stored_bytes_total", counter, "Page bytes the tier stored.", true}, field<&TierFigures::bytes_stored>},
  TierMetric{{"tier_loaded_pages_total", counter, "Pages the tier loaded out.", true}, field<&TierFigures::pages_loaded>},
  TierMetric{{"tier_loaded_bytes_total", counter, "Page bytes the tier loaded out.", true}, field<&TierFigures::bytes_loaded>},
  TierMetric{{"tier_load_nanoseconds_total", counter, "Nanoseconds the tier's loads took, summed over pages (mean: / tier_loaded_pages_total).", true}, field<&TierFigures::load_nanoseconds>},
  TierMetric{{"tier_evictions_total", counter, "Pages the tier dropped for room.", true}, field<&TierFigures::evictions>},
  TierMetric{{"tier_corrupt_total", counter, "Pages the tier refused on a checksum mismatch.", true}, field<&TierFigures::corrupt>},
  TierMetric{{"tier_io_errors_total", counter, "I/O errors of the tier.", true}, field<&TierFigures::io_errors>},
  TierMetric{{"tier_offloaded_pages_total", counter, "Evicted device pages the manager wrote to the tier.", true}, field<&TierFigures::pages_offloaded>},
  TierMetric{{"tier_offload_dropped_total", counter, "Evicted device pages not written (staging full, refused, failed).", true}, field<&TierFigures::offload_dropped>},
  TierMetric{{"tier_onboarded_pages_total", counter, "Pages loaded back from the tier into the device pool.", true}, field<&TierFigures::pages_onboarded>},
  TierMetric{{"tier_load_failures_total", counter, "Loads from the tier that came back missing, mismatch, corrupt or failed.", true}, field<&TierFigures::load_failures>},
};
// clang-format on

std::string label_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out.append("\\n");
      continue;
    }
    out.push_back(c);
  }
  return out;
}

void append_tiers(std::string& out, const ManagerStats& stats, const std::string& labels,
                  std::string_view prefix) {
  if (stats.tiers.empty()) return;
  // Several devices: each level has a tier per device shard, told apart by a device label.
  const bool shards = std::any_of(stats.tiers.begin(), stats.tiers.end(),
                                  [](const TierFigures& f) { return f.device != 0; });
  for (const TierMetric& m : kTierMetrics) {
    std::string name(prefix);
    name.append("_").append(m.info.name);
    out.append("# HELP ").append(name).append(" ").append(m.info.help).append("\n");
    out.append("# TYPE ").append(name).append(m.info.type == gauge ? " gauge\n" : " counter\n");
    for (const TierFigures& f : stats.tiers) {
      out.append(name).append(labels).append(",tier=\"").append(label_value(f.name)).append("\"");
      if (shards) out.append(",device=\"").append(std::to_string(f.device)).append("\"");
      out.append("} ");
      out.append(m.value(f)).append("\n");
    }
  }
}

constexpr std::array<MetricInfo, kMetrics.size()> infos() {
  std::array<MetricInfo, kMetrics.size()> out{};
  for (std::size_t i = 0; i < kMetrics.size(); ++i) out[i] = kMetrics[i].info;
  return out;
}
constexpr std::array kInfos = infos();

std::array<MetricInfo, kTierMetrics.size()> tier_infos() {
  std::array<MetricInfo, kTierMetrics.size()> out{};
  for (std::size_t i = 0; i < kTierMetrics.size(); ++i) out[i] = kTierMetrics[i].info;
  return out;
}
const std::array kTierInfos = tier_infos();

bool name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }

void check_prefix(std::string_view prefix) {
  bool ok = !prefix.empty() && name_start(prefix[0]);
  for (char c : prefix) ok = ok && name_char(c);
  if (!ok) {
    throw InvalidArgument("metrics prefix '" + std::string(prefix) +
                          "' is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)");
  }
}

}  // namespace

std::span<const MetricInfo> metric_catalog() noexcept { return kInfos; }

std::span<const MetricInfo> tier_metric_catalog() noexcept { return kTierInfos; }

std::string metrics_text(const ManagerStats& stats, CacheStrategy strategy,
                         std::string_view prefix) {
  check_prefix(prefix);
  const std::string labels = "{strategy=\"" + std::string(strategy_name(strategy)) + "\"";
  std::string out;
  out.reserve(kMetrics.size() * 160);
  for (const Metric& m : kMetrics) {
    std::string name(prefix);
    name.append("_").append(m.info.name);
    out.append("# HELP ").append(name).append(" ").append(m.info.help).append("\n");
    out.append("# TYPE ").append(name).append(m.info.type == gauge ? " gauge\n" : " counter\n");
    out.append(name).append(labels).append(m.info.per_tier ? ",tier=\"device\"} " : "} ");
    out.append(std::to_string(m.value(stats))).append("\n");
  }
  append_tiers(out, stats, labels, prefix);
  return out;
}

std::string metrics_text(const KVCacheManager& manager, std::string_view prefix) {
  check_prefix(prefix);  // before taking the manager's lock
  return metrics_text(manager.stats(), manager.params().cache_strategy, prefix);
}

}  // namespace kvcache
