// kvcache/replay/conversation_trace.h — synthetic multi-turn conversation
// traces in the Mooncake format (TraceRequest, kvcache/replay/trace.h), for
// measuring prefix-cache eviction on the shape chat serving has: each turn's
// prompt is the previous prompt + its reply + a new message.
//
// Model: new arrivals come as a Poisson process (arrival_rate_per_s). An
// arrival is a one-shot request (one_shot_fraction: a system prompt and a
// message of about one_shot_tokens, no follow-up: a document to summarise) or a conversation of a
// geometric number of turns (mean_turns). Every arrival picks one of `system_prompts` system
// prompts, the k-th (from 0) with weight 1/(k+1); their lengths are drawn once, log-normal around
// system_prompt_tokens. Messages and replies are log-normal around message_tokens / reply_tokens. A
// turn follows its predecessor after the reply's decode time (reply / decode_tokens_per_s) plus a
// think time: exponential with mean think_time_s, or with probability long_break_fraction a long
// break (exponential, mean long_break_s). A conversation ends after its turns or when the next
// prompt would pass max_context_tokens. Conversations interleave; requests come out in time order
// (ties in the order they were scheduled).
//
// Blocks: 512-token blocks of each conversation's token stream get ids; the
// full blocks of a system prompt are shared by everyone using it, every other
// block belongs to one conversation (a prompt's last, partial block keeps the
// id of the full block it grows into, as its tokens are that block's first
// ones). Deterministic: the same options (seed included) give the same trace
// (std::mt19937_64 and the C library's log / cos / sqrt).
//
// Plain functions, no shared state; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kvcache/replay/trace.h"

namespace kvcache {

struct ConversationTraceOptions {
  std::uint64_t seed = 1;
  std::uint32_t requests = 4000;     // requests in the trace, [1, 10^7]
  double arrival_rate_per_s = 3.0;   // new conversations + one-shots per second
  double one_shot_fraction = 0.3;    // [0, 1]
  double mean_turns = 5.0;           // a conversation's turns, geometric, [1, 1000]
  std::uint32_t system_prompts = 8;  // distinct system prompts, [1, 10^6]
  std::uint32_t system_prompt_tokens = 1500;
  std::uint32_t one_shot_tokens = 3000;  // a one-shot request's message (a document), mean
  std::uint32_t message_tokens = 250;    // a user message, mean
  std::uint32_t reply_tokens = 350;      // a reply (output_length), mean
  double think_time_s = 60.0;            // mean think time between turns
  double long_break_fraction = 0.1;      // [0, 1]
  double long_break_s = 600.0;           // mean of a long break
  double decode_tokens_per_s = 50.0;     // reply generation speed
  std::uint32_t max_context_tokens = 32768;
};

// Preset shapes: "chat" (the defaults above: short messages, a minute of
// thought, a tenth of turns after a long break) and "agent" (long tool
// outputs as messages, many turns seconds apart, long shared system prompts,
// 128K context). Throws InvalidArgument naming the known shapes otherwise.
ConversationTraceOptions conversation_shape(std::string_view name);

// The trace. Throws InvalidArgument naming the option, its value and its
// range for an option out of range (token counts in [1, kMaxTraceRequestTokens],
// times and rates finite and > 0, except long_break_s, think_time_s >= 0).
std::vector<TraceRequest> generate_conversation_trace(const ConversationTraceOptions& options);

}  // namespace kvcache
