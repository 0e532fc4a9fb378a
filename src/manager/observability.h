// manager/observability.h — what both managers count for stats() and what
// they log (kvcache/log.h), kept out of their lifecycle code.
//
// LifecycleCounters lives in a manager's Impl and is updated under the
// manager's lock, after a call's checks passed (a refused call counts
// nothing): an increment per call, a sum over the batch per step.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "kvcache/log.h"
#include "kvcache/manager.h"
#include "kvcache/params.h"

namespace kvcache::manager {

struct LifecycleCounters {
  std::uint64_t claimed = 0;
  std::uint64_t forked = 0;
  std::uint64_t released = 0;
  std::uint64_t fetches = 0;
  std::uint64_t steps = 0;
  std::uint64_t committed_tokens = 0;

  void count_step(std::span<const std::uint32_t> valid_lengths) noexcept {
    ++steps;
    for (std::uint32_t v : valid_lengths) committed_tokens += v;
  }

  void fill(ManagerStats& s) const noexcept {
    s.sequences_claimed = claimed;
    s.sequences_forked = forked;
    s.sequences_released = released;
    s.fetches = fetches;
    s.steps = steps;
    s.committed_tokens = committed_tokens;
  }
};

// "2 layers, 8 KV heads x 128, f16, nhd, interleaved, 1 device"
inline std::string describe_geometry(const KVCacheParams& p) {
  return std::to_string(p.num_layers) + " layers, " + std::to_string(p.n_kv_heads) +
         " KV heads x " + std::to_string(p.head_dim) + ", " + std::string(dtype_name(p.dtype)) +
         ", " + std::string(layout_name(p.page_layout)) + ", " +
         std::string(arrangement_name(p.pool_arrangement)) + ", " + std::to_string(p.n_devices) +
         (p.n_devices == 1 ? " device" : " devices");
}

// log_with for calls that have already committed: a failure to format the
// message (no memory) loses the line and throws nothing.
template <class MakeMessage>
void log_after_commit(LogLevel level, MakeMessage&& make_message) noexcept {
  try {
    log_with(level, std::forward<MakeMessage>(make_message));
  } catch (...) {
  }
}

// The info line for a new manager: "<what>: <blocks> <unit>s of <tokens>
// tokens (<geometry>): <bytes> bytes".
inline std::string construction_line(std::string_view what, std::uint32_t blocks,
                                     std::string_view unit, std::uint32_t page_size,
                                     const KVCacheParams& p, std::uint64_t bytes) {
  return std::string(what) + ": " + std::to_string(blocks) + " " + std::string(unit) + "s of " +
         std::to_string(page_size) + " tokens (" + describe_geometry(p) +
         "): " + std::to_string(bytes) + " bytes";
}

}  // namespace kvcache::manager
