// kvcache/replay/trace_replay.h — replays a Mooncake-format request trace against a
// PagedKVCacheManager with prefix caching, measuring how much of the trace the cache serves. A
// layer above the manager: the target kvcache_replay (src/replay/), which the command line
// (`kvcache replay`) and the tests link; not in libkvcache.
//
// Trace format: TraceRequest (kvcache/replay/trace.h; the CLI parses JSONL
// into these with kvcache/engine/trace_file.h). Block id k expands to 512
// token ids determined by k; the last block holds the remainder of input_length.
//
// Modes: sequential (one request at a time: match, compute the rest,
// release) and timed (arrivals at their timestamps; each admitted request
// keeps its pages while it decodes output_length tokens at a fixed rate;
// requests that do not fit wait in FIFO order).
// Uses a tiny model shape (1 layer, 1 KV head, head_dim 1, f32: a page of
// 512 tokens is 4 KiB): only the bookkeeping matters. Not thread-safe (one
// replay per call).
//
// Tiers (ReplayTiers): a host tier and / or a disk tier below the device
// pool (kvcache/host_tier.h, disk_tier.h; fingerprint
// TierFingerprint::of(params, kReplayModelId)). With both, the host tier
// writes through to the disk (kvcache/write_through_tier.h) and the manager
// gets {host, disk}. Each request waits for its loads before it computes
// (wait_loads), and for every write-back after each call that may evict
// (wait_tiers): the replay measures where pages are, not how the I/O
// overlaps, and no write-back is dropped for want of staging (staging_pages
// holds a whole request's pages). ReplayResult::media splits the hits by
// where they came from; TtftModel prices them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvcache/prefix_cache.h"
#include "kvcache/replay/trace.h"

namespace kvcache {

// ReplayOptions limits: page_size at most kMaxTraceRequestTokens, max_batch
// at most kMaxReplayBatch, capacity_tokens / page_size at most
// kMaxReplayPages pages.
inline constexpr std::uint32_t kMaxReplayBatch = 65536;
inline constexpr std::uint64_t kMaxReplayPages = 0xFFFFFFFEu;

// The prompt's token ids. Throws InvalidArgument if input_length does not fit
// the blocks (more than 512 per id, or fewer than the ids need).
std::vector<std::uint32_t> request_tokens(const TraceRequest& request);

// The model id of the replay's tier fingerprint: a disk directory written by
// one replay is found by the next with the same page size.
inline constexpr const char* kReplayModelId = "kvcache-replay";

// Tiers below the device pool; none by default.
struct ReplayTiers {
  std::uint64_t host_capacity_tokens = 0;  // 0: no host tier; else at least one page
  std::string disk_dir;                    // empty: no disk tier
  // 0: unlimited (DiskTier::kUnlimited: as many pages as the disk holds);
  // else at least one page. Only with disk_dir.
  std::uint64_t disk_capacity_tokens = 0;
  // Which evicted pages go down to the first tier (PrefixCacheConfig's
  // TierConfig::admission): every page, or only pages reused at least once.
  OffloadAdmission admission = OffloadAdmission::every_page;
  bool any() const { return host_capacity_tokens > 0 || !disk_dir.empty(); }
};

struct ReplayOptions {
  std::uint32_t page_size = 512;
  std::uint64_t capacity_tokens = 0;  // 0: unlimited (room for the whole trace)
  EvictionPolicyKind policy = EvictionPolicyKind::lru;
  // Offline reference instead of the manager: Belady's optimum with prefix
  // semantics (evict the cached page whose next use in the trace is farthest),
  // simulated outside the manager; sequential mode only; `policy` is ignored
  // and manager_ns stays 0.
  bool offline_belady = false;
  double s3fifo_small_fraction = 0.1;
  double ghost_factor = 16.0;
  bool sequential = true;
  // Release each request with a ReuseHint derived from its output length, as
  // an engine could at the end of the request: output_length < short_output
  // tokens -> likely, else unlikely (only the `tiered` policy acts on it).
  // Off: every release is ReuseHint::unknown.
  bool reuse_hints = false;
  std::uint32_t short_output = 32;
  double decode_tokens_per_s = 20.0;  // timed mode: per request
  std::uint32_t max_batch = 1024;     // timed mode: concurrent requests
  ReplayTiers tiers;
  std::function<void(std::size_t done, std::size_t total)> progress;  // optional
};

// Where hits came from: the device pool ("device", always first), then each
// tier nearest first ("host", "disk"). pages_hit / tokens_hit are the hits
// it served (a tier's: pages loaded back, counted when the load finished);
// the other figures are a tier's at the end of the replay (TierStats and the
// manager's TierFigures; zero for the device).
struct ReplayMedium {
  static constexpr std::uint64_t kNoRequest = UINT64_MAX;
  std::string name;
  std::uint64_t pages_hit = 0;
  std::uint64_t tokens_hit = 0;
  std::uint64_t first_hit_request = kNoRequest;  // trace index of the first request it served
  std::uint64_t pages_at_start = 0;              // held when opened (a disk found again)
  std::uint64_t pages_held = 0;
  std::uint64_t pages_stored = 0;  // stored into this tier (by the manager or a write-through)
  std::uint64_t bytes_stored = 0;
  std::uint64_t pages_loaded = 0;  // loaded out of it
  std::uint64_t bytes_loaded = 0;
  std::uint64_t evictions = 0;        // pages the tier dropped for room
  std::uint64_t offload_dropped = 0;  // write-backs not made (the manager's count)
  std::uint64_t load_failures = 0;
};

struct ReplayResult {
  std::uint64_t requests = 0;
  std::uint64_t rejected = 0;  // did not fit even in an empty cache
  std::uint64_t blocks_total = 0;
  std::uint64_t blocks_hit = 0;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t tokens_hit = 0;
  std::uint64_t evictions = 0;
  std::uint32_t capacity_pages = 0;
  std::uint32_t peak_pages_used = 0;
  std::uint64_t manager_ns = 0;    // wall time inside manager calls
  std::uint64_t tier_wait_ns = 0;  // wall time waiting for tier loads and write-backs
  std::uint64_t decode_steps = 0;
  std::vector<ReplayMedium> media;  // "device", then the tiers nearest first
  // The total over every medium.
  double block_hit_rate() const { return ratio(blocks_hit, blocks_total); }
  // Medium i's share of the hit tokens, and block_hit_rate() times it (with
  // page_size 512, the trace's block, exactly its blocks / blocks_total).
  double hit_share(std::size_t i) const { return ratio(media.at(i).tokens_hit, tokens_hit); }
  double medium_block_hit_rate(std::size_t i) const { return block_hit_rate() * hit_share(i); }
  double token_hit_rate() const { return ratio(tokens_hit, prompt_tokens); }
  double ns_per_request() const {
    return requests == 0 ? 0 : double(manager_ns) / double(requests);
  }

