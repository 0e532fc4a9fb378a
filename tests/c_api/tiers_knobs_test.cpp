// The C interface's write-back batching and tier lingering knobs
// (kvc_prefix_config.offload_batch / offload_delay_us,
// kvc_host_tier_options.linger_us, kvc_disk_tier_options.linger_us): the
// defaults are the C++ ones, a value out of range is refused naming the field
// and its range (nothing made), and the batching reaches the manager: a batch
// of 1 (or a delay of 0) hands an evicting call's write-backs to the tier
// before the call returns, a large batch with a long delay keeps them staged
// until kvc_wait_tiers.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "c_api/c_tier_rig.h"
#include "kvcache/c_api.h"
#include "kvcache/disk_tier.h"
#include "kvcache/host_tier.h"
#include "kvcache/prefix_cache.h"
#include "tier/tier_test_util.h"

namespace {

using namespace c_tier_test;
using kvcache::tier_test::TempDir;

TEST(CTierKnobs, DefaultsAreTheCppOnes) {
  const kvcache::TierConfig tiers;
  const kvc_prefix_config c = kvc_prefix_config_default();
  EXPECT_EQ(c.offload_batch, tiers.offload_batch);
  EXPECT_EQ(c.offload_delay_us, tiers.offload_delay.count());
  EXPECT_EQ(c.offload_batch, 32u);
  EXPECT_EQ(c.offload_delay_us, 1000u);
  const kvc_host_tier_options h = kvc_host_tier_options_default();
  EXPECT_EQ(h.linger_us, kvcache::HostTierOptions{}.linger.count());
  EXPECT_EQ(h.linger_us, 1000u);
  const kvc_disk_tier_options d = kvc_disk_tier_options_default();
  EXPECT_EQ(d.linger_us, kvcache::DiskTierOptions{}.linger.count());
  EXPECT_EQ(d.linger_us, 1000u);
}

TEST(CTierKnobs, OffloadBatchingOutOfRangeMakesNoManager) {
  const kvc_params p = tier_params();
  kvc_tier* host = host_tier(p, true);
  kvc_manager* m = nullptr;
  const auto create = [&](const kvc_prefix_config& c) {
    return [&m, &p, c](kvc_error* e) { return kvc_manager_create_prefix(&p, 4, 4, 64, &c, &m, e); };
  };
  kvc_prefix_config c = kvc_prefix_config_default();
  c.tiers = &host;
  c.n_tiers = 1;
  c.model_id = "model";
  c.offload_batch = 0;
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"offload_batch is 0", "[1, 65536]"});
  c.offload_batch = 65537;
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"offload_batch is 65537", "[1, 65536]"});
  c.offload_batch = 65536;
  c.offload_delay_us = 1000001;
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"offload_delay is 1000001 us", "[0, 1000000]"});
  EXPECT_EQ(m, nullptr) << "no refused call made a manager";
  c.offload_delay_us = 1000000;  // both limits are in range
  kvc_error err{};
  ASSERT_EQ(create(c)(&err), KVC_OK) << err.message;
  kvc_manager_destroy(m);
  kvc_tier_destroy(host);
}

TEST(CTierKnobs, LingerOutOfRangeMakesNoTier) {
  const kvc_params p = tier_params();
  kvc_tier* t = nullptr;
  kvc_host_tier_options h = kvc_host_tier_options_default();
  const auto host = [&](kvc_error* e) {
    return kvc_host_tier_create(&p, "model", nullptr, 1 << 20, &h, &t, e);
  };
  h.linger_us = 1000001;
  expect_status(host, KVC_INVALID_ARGUMENT, {"linger is 1000001 us", "[0, 1000000]"});
  EXPECT_EQ(t, nullptr);

  TempDir dir;
  kvc_disk_tier_options d = kvc_disk_tier_options_default();
  d.slab_bytes = 1 << 20;
  const auto disk = [&](kvc_error* e) {
    return kvc_disk_tier_create(&p, "model", nullptr, dir.path.c_str(), KVC_TIER_UNLIMITED, &d, &t,
                                e);
  };
  d.linger_us = 4000000000u;
  expect_status(disk, KVC_INVALID_ARGUMENT, {"linger is 4000000000 us", "[0, 1000000]"});
  EXPECT_EQ(t, nullptr);

  kvc_error err{};
  for (const std::uint32_t us : {0u, 1000000u}) {
    h.linger_us = us;
    ASSERT_EQ(host(&err), KVC_OK) << err.message;
    kvc_tier_destroy(t);
    d.linger_us = us;
    ASSERT_EQ(disk(&err), KVC_OK) << err.message;
    kvc_tier_destroy(t);
  }
}

