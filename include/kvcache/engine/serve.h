// kvcache/engine/serve.h — run a workload through the engine and measure it.
//
// `serve` builds a manager for one configuration (continuous slots, paged,
// paged + prefix caching) under a KV memory budget in bytes, replays the
// workload's arrivals on a clock that skips idle gaps (real compute time,
// no sleeping), and reports throughput, latency, concurrency, memory
// utilisation, prefix hits and preemptions, plus end-of-run audits
// (sequences left claimed, blocks neither free nor cached).
// The continuous configuration gets floor(budget / (max_seq_len * bytes per
// token)) slots; the paged ones floor(budget / (page_size * bytes per token))
// pages. Throws InvalidArgument when the budget holds no slot / page, or
// when a request cannot fit.
//
// `paged_tiers` is paged + prefix caching with tiers below the same device
// pool (ServeTiers: a host-memory tier, a disk tier, or both; docs/tiers.md):
// evicted pages are written down and prefix hits in a tier loaded back while
// other requests compute (scheduler.h). The manager writes to the first tier
// only (host when both are given); a disk tier behind a host tier serves what
// an earlier process left in its directory. Throws InvalidArgument for
// paged_tiers without a tier, and what HostTier / DiskTier throw (a disk
// directory another process holds, ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kvcache/engine/model.h"
#include "kvcache/engine/workload.h"
#include "kvcache/manager.h"

namespace kvcache::engine {

enum class ServeMode : std::uint8_t { continuous, paged, paged_prefix, paged_tiers };
std::string_view serve_mode_name(ServeMode m);

// The tiers of ServeMode::paged_tiers.
struct ServeTiers {
  std::uint64_t host_bytes = 0;  // host tier capacity (page bytes); 0: none
  std::string disk_dir;          // disk tier directory; empty: none
  std::uint64_t disk_bytes = std::numeric_limits<std::uint64_t>::max();  // max: unlimited
  std::string model_id;  // the weights' identity, in the tiers' fingerprint
  bool any() const { return host_bytes > 0 || !disk_dir.empty(); }
};

struct ServeOptions {
  ServeMode mode = ServeMode::paged;
  std::size_t memory_bytes = 32u << 20;
  std::uint32_t page_size = 16;
  std::uint32_t max_seq_len = 2048;
  std::uint32_t max_num_tokens = 256;  // step token budget
  std::uint32_t max_num_seqs = 128;
  double watermark = 0.01;
  // Samples per request (Request::n): paged configurations fork the prompt,
  // continuous slots compute it once per sample.
  std::uint32_t samples = 1;
  ServeTiers tiers;  // paged_tiers only
  // Called after every step with (finished outputs, total outputs: requests x samples).
  std::function<void(std::size_t, std::size_t)> progress;
};

struct ServeReport {
  std::string config;
  bool pending = false;  // configuration not available in this build (prefix caching)
  std::string note;
  std::uint32_t requests = 0, samples = 1;  // outputs = requests x samples
  std::uint64_t prompt_tokens = 0, requested_output_tokens = 0, generated_tokens = 0;
  std::uint32_t blocks = 0, page_size = 0;  // slots x max_seq_len, or pages x page_size
  std::size_t memory_bytes = 0;             // bytes the blocks occupy (<= budget)
  double elapsed_s = 0, requests_per_s = 0, output_tokens_per_s = 0;
  double ttft_mean_s = 0, ttft_p50_s = 0, ttft_p99_s = 0, tpot_mean_s = 0;
  std::uint32_t peak_running = 0;
  double kv_utilisation = 0;         // mean over steps: tokens stored / tokens reserved
  double prefix_hit_rate = 0;        // prompt tokens served from cache / admitted prompt tokens
  std::uint64_t prefill_tokens = 0;  // prompt (and recompute) tokens the model computed
  std::uint64_t preemptions = 0, steps = 0;
  double model_s = 0, sampling_s = 0, overhead_s = 0;  // overhead: scheduler + manager
  // paged_tiers: the manager's per-tier figures at the end of the run, the
  // prefix matches that went on into a tier (loads started), prompt tokens failed loads
  // took back, the engine's time blocked on loads with nothing else to run,
  // and the mean over requests that loaded of their load time (in TTFT).
  std::vector<TierFigures> tiers;
  std::uint64_t tier_matches = 0, load_failed_tokens = 0, load_waits = 0;
  double load_wait_s = 0, load_mean_s = 0;
  // End-of-run audit: sequences still claimed; blocks neither free nor held
  // as evictable prefix-cache entries (a leak); evictable cached pages.
  std::uint32_t active_sequences_left = 0, blocks_not_free = 0, blocks_cached = 0;
};

ServeReport serve(const Model& model, const std::vector<WorkloadRequest>& workload,
                  const ServeOptions& options);

}  // namespace kvcache::engine
