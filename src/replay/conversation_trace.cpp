#include "kvcache/replay/conversation_trace.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <queue>
#include <random>
#include <string>

#include "kvcache/error.h"

namespace kvcache {

namespace {

constexpr std::uint32_t kMaxRequests = 10'000'000;

// Distributions written out (std:: ones differ between standard libraries).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : gen_(seed) {}
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double exponential(double mean) { return -mean * std::log1p(-uniform()); }
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();  // u1 in (0, 1]
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  // Log-normal with the given mean (sigma of the log: `spread`), rounded, >= 1.
  std::uint32_t tokens(std::uint32_t mean, double spread) {
    const double mu = std::log(static_cast<double>(mean)) - spread * spread / 2;
    const double v = std::exp(mu + spread * normal());
    return static_cast<std::uint32_t>(
        std::clamp(std::round(v), 1.0, double{kMaxTraceRequestTokens}));
  }
  // Geometric number of trials >= 1 with the given mean.
  std::uint32_t turns(double mean) {
    if (mean <= 1.0) return 1;
    const double p = 1.0 / mean;
    const double v = std::floor(std::log1p(-uniform()) / std::log1p(-p)) + 1;
    return static_cast<std::uint32_t>(std::min(v, 1e6));
  }

 private:
  std::mt19937_64 gen_;
};

void check_range(const char* name, double v, double lo, double hi) {
  if (!(v >= lo && v <= hi)) {
    throw InvalidArgument(std::string(name) + " " + std::to_string(v) + " is outside [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
}

void check_positive(const char* name, double v) {
  if (!(v > 0 && std::isfinite(v))) {
    throw InvalidArgument(std::string(name) + " " + std::to_string(v) +
                          " must be a finite number > 0");
  }
}

void validate(const ConversationTraceOptions& o) {
  check_range("requests", o.requests, 1, kMaxRequests);
  check_positive("arrival_rate_per_s", o.arrival_rate_per_s);
  check_range("one_shot_fraction", o.one_shot_fraction, 0, 1);
  check_range("mean_turns", o.mean_turns, 1, 1000);
  check_range("system_prompts", o.system_prompts, 1, 1e6);
  for (const auto& [name, v] :
       {std::pair{"system_prompt_tokens", o.system_prompt_tokens},
        std::pair{"message_tokens", o.message_tokens}, std::pair{"reply_tokens", o.reply_tokens},
        std::pair{"max_context_tokens", o.max_context_tokens}}) {
    check_range(name, v, 1, kMaxTraceRequestTokens);
  }
  check_range("think_time_s", o.think_time_s, 0, 1e9);
  check_range("long_break_fraction", o.long_break_fraction, 0, 1);
  check_range("long_break_s", o.long_break_s, 0, 1e9);
  check_positive("decode_tokens_per_s", o.decode_tokens_per_s);
}

struct Conversation {
  std::uint32_t system = 0;   // system prompt index
  std::uint32_t context = 0;  // tokens so far (prompt + reply of the last turn)
  std::uint32_t turns_left = 0;
  bool started = false;
  bool one_shot = false;
  std::vector<std::uint64_t> own;  // ids of its blocks past the shared system blocks
};

struct Event {
  double time_ms;
  std::uint64_t order;         // tie-break: scheduling order
  std::uint32_t conversation;  // UINT32_MAX: the next arrival
  bool operator>(const Event& e) const {
    return time_ms != e.time_ms ? time_ms > e.time_ms : order > e.order;
  }
};

class Generator {
 public:
  explicit Generator(const ConversationTraceOptions& o) : o_(o), rng_(o.seed) {
    double total_weight = 0;
    for (std::uint32_t k = 0; k < o.system_prompts; ++k) total_weight += 1.0 / (k + 1);
    double acc = 0;
    for (std::uint32_t k = 0; k < o.system_prompts; ++k) {
      acc += 1.0 / (k + 1) / total_weight;
      cumulative_.push_back(acc);
      // At most half the context, so that a first turn always has room.
      const std::uint32_t len =
          std::min(rng_.tokens(o.system_prompt_tokens, 0.5), o.max_context_tokens / 2);
      system_len_.push_back(len);
      system_base_.push_back(next_id_);
      next_id_ += len / kTraceBlockTokens;
    }
  }

  std::vector<TraceRequest> run() {
    schedule(0, UINT32_MAX);
    while (out_.size() < o_.requests) {
      const Event e = queue_.top();
      queue_.pop();
      if (e.conversation == UINT32_MAX) {
        arrive(e.time_ms);
        schedule(e.time_ms + rng_.exponential(1000.0 / o_.arrival_rate_per_s), UINT32_MAX);
      } else {
        turn(e.conversation, e.time_ms);
      }
    }
    return std::move(out_);
  }

 private:
  void schedule(double time_ms, std::uint32_t conversation) {
    queue_.push(Event{time_ms, order_++, conversation});
  }

  std::uint32_t pick_system() {
    const double u = rng_.uniform();
    const auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), u);
    return static_cast<std::uint32_t>(
        std::min<std::ptrdiff_t>(it - cumulative_.begin(), cumulative_.size() - 1));
  }

  void arrive(double time_ms) {
    Conversation c;
    c.system = pick_system();
    c.context = system_len_[c.system];
    c.one_shot = rng_.uniform() < o_.one_shot_fraction;
    c.turns_left = c.one_shot ? 1 : rng_.turns(o_.mean_turns);
    conversations_.push_back(std::move(c));
    turn(static_cast<std::uint32_t>(conversations_.size() - 1), time_ms);
  }

  // Emits the conversation's next turn and schedules the one after it.
  void turn(std::uint32_t index, double time_ms) {
    Conversation& c = conversations_[index];
    std::uint32_t message = rng_.tokens(c.one_shot ? o_.one_shot_tokens : o_.message_tokens, 1.0);
    if (std::uint64_t{c.context} + message > o_.max_context_tokens) {
      if (c.started) return finish(c);              // the conversation is over
      message = o_.max_context_tokens - c.context;  // the first turn fits, cut short
    }
    c.started = true;
    c.context += message;
    const std::uint32_t reply = rng_.tokens(o_.reply_tokens, 0.8);
    out_.push_back(request(c, time_ms, reply));
    c.context = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(std::uint64_t{c.context} + reply, kMaxTraceRequestTokens));
    if (--c.turns_left == 0) return finish(c);
    const bool long_break = rng_.uniform() < o_.long_break_fraction;
    const double pause_s = rng_.exponential(long_break ? o_.long_break_s : o_.think_time_s) +
                           reply / o_.decode_tokens_per_s;
    schedule(time_ms + std::round(pause_s * 1000.0), index);
  }

