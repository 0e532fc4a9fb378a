// tools/replay.h — `kvcache replay`'s sweep: lists of capacities and
// policies, every pair replayed over one parsed trace, and the results as
// CSV, a table, JSON and a hit-rate-against-capacity chart (plot.h).
//
// parse_capacity_list / parse_policy_list split on ',' and check every
// field (parse_token_count: "250K,1M,3M,10M", 0 or "unlimited" = room for
// the whole trace; policies lru | s3fifo | tiered | interval | belady),
// throwing kvcache::InvalidArgument naming the field: an empty one, a bad
// value, or more than kMaxReplayRuns pairs. run_replays runs every
// (policy, capacity) pair, policies outer, in the order given.
//
// Tiers (--host-capacity, --disk-dir, --disk-capacity): base.tiers for every
// run; with a disk directory one run only (a second would start from the
// first's disk). replay_csv and the JSON add the hits per medium and the
// modelled TTFT (TtftModel, kvcache/replay/trace_replay.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/replay/trace_replay.h"
#include "plot.h"

namespace kvcache::tools {

// Pairs one replay command runs at most.
inline constexpr std::size_t kMaxReplayRuns = 256;

std::vector<std::uint64_t> parse_capacity_list(std::string_view text);
std::vector<std::string> parse_policy_list(std::string_view text);

struct ReplayRun {
  std::string policy;
  std::uint64_t capacity_tokens = 0;  // 0: unlimited
  ReplayResult result;
};

// The progress callback of one run (its index among all, the run with its
// policy and capacity set), or an empty function.
using ReplayProgress = std::function<std::function<void(std::size_t, std::size_t)>(
    std::size_t index, std::size_t runs, const ReplayRun& run)>;

// `base` for every pair, with its policy and capacity set. Throws
// InvalidArgument before any run: belady without base.sequential or with
// tiers, several pairs with a disk directory.
std::vector<ReplayRun> run_replays(std::span<const TraceRequest> trace, const ReplayOptions& base,
                                   const std::vector<std::string>& policies,
                                   const std::vector<std::uint64_t>& capacities,
                                   const ReplayProgress& progress = {});

// One header line, one line a run:
// policy,capacity_tokens,capacity_pages,page_size,requests,rejected,
// block_hit_rate,token_hit_rate,blocks_total,blocks_hit,evictions,
// peak_pages_used,manager_ns_per_request (capacity_tokens 0: unlimited);
// with tiers (the first run has media past "device") then, for each medium
// M of the first run: M_hit_share,M_block_hit_rate,M_pages_hit,
// M_pages_stored,M_bytes_stored,M_pages_loaded,M_bytes_loaded,
// M_ttft_saving_ms; and ttft_ms_without_cache,ttft_ms_with_cache (`model`).
std::string replay_csv(const std::vector<ReplayRun>& runs, std::uint32_t page_size,
                       const TtftModel& model = {});

// Block hit rate against capacity, one series per policy.
LineChart replay_chart(const std::vector<ReplayRun>& runs, const std::string& trace_name);

}  // namespace kvcache::tools