 private:
  static double ratio(std::uint64_t a, std::uint64_t b) {
    return b == 0 ? 0 : double(a) / double(b);
  }
};

// Throws InvalidArgument, before any work, on bad options (page_size 0 or
// past its limit, a capacity of more than kMaxReplayPages pages, max_batch
// past kMaxReplayBatch, a decode rate that is not a finite positive number in
// timed mode, offline_belady without sequential or with tiers, a tier
// capacity below one page or past kMaxReplayPages pages, a disk capacity
// without a disk_dir, the prefix cache's own limits, a disk directory that
// cannot be opened or is locked by another DiskTier) and on a bad request, named by its index: a
// timestamp that is not a finite number >= 0, input_length or output_length past
// kMaxTraceRequestTokens, or an input_length that does not fit its hash ids
// (request_tokens).
ReplayResult replay_trace(std::span<const TraceRequest> trace, const ReplayOptions& options);

// A stated cost model of the time to first token (TTFT) the hits save,
// sequential and without overlap: a computed prompt token costs
// flops_per_token / flops_per_s; a token loaded from a tier costs
// kv_bytes_per_token / that tier's bandwidth ("host": host_bytes_per_s,
// any other tier: disk_bytes_per_s); a device hit costs nothing. The
// defaults: Llama-3-8B (2 x 8.03e9 FLOP a token, the attention term left
// out; bf16 KV of 32 layers x 8 KV heads x 128 x K and V = 128 KiB a token,
// 64 MiB a 512-token page) prefilled at 400 TFLOP/s (an H100's 989 dense
// bf16 TFLOP/s at 40 % use: a 512-token page in 20.6 ms), a host tier over
// PCIe at 25 GB/s (2.7 ms a page), a disk tier (one NVMe SSD) at 2.2 GB/s
// (30.5 ms a page: slower than recomputing below 3.3 GB/s).
struct TtftModel {
  double flops_per_token = 2 * 8.03e9;
  double flops_per_s = 400e12;
  double kv_bytes_per_token = 131072;
  double host_bytes_per_s = 25e9;
  double disk_bytes_per_s = 2.2e9;
};

// Mean modelled TTFT per request, in seconds.
struct TtftEstimate {
  double without_cache_s = 0;    // every prompt token computed
  double with_cache_s = 0;       // hits loaded (tiers) or free (device)
  std::vector<double> saving_s;  // per ReplayMedium: what its hits save (< 0: cost)
  double saving_s_total() const { return without_cache_s - with_cache_s; }
};

// Throws InvalidArgument naming a model value that is not a finite number > 0.
TtftEstimate estimate_ttft(const ReplayResult& result, const TtftModel& model = {});

}  // namespace kvcache