  static void finish(Conversation& c) {
    c.turns_left = 0;
    c.own = {};
  }

  TraceRequest request(Conversation& c, double time_ms, std::uint32_t reply) {
    TraceRequest r;
    r.timestamp_ms = std::round(time_ms);
    r.input_length = c.context;
    r.output_length = reply;
    const std::uint32_t blocks = (c.context + kTraceBlockTokens - 1) / kTraceBlockTokens;
    const std::uint32_t shared = system_len_[c.system] / kTraceBlockTokens;
    r.hash_ids.reserve(blocks);
    for (std::uint32_t j = 0; j < blocks; ++j) {
      if (j < shared) {
        r.hash_ids.push_back(system_base_[c.system] + j);
        continue;
      }
      while (c.own.size() <= j - shared) c.own.push_back(next_id_++);
      r.hash_ids.push_back(c.own[j - shared]);
    }
    return r;
  }

  const ConversationTraceOptions& o_;
  Rng rng_;
  std::vector<double> cumulative_;
  std::vector<std::uint32_t> system_len_;
  std::vector<std::uint64_t> system_base_;
  std::uint64_t next_id_ = 0;
  std::uint64_t order_ = 0;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> queue_;
  std::vector<Conversation> conversations_;
  std::vector<TraceRequest> out_;
};

}  // namespace

ConversationTraceOptions conversation_shape(std::string_view name) {
  ConversationTraceOptions o;
  if (name == "chat") return o;
  if (name == "agent") {
    o.arrival_rate_per_s = 0.5;
    o.one_shot_fraction = 0.1;
    o.mean_turns = 12;
    o.system_prompts = 4;
    o.system_prompt_tokens = 6000;
    o.message_tokens = 1200;
    o.reply_tokens = 300;
    o.think_time_s = 20;
    o.long_break_fraction = 0.1;
    o.long_break_s = 600;
    o.max_context_tokens = 131072;
    return o;
  }
  throw InvalidArgument("unknown conversation shape '" + std::string(name) +
                        "' (known: chat, agent)");
}

std::vector<TraceRequest> generate_conversation_trace(const ConversationTraceOptions& options) {
  validate(options);
  return Generator(options).run();
}

}  // namespace kvcache
