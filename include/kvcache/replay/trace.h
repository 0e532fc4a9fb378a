// kvcache/replay/trace.h — one request of a Mooncake-format trace, and the
// limits every reader and replay checks it against. Plain data, header only:
// the engine's trace reader (kvcache/engine/trace_file.h) fills it,
// replay_trace (kvcache/replay/trace_replay.h, target kvcache_replay) runs it.
//
// hash_ids are 512-token blocks, equal ids = equal content (and, as Mooncake
// generates them, equal prefixes); the last block holds the remainder of
// input_length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcache {

inline constexpr std::uint32_t kTraceBlockTokens = 512;

// Limits of what one request may make a replay allocate and run (its prompt's
// token ids and pages, and in timed mode its decode steps): input_length and
// output_length each at most 2^20 tokens, so at most 2048 hash ids.
inline constexpr std::uint32_t kMaxTraceRequestTokens = 1u << 20;
inline constexpr std::size_t kMaxTraceHashIds = kMaxTraceRequestTokens / kTraceBlockTokens;

struct TraceRequest {
  double timestamp_ms = 0;
  std::uint32_t input_length = 0;
  std::uint32_t output_length = 0;
  std::vector<std::uint64_t> hash_ids;
};

}  // namespace kvcache
