// kvcache/replay/conversation_trace.h: deterministic, time-ordered traces in
// which a conversation's turns extend its previous prompt, system prompts are
// shared, and bad options are refused naming the field.
#include "kvcache/replay/conversation_trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "kvcache/error.h"
#include "kvcache/replay/trace_replay.h"

namespace kvcache {
namespace {

ConversationTraceOptions small(std::uint64_t seed) {
  ConversationTraceOptions o = conversation_shape("chat");
  o.seed = seed;
  o.requests = 400;
  return o;
}

TEST(ConversationTrace, SameSeedSameTraceOtherSeedOtherTrace) {
  const auto a = generate_conversation_trace(small(3)), b = generate_conversation_trace(small(3));
  const auto c = generate_conversation_trace(small(4));
  ASSERT_EQ(a.size(), 400u);
  ASSERT_EQ(a.size(), b.size());
  bool differs = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].timestamp_ms, b[i].timestamp_ms);
    EXPECT_EQ(a[i].hash_ids, b[i].hash_ids);
    EXPECT_EQ(a[i].output_length, b[i].output_length);
    differs = differs || a[i].hash_ids != c[i].hash_ids;
  }
  EXPECT_TRUE(differs);
}

TEST(ConversationTrace, TimeOrderedAndEveryRequestFitsItsBlocks) {
  for (const char* shape : {"chat", "agent"}) {
    ConversationTraceOptions o = conversation_shape(shape);
    o.requests = 300;
    const auto trace = generate_conversation_trace(o);
    for (std::size_t i = 0; i < trace.size(); ++i) {
      if (i > 0) {
        EXPECT_GE(trace[i].timestamp_ms, trace[i - 1].timestamp_ms) << shape;
      }
      EXPECT_LE(trace[i].input_length, o.max_context_tokens) << shape;
      EXPECT_NO_THROW((void)request_tokens(trace[i])) << shape << " request " << i;
    }
  }
}

// A follow-up turn starts with every full block of an earlier prompt (its
// predecessor: conversations of 4 turns on average, a second apart, so 3 in 4
// requests are follow-ups), and most requests share their first block (a
// system prompt).
TEST(ConversationTrace, TurnsExtendEarlierPromptsAndSystemPromptsAreShared) {
  ConversationTraceOptions o = small(5);
  o.one_shot_fraction = 0;
  o.mean_turns = 4;
  o.think_time_s = 1;
  o.long_break_fraction = 0;
  const auto trace = generate_conversation_trace(o);
  std::map<std::uint64_t, int> first_block_uses;
  std::size_t extensions = 0;
  for (std::size_t i = 0; i < trace.size(); ++i) {
    ++first_block_uses[trace[i].hash_ids[0]];
    for (std::size_t j = 0; j < i; ++j) {
      const auto& prev = trace[j];
      const std::size_t full = prev.input_length / kTraceBlockTokens;
      if (full < 3 || prev.hash_ids.size() >= trace[i].hash_ids.size()) continue;
      if (std::equal(prev.hash_ids.begin(), prev.hash_ids.begin() + full,
                     trace[i].hash_ids.begin())) {
        ++extensions;
        break;
      }
    }
  }
  EXPECT_GT(extensions, trace.size() / 2);
  const int top =
      std::max_element(first_block_uses.begin(), first_block_uses.end(), [](auto& a, auto& b) {
        return a.second < b.second;
      })->second;
  EXPECT_GT(top, 50);
}

TEST(ConversationTrace, RefusesBadOptionsNamingThem) {
  auto refuses = [](auto change, const std::string& name) {
    ConversationTraceOptions o = small(1);
    change(o);
    try {
      (void)generate_conversation_trace(o);
      ADD_FAILURE() << name << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  refuses([](auto& o) { o.requests = 0; }, "requests");
  refuses([](auto& o) { o.arrival_rate_per_s = 0; }, "arrival_rate_per_s");
  refuses([](auto& o) { o.one_shot_fraction = 1.5; }, "one_shot_fraction");
  refuses([](auto& o) { o.mean_turns = 0.5; }, "mean_turns");
  refuses([](auto& o) { o.message_tokens = 0; }, "message_tokens");
  refuses([](auto& o) { o.max_context_tokens = kMaxTraceRequestTokens + 1; }, "max_context_tokens");
  refuses([](auto& o) { o.think_time_s = -1; }, "think_time_s");
  refuses([](auto& o) { o.decode_tokens_per_s = 0; }, "decode_tokens_per_s");
  EXPECT_THROW((void)conversation_shape("poetry"), InvalidArgument);
}

}  // namespace
}  // namespace kvcache
