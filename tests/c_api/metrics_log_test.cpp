// The C interface's metrics and logging: kvc_metrics_text (size query, a
// buffer too small, prefixes, NULLs) and kvc_set_log_callback /
// kvc_set_log_level (a C callback receives the failed calls at debug, nothing
// below the level; bad levels refused).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kvcache/c_api.h"
#include "manager/exposition_format.h"

namespace {

kvc_manager* make_manager() {
  kvc_params p{};
  p.dtype = KVC_DTYPE_F32;
  p.num_layers = 1;
  p.n_kv_heads = 1;
  p.head_dim = 4;
  p.strategy = KVC_STRATEGY_PAGED;
  p.page_size = 4;
  kvc_manager* m = nullptr;
  kvc_error err{};
  EXPECT_EQ(kvc_manager_create(&p, 8, 4, 64, &m, &err), KVC_OK) << err.message;
  return m;
}

struct Manager {
  kvc_manager* m = make_manager();
  ~Manager() { kvc_manager_destroy(m); }
};

std::string text_of(const kvc_manager* m, const char* prefix) {
  size_t needed = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_metrics_text(m, prefix, nullptr, 0, &needed, &err), KVC_OK) << err.message;
  std::vector<char> buf(needed);
  size_t again = 0;
  EXPECT_EQ(kvc_metrics_text(m, prefix, buf.data(), buf.size(), &again, &err), KVC_OK)
      << err.message;
  EXPECT_EQ(again, needed);
  EXPECT_EQ(std::strlen(buf.data()) + 1, needed);
  return buf.data();
}

TEST(CMetrics, TextAfterClaimAndFetch) {
  Manager h;
  uint64_t seq = 0;
  const uint32_t tokens = 6;
  kvc_batch* batch = nullptr;
  ASSERT_EQ(kvc_batch_create(&batch, nullptr), KVC_OK);
  ASSERT_EQ(kvc_claim(h.m, 1, &seq, nullptr), KVC_OK);
  ASSERT_EQ(kvc_fetch(h.m, batch, &seq, &tokens, 1, 1, nullptr), KVC_OK);
  const std::string text = text_of(h.m, nullptr);
  EXPECT_EQ(kvtest::exposition_problems(text), "");
  const auto s = kvtest::exposition_samples(text);
  EXPECT_EQ(s.at("kvcache_blocks_capacity{strategy=\"paged\",tier=\"device\"}"), 8u);
  EXPECT_EQ(s.at("kvcache_blocks_used{strategy=\"paged\",tier=\"device\"}"), 2u);
  EXPECT_EQ(s.at("kvcache_sequences_claimed_total{strategy=\"paged\"}"), 1u);
  EXPECT_EQ(s.at("kvcache_fetches_total{strategy=\"paged\"}"), 1u);
  const auto named = kvtest::exposition_samples(text_of(h.m, "engine_a"));
  EXPECT_EQ(named.at("engine_a_fetches_total{strategy=\"paged\"}"), 1u);
  kvc_batch_destroy(batch);
}

TEST(CMetrics, BufferTooSmallWritesNothing) {
  Manager h;
  size_t needed = 0;
  ASSERT_EQ(kvc_metrics_text(h.m, nullptr, nullptr, 0, &needed, nullptr), KVC_OK);
  std::vector<char> buf(needed - 1, 'x');
  size_t told = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_metrics_text(h.m, nullptr, buf.data(), buf.size(), &told, &err),
            KVC_INVALID_ARGUMENT);
  EXPECT_EQ(told, needed);
  EXPECT_NE(std::string(err.message)
                .find("buf holds " + std::to_string(needed - 1) +
                      " bytes but the metrics text needs " + std::to_string(needed)),
            std::string::npos)
      << err.message;
  EXPECT_EQ(std::string(buf.begin(), buf.end()), std::string(needed - 1, 'x'));
}

TEST(CMetrics, RefusesNullsAndBadPrefixes) {
  Manager h;
  char buf[16];
  size_t needed = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_metrics_text(nullptr, nullptr, nullptr, 0, &needed, &err), KVC_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("manager is NULL"), std::string::npos);
  EXPECT_EQ(kvc_metrics_text(h.m, nullptr, nullptr, 16, &needed, &err), KVC_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("buf is NULL with cap 16"), std::string::npos);
  EXPECT_EQ(kvc_metrics_text(h.m, "kv-cache", buf, sizeof buf, &needed, &err),
            KVC_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("'kv-cache' is not a Prometheus metric name"),
            std::string::npos);
  EXPECT_EQ(kvc_metrics_text(h.m, nullptr, nullptr, 0, nullptr, &err), KVC_OK);  // needed optional
}

struct Received {
  std::vector<std::pair<int32_t, std::string>> lines;
  size_t length_mismatches = 0;
};

extern "C" void collect(int32_t level, const char* message, size_t length, void* user_data) {
  auto* r = static_cast<Received*>(user_data);
  if (std::strlen(message) != length) ++r->length_mismatches;
  r->lines.emplace_back(level, message);
}

TEST(CLog, CallbackReceivesFailedCallsAtDebug) {
  Manager h;
  Received got;
  ASSERT_EQ(kvc_set_log_callback(&collect, &got, nullptr), KVC_OK);
  ASSERT_EQ(kvc_set_log_level(KVC_LOG_INFO, nullptr), KVC_OK);
  EXPECT_EQ(kvc_get_log_level(), KVC_LOG_INFO);
  EXPECT_EQ(kvc_release(h.m, 77, KVC_REUSE_UNKNOWN, nullptr), KVC_UNKNOWN_SEQUENCE);
  EXPECT_TRUE(got.lines.empty());  // debug is below info
  ASSERT_EQ(kvc_set_log_level(KVC_LOG_DEBUG, nullptr), KVC_OK);
  EXPECT_EQ(kvc_release(h.m, 77, KVC_REUSE_UNKNOWN, nullptr), KVC_UNKNOWN_SEQUENCE);
  ASSERT_EQ(got.lines.size(), 1u);
  EXPECT_EQ(got.lines[0].first, KVC_LOG_DEBUG);
  EXPECT_EQ(got.lines[0].second.rfind("C interface: returning unknown_sequence: seq 77", 0), 0u)
      << got.lines[0].second;
  kvc_manager* other = make_manager();  // construction at info
  kvc_manager_destroy(other);
  ASSERT_EQ(got.lines.size(), 2u);
  EXPECT_EQ(got.lines[1].first, KVC_LOG_INFO);
  EXPECT_EQ(got.lines[1].second.rfind("paged manager: 8 pages of 4 tokens", 0), 0u);
  EXPECT_EQ(got.length_mismatches, 0u);
  ASSERT_EQ(kvc_set_log_callback(nullptr, nullptr, nullptr), KVC_OK);
  ASSERT_EQ(kvc_set_log_level(KVC_LOG_OFF, nullptr), KVC_OK);
}

TEST(CLog, RefusesLevelsOutsideTheEnum) {
  const int32_t before = kvc_get_log_level();
  for (int32_t bad : {-1, 6, 1000}) {
    kvc_error err{};
    EXPECT_EQ(kvc_set_log_level(bad, &err), KVC_INVALID_ARGUMENT);
    EXPECT_NE(std::string(err.message).find("log level " + std::to_string(bad) + " is not"),
              std::string::npos)
        << err.message;
  }
  EXPECT_EQ(kvc_get_log_level(), before);
}

}  // namespace