// Fetches room for `tokens` on seq and commits them with their ids.
void fill(Rig& r, std::uint64_t seq, const std::vector<std::uint32_t>& tokens) {
  const auto n = static_cast<std::uint32_t>(tokens.size());
  kvc_error err{};
  ASSERT_EQ(kvc_fetch(r.m, r.batch, &seq, &n, 1, 1, &err), KVC_OK) << err.message;
  ASSERT_EQ(kvc_step(r.m, &seq, &n, 1, tokens.data(), &err), KVC_OK) << err.message;
}

std::uint64_t pages_held(kvc_tier* t) {
  kvc_tier_stats st{};
  kvc_error err{};
  EXPECT_EQ(kvc_tier_stats_get(t, &st, &err), KVC_OK) << err.message;
  return st.pages_held;
}

struct Batching {
  std::uint32_t batch;
  std::uint32_t delay_us;
  bool at_once;  // the evicting call's write-backs reach the tier before it returns
};

class CTierBatching : public ::testing::TestWithParam<Batching> {};

INSTANTIATE_TEST_SUITE_P(Knobs, CTierBatching,
                         ::testing::Values(Batching{1, 1000000, true}, Batching{65536, 0, true},
                                           Batching{65536, 1000000, false}),
                         [](const auto& info) {
                           return "batch" + std::to_string(info.param.batch) + "_delay" +
                                  std::to_string(info.param.delay_us) + "us";
                         });

// A 13-token prompt leaves 3 published pages in the 4-page pool; a 16-token
// fetch evicts them. The host tier is synchronous, so a store handed over is
// held when store() returns.
TEST_P(CTierBatching, WriteBacksReachTheTierAsConfigured) {
  const kvc_params p = tier_params();
  kvc_tier* host = host_tier(p, /*synchronous=*/true);
  ASSERT_NE(host, nullptr);
  kvc_prefix_config c = kvc_prefix_config_default();
  c.offload_batch = GetParam().batch;
  c.offload_delay_us = GetParam().delay_us;
  Rig r({host}, 4, KVC_ARRANGEMENT_INTERLEAVED, c);
  std::vector<std::uint32_t> a(13), b(16);
  for (std::uint32_t i = 0; i < 13; ++i) a[i] = 7 + i;
  for (std::uint32_t i = 0; i < 16; ++i) b[i] = 1000 + i;
  kvc_error err{};
  const std::uint64_t s = claim(r);
  fill(r, s, a);
  ASSERT_EQ(kvc_release(r.m, s, KVC_REUSE_UNKNOWN, &err), KVC_OK) << err.message;
  EXPECT_EQ(pages_held(host), 0u);
  const std::uint64_t other = claim(r);
  fill(r, other, b);  // the fetch evicts a's 3 pages
  EXPECT_EQ(pages_held(host), GetParam().at_once ? 3u : 0u);
  ASSERT_EQ(kvc_wait_tiers(r.m, &err), KVC_OK) << err.message;
  EXPECT_EQ(pages_held(host), 3u) << "kvc_wait_tiers hands over what is staged";
  EXPECT_EQ(kvc_check_invariants(r.m, &err), KVC_OK) << err.message;
  kvc_tier_destroy(host);
}

}  // namespace
