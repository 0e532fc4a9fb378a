// tools/plan.h — capacity planning: what a memory budget holds.
//
// `compute_plan` turns a model shape, a memory budget and the cache settings
// into slot / page counts for both strategies, using the library's own memory
// math (KVCacheParams::bytes_per_token, the managers' estimated_memory_size and
// PagedKVCacheManager::pages_for_memory), so the plan is exactly what a
// manager of that size would allocate. Continuous batching reserves
// max_seq_len tokens per sequence; the paged pool admits by actual length.
// Pure functions; they throw kvcache::InvalidArgument naming the bad value.
// Model presets: presets.h; sizes (--memory): kvcache/engine/units.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/params.h"
#include "presets.h"  // the model presets plan takes

namespace kvcache::tools {

struct PlanInput {
  std::string model = "custom";
  KVCacheParams params;  // strategy and page_size are set per strategy
  std::size_t memory_per_device = 0;
  std::uint32_t page_size = 16;
  std::uint32_t max_seq_len = 8192;
};

struct StrategyPlan {
  std::string strategy;            // "continuous" | "paged"
  std::uint64_t blocks = 0;        // slots or pages that fit
  std::uint64_t block_bytes = 0;   // bytes of one slot / page over all devices
  std::uint64_t page_size = 0;  // max_seq_len or page_size
  std::uint64_t tokens = 0;        // blocks * page_size
  std::uint64_t used_bytes = 0;    // the manager's estimated_memory_size
};

struct ConcurrencyRow {
  std::uint32_t length = 0;      // tokens per sequence
  std::uint64_t continuous = 0;  // sequences that fit (each reserves max_seq_len)
  std::uint64_t paged = 0;       // sequences that fit (ceil(length / page_size) pages each)
};

struct Plan {
  PlanInput input;
  std::uint64_t bytes_per_token = 0;
  std::uint64_t memory_total = 0;  // memory_per_device * n_devices
  StrategyPlan continuous;
  StrategyPlan paged;
  std::vector<ConcurrencyRow> concurrency;
};

// Validates the input (via KVCacheParams::validate) and computes the plan.
Plan compute_plan(const PlanInput& input);
void print_plan(const Plan& plan, std::ostream& os);
nlohmann::json plan_to_json(const Plan& plan);

}  // namespace kvcache::tools
