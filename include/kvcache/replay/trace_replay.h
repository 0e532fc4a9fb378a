// kvcache/replay/trace_replay.h — replays a Mooncake-format request trace against a PagedKVCacheManager
// with prefix caching, measuring how much of the trace the cache serves.
// A layer above the manager: the target kvcache_replay (src/replay/), which
// the command line (`kvcache replay`) and the tests link; not in libkvcache.
//
// Trace format: TraceRequest (kvcache/replay/trace.h; the CLI parses JSONL
// into these with kvcache/engine/trace_file.h). Block id k expands to 512
// token ids determined by k; the last block holds the remainder of input_length.
//
// Modes: sequential (one request at a time: match, compute the rest,
// release) and timed (arrivals at their timestamps; each admitted request
// keeps its pages while it decodes output_length tokens at a fixed rate;
// requests that do not fit wait in FIFO order).
// Uses a tiny model shape (1 layer, 1 KV head, head_dim 1, f32): only the
// bookkeeping matters. Not thread-safe (one replay per call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
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
  std::function<void(std::size_t done, std::size_t total)> progress;  // optional
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
  std::uint64_t manager_ns = 0;  // wall time inside manager calls
  std::uint64_t decode_steps = 0;
  double block_hit_rate() const { return ratio(blocks_hit, blocks_total); }
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
// timed mode, offline_belady without sequential, the prefix cache's own
// limits) and on a bad request, named by its index: a timestamp that is not a
// finite number >= 0, input_length or output_length past
// kMaxTraceRequestTokens, or an input_length that does not fit its hash ids
// (request_tokens).
ReplayResult replay_trace(std::span<const TraceRequest> trace, const ReplayOptions& options);

}  // namespace kvcache
