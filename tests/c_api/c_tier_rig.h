// Helpers of the C interface's tier tests (tiers_test.cpp,
// tiers_errors_test.cpp): the cache shape, status checks, a paged manager
// over tiers with its batch and recorded events, a host tier.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kvcache/c_api.h"

namespace c_tier_test {

constexpr std::uint32_t kLayers = 3;
constexpr std::uint32_t kHeads = 2;
constexpr std::uint32_t kDim = 4;
constexpr std::uint32_t kPage = 4;

inline kvc_params tier_params(std::int32_t arrangement = KVC_ARRANGEMENT_INTERLEAVED) {
  kvc_params p{};
  p.dtype = KVC_DTYPE_F32;
  p.num_layers = kLayers;
  p.n_kv_heads = kHeads;
  p.head_dim = kDim;
  p.strategy = KVC_STRATEGY_PAGED;
  p.page_size = kPage;
  p.enable_prefix_caching = 1;
  p.page_layout = KVC_LAYOUT_NHD;
  p.pool_arrangement = arrangement;
  return p;
}

// A failure's text for the assertion message.
inline std::string describe(kvc_status s, const kvc_error& err) {
  return std::string(kvc_status_name(s)) + ": " + err.message;
}

// Calls fn(&err); expects `status` and a message containing every needle.
template <class F>
void expect_status(F&& fn, kvc_status status, std::initializer_list<std::string> needles) {
  kvc_error err{};
  const kvc_status got = fn(&err);
  EXPECT_EQ(got, status) << describe(got, err);
  EXPECT_EQ(err.status, got);
  const std::string msg = err.message;
  for (const auto& n : needles) {
    EXPECT_NE(msg.find(n), std::string::npos) << "message '" << msg << "' lacks '" << n << "'";
  }
}

struct Event {
  std::int32_t kind;
  std::string medium;
  std::uint64_t key_hi;
  std::uint64_t key_lo;
};

inline void record_event(const kvc_page_event* e, void* user) {
  static_cast<std::vector<Event>*>(user)->push_back({e->kind, e->medium, e->key_hi, e->key_lo});
}

inline std::size_t count(const std::vector<Event>& events, std::int32_t kind,
                         const std::string& medium) {
  std::size_t n = 0;
  for (const Event& e : events) n += e.kind == kind && e.medium == medium;
  return n;
}

// A paged manager of `pages` pages over `tiers`, with its batch and events;
// the rest of its configuration from `base`.
struct Rig {
  Rig(std::vector<kvc_tier*> tiers, std::uint32_t pages = 4,
      std::int32_t arrangement = KVC_ARRANGEMENT_INTERLEAVED,
      kvc_prefix_config base = kvc_prefix_config_default())
      : params(tier_params(arrangement)) {
    kvc_prefix_config c = base;
    c.on_event = &record_event;
    c.user_data = &events;
    c.tiers = tiers.data();
    c.n_tiers = static_cast<std::uint32_t>(tiers.size());
    c.model_id = "model";
    kvc_error err{};
    const kvc_status s = kvc_manager_create_prefix(&params, pages, 4, 64, &c, &m, &err);
    EXPECT_EQ(s, KVC_OK) << describe(s, err);
    EXPECT_EQ(kvc_batch_create(&batch, &err), KVC_OK);
  }
  ~Rig() {
    kvc_batch_destroy(batch);
    kvc_manager_destroy(m);
  }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  kvc_params params;
  std::vector<Event> events;
  kvc_manager* m = nullptr;
  kvc_batch* batch = nullptr;
};

inline std::uint64_t claim(Rig& r) {
  std::uint64_t seq = 0;
  kvc_error err{};
  const kvc_status s = kvc_claim(r.m, 1, &seq, &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  return seq;
}

inline std::int32_t pending(Rig& r, std::uint64_t seq) {
  std::int32_t p = -1;
  kvc_error err{};
  EXPECT_EQ(kvc_has_pending_loads(r.m, seq, &p, &err), KVC_OK) << err.message;
  return p;
}

inline kvc_tier* host_tier(const kvc_params& p, bool synchronous, const char* model = "model") {
  kvc_host_tier_options o = kvc_host_tier_options_default();
  o.synchronous = synchronous ? 1 : 0;
  std::uint64_t page_bytes = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_tier_page_bytes(&p, &page_bytes, &err), KVC_OK) << err.message;
  kvc_tier* t = nullptr;
  const kvc_status s = kvc_host_tier_create(&p, model, nullptr, 64 * page_bytes, &o, &t, &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  return t;
}

// The test name of a pool arrangement parameter (INSTANTIATE_TEST_SUITE_P).
inline std::string arrangement_name(const ::testing::TestParamInfo<std::int32_t>& info) {
  return info.param == KVC_ARRANGEMENT_INTERLEAVED ? "interleaved" : "per_layer";
}

}  // namespace c_tier_test
