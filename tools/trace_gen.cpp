// tools/trace_gen.cpp — `kvcache trace-gen`: a synthetic multi-turn
// conversation trace in the Mooncake JSONL format `kvcache replay` reads
// (kvcache/replay/conversation_trace.h describes the model).
//
//   kvcache trace-gen --shape chat --requests 20000 --seed 1 --out chat.jsonl
//
// A shape (chat | agent) sets every parameter; the flags given override
// theirs. Output: one request a line, in time order, on stdout or --out FILE;
// a summary on stderr. Bad input: exit 2 naming the value and its range.

#include "trace_gen.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "commands.h"
#include "kvcache/error.h"
#include "kvcache/replay/conversation_trace.h"

namespace kvcache::tools {

void write_trace_jsonl(std::ostream& out, std::span<const TraceRequest> trace) {
  std::string line;
  for (const TraceRequest& r : trace) {
    line = "{\"timestamp\": " + std::to_string(static_cast<std::uint64_t>(r.timestamp_ms)) +
           ", \"input_length\": " + std::to_string(r.input_length) +
           ", \"output_length\": " + std::to_string(r.output_length) + ", \"hash_ids\": [";
    for (std::size_t i = 0; i < r.hash_ids.size(); ++i) {
      if (i > 0) line += ", ";
      line += std::to_string(r.hash_ids[i]);
    }
    line += "]}\n";
    out << line;
  }
}

namespace {

struct TraceGenArgs {
  std::string shape = "chat";
  std::string out;
  ConversationTraceOptions given;  // values of the flags given (the rest unused)
  std::vector<
      std::pair<CLI::Option*, void (*)(ConversationTraceOptions&, const ConversationTraceOptions&)>>
      overrides;
};

template <auto Field>
void copy_field(ConversationTraceOptions& to, const ConversationTraceOptions& from) {
  to.*Field = from.*Field;
}

template <auto Field>
void add_override(CLI::App* cmd, TraceGenArgs& a, const char* flag, const char* help) {
  CLI::Option* opt = cmd->add_option(flag, a.given.*Field, help);
  a.overrides.emplace_back(opt, &copy_field<Field>);
}

void run_trace_gen(const TraceGenArgs& a) {
  ConversationTraceOptions o = conversation_shape(a.shape);
  for (const auto& [opt, apply] : a.overrides)
    if (opt->count() > 0) apply(o, a.given);
  const std::vector<TraceRequest> trace = generate_conversation_trace(o);
  std::uint64_t blocks = 0, tokens = 0;
  for (const TraceRequest& r : trace) blocks += r.hash_ids.size(), tokens += r.input_length;
  if (a.out.empty()) {
    write_trace_jsonl(std::cout, trace);
  } else {
    std::ofstream file(a.out, std::ios::binary | std::ios::trunc);
    write_trace_jsonl(file, trace);
    file.close();
    if (!file) throw InvalidArgument("--out '" + a.out + "' could not be written");
  }
  std::fprintf(stderr, "trace-gen: %zu requests, %llu prompt tokens, %llu blocks, %.0f s\n",
               trace.size(), static_cast<unsigned long long>(tokens),
               static_cast<unsigned long long>(blocks),
               trace.empty() ? 0.0 : trace.back().timestamp_ms / 1000.0);
}

}  // namespace

void add_trace_gen_command(CLI::App& app) {
  auto a = std::make_shared<TraceGenArgs>();
  CLI::App* cmd = app.add_subcommand(
      "trace-gen",
      "Write a synthetic multi-turn conversation trace (Mooncake JSONL, as `replay` reads): each "
      "turn's prompt = the previous prompt + its reply + a new message");
  cmd->add_option("--shape", a->shape,
                  "Preset parameters: chat (short messages, a minute of thought) | agent (long "
                  "tool outputs, turns seconds apart, 128K context); the flags below override")
      ->capture_default_str();
  cmd->add_option("--out", a->out, "Write the trace here instead of stdout");
  using O = ConversationTraceOptions;
  add_override<&O::seed>(cmd, *a, "--seed", "Random seed (same seed and flags: same trace)");
  add_override<&O::requests>(cmd, *a, "--requests", "Requests in the trace");
  add_override<&O::arrival_rate_per_s>(cmd, *a, "--rate",
                                       "New conversations and one-shot requests per second");
  add_override<&O::one_shot_fraction>(cmd, *a, "--one-shot",
                                      "Share of arrivals that are one-shot requests (0..1)");
  add_override<&O::mean_turns>(cmd, *a, "--turns", "Mean turns of a conversation (geometric)");
  add_override<&O::system_prompts>(cmd, *a, "--system-prompts",
                                   "Distinct system prompts (the k-th used with weight 1/k)");
  add_override<&O::system_prompt_tokens>(cmd, *a, "--system-tokens",
                                         "Mean system prompt length in tokens");
  add_override<&O::one_shot_tokens>(cmd, *a, "--one-shot-tokens",
                                    "Mean message tokens of a one-shot request (a document)");
  add_override<&O::message_tokens>(cmd, *a, "--message-tokens", "Mean user message tokens");
  add_override<&O::reply_tokens>(cmd, *a, "--reply-tokens", "Mean reply tokens (output_length)");
  add_override<&O::think_time_s>(cmd, *a, "--think", "Mean think time between turns, seconds");
  add_override<&O::long_break_fraction>(cmd, *a, "--long-break-fraction",
                                        "Share of turns that follow a long break (0..1)");
  add_override<&O::long_break_s>(cmd, *a, "--long-break", "Mean long break, seconds");
  add_override<&O::decode_tokens_per_s>(cmd, *a, "--decode-rate",
                                        "Reply tokens per second (delays the next turn)");
  add_override<&O::max_context_tokens>(cmd, *a, "--max-context",
                                       "Context limit: a conversation ends before passing it");
  cmd->callback([a] { run_trace_gen(*a); });
}

}  // namespace kvcache::tools
