// kvcache/engine/workload.h — request streams for the demo and benchmarks.
//
// `chat_workload`: N chat requests that share one system prompt, followed by
// a user turn and an answer whose lengths follow long-tailed (log-normal)
// distributions, arriving as a Poisson process. Deterministic from a seed.
// `load_mooncake_trace`: a Mooncake-format JSONL trace (timestamp in ms,
// input_length, output_length, hash_ids of 512-token prefix blocks), with
// lengths multiplied by `scale` to fit a small model; equal hash ids become
// equal token blocks, so shared prefixes stay shared. The trace is read with
// every number checked (kvcache/engine/trace_file.h: malformed lines throw
// InvalidArgument naming the file, the line and the field).
// Both refuse, with InvalidArgument naming the numbers, a workload whose
// prompts would hold more than kMaxWorkloadTokens tokens (they are built
// eagerly), and bad options: vocab_size 0, a rate or scale that is not a
// finite number in range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/engine/model.h"

namespace kvcache::engine {

// The most prompt tokens a workload may hold (1 GiB of token ids).
inline constexpr std::uint64_t kMaxWorkloadTokens = std::uint64_t{1} << 28;
// The largest TraceOptions::scale.
inline constexpr double kMaxTraceScale = 16.0;

struct WorkloadRequest {
  double arrival = 0;  // seconds from the start
  std::vector<TokenId> prompt;
  std::uint32_t output_tokens = 1;
};

struct ChatWorkloadOptions {
  std::uint32_t requests = 64;
  std::uint32_t system_prompt_tokens = 512;
  std::uint32_t user_median = 48, user_max = 512;      // log-normal, sigma 0.8
  std::uint32_t output_median = 48, output_max = 256;  // log-normal, sigma 0.7
  double rate = 32.0;                                  // requests per second (Poisson)
  std::uint32_t vocab_size = 256;
  std::uint64_t seed = 1;
};

std::vector<WorkloadRequest> chat_workload(const ChatWorkloadOptions& options);

struct TraceOptions {
  double scale = 1.0 / 16;             // multiplies input/output lengths and the 512-token
                                       // block; in (0, kMaxTraceScale]
  std::uint32_t max_requests = 0;      // 0 = all
  std::uint32_t max_total_tokens = 0;  // cap prompt + output (0 = none); prompts truncated
  std::uint32_t vocab_size = 256;
};

std::vector<WorkloadRequest> load_mooncake_trace(const std::string& path,
                                                 const TraceOptions& options);

}  // namespace kvcache::engine
