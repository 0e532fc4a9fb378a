// kvcache/metrics.h — a manager's figures in the Prometheus text exposition
// format (version 0.0.4), for a /metrics endpoint or a periodic dump.
//
// metrics_text(manager) reads manager.stats() (one reading under the
// manager's lock, kvcache/manager.h) and writes every metric of
// metric_catalog(), in that order: a `# HELP` and a `# TYPE` line, then one
// sample, named <prefix>_<name>, labelled strategy="paged"|"continuous" and,
// for figures of the block pool, tier="device"; then, for a paged manager
// with tiers below its pool, the tier_* metrics of tier_metric_catalog(),
// one sample per tier labelled with the tier's name (tier="host"). Counters end in `_total`; gauges
// never do. Every metric is written for both strategies (0 where a strategy
// has no such thing), so a dashboard sees one set of names. The names are the
// contract, listed with their meaning in docs/metrics.md; the `kvcache serve`
// endpoint and the tiers export the same ones.
//
// Counters run from the manager's construction, except the prefix-cache ones
// (prefix_*, blocks_published, evictions, cow_copies), which
// PagedKVCacheManager::reset_metrics() sets back to 0: Prometheus reads that
// as a counter reset, which rate() and increase() handle.
//
// To export several managers from one process, give each its own prefix (two
// texts with the same prefix would repeat HELP / TYPE lines, which the format
// forbids).
//
// Thread-safety: what stats() offers (any thread, any time). Throws
// InvalidArgument when prefix is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "kvcache/manager.h"

namespace kvcache {

enum class MetricType : std::uint8_t { gauge, counter };

// One metric: its name after the prefix ("blocks_free"), type, HELP text,
// and whether its sample carries tier="device".
struct MetricInfo {
  std::string_view name;
  MetricType type;
  std::string_view help;
  bool per_tier;
};

// Every metric metrics_text writes, in its order.
std::span<const MetricInfo> metric_catalog() noexcept;
// The per-tier metrics metrics_text writes after those when the manager has
// tiers below its pool (ManagerStats::tiers; none without): one sample per
// tier, labelled tier="<Tier::name()>" (quotes and backslashes escaped),
// in this order. tier_capacity_bytes is 0 for an unlimited tier.
std::span<const MetricInfo> tier_metric_catalog() noexcept;

std::string metrics_text(const KVCacheManager& manager, std::string_view prefix = "kvcache");

// The same text from a reading taken earlier (strategy labels the samples).
std::string metrics_text(const ManagerStats& stats, CacheStrategy strategy,
                         std::string_view prefix = "kvcache");

}  // namespace kvcache
