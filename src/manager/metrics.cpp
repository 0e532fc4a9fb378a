// Prometheus text exposition of ManagerStats (kvcache/metrics.h); the table
// below is the metric set docs/metrics.md lists.
#include "kvcache/metrics.h"

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

constexpr std::array<MetricInfo, kMetrics.size()> infos() {
  std::array<MetricInfo, kMetrics.size()> out{};
  for (std::size_t i = 0; i < kMetrics.size(); ++i) out[i] = kMetrics[i].info;
  return out;
}
constexpr std::array kInfos = infos();

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
  return out;
}

std::string metrics_text(const KVCacheManager& manager, std::string_view prefix) {
  check_prefix(prefix);  // before taking the manager's lock
  return metrics_text(manager.stats(), manager.params().cache_strategy, prefix);
}

}  // namespace kvcache
