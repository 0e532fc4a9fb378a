// The C interface's storage tiers, the edges: defaults equal to the C++
// ones, a manager without tiers, and every bad argument refused with a
// status and a message naming the value, nothing made (tiers_test.cpp has
// the round trips).
#include <gtest/gtest.h>

#include <string>

#include "c_api/c_tier_rig.h"
#include "kvcache/c_api.h"
#include "tier/tier_test_util.h"

namespace {

using namespace c_tier_test;
using kvcache::tier_test::TempDir;

TEST(CTier, DefaultsAreTheCppOnes) {
  const kvc_prefix_config c = kvc_prefix_config_default();
  EXPECT_EQ(c.policy, KVC_EVICT_ADAPTIVE);
  EXPECT_EQ(c.tiers, nullptr);
  EXPECT_EQ(c.n_tiers, 0u);
  EXPECT_EQ(c.admission, KVC_ADMIT_EVERY_PAGE);
  EXPECT_EQ(c.staging_pages, 16u);
  const kvc_host_tier_options h = kvc_host_tier_options_default();
  EXPECT_EQ(h.threads, 2u);
  EXPECT_EQ(h.synchronous, 0);
  EXPECT_EQ(h.huge_pages, 1);
  EXPECT_EQ(h.checksums, 0);
  EXPECT_EQ(h.chunk_bytes, std::uint64_t{256} << 20);
  const kvc_disk_tier_options d = kvc_disk_tier_options_default();
  EXPECT_EQ(d.io, KVC_DISK_IO_AUTOMATIC);
  EXPECT_EQ(d.direct_io, 1);
  EXPECT_EQ(d.durable, 1);
  EXPECT_EQ(d.threads, 2u);
  EXPECT_EQ(d.queue_depth, 32u);
  EXPECT_EQ(d.max_consecutive_errors, 8u);
  EXPECT_EQ(d.slab_bytes, std::uint64_t{1} << 30);
  EXPECT_EQ(d.compact_min_records, 4096u);
  std::uint64_t bytes = 0;
  const kvc_params p = tier_params();
  ASSERT_EQ(kvc_tier_page_bytes(&p, &bytes, nullptr), KVC_OK);
  EXPECT_EQ(bytes, std::uint64_t{2} * kLayers * kPage * kHeads * kDim * sizeof(float));
}

TEST(CTier, NoTiersMeansNoFiguresAndNothingPending) {
  Rig r({});
  std::uint32_t n = 7, loading = 7;
  kvc_error err{};
  ASSERT_EQ(kvc_manager_tier_figures(r.m, nullptr, 0, &n, &loading, &err), KVC_OK);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(loading, 0u);
  const std::uint64_t s = claim(r);
  EXPECT_EQ(pending(r, s), 0);
  ASSERT_EQ(kvc_poll_loads(r.m, nullptr, 0, &n, &err), KVC_OK) << err.message;
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(kvc_wait_loads(r.m, s, &err), KVC_OK);
  EXPECT_EQ(kvc_wait_tiers(r.m, &err), KVC_OK);
}

TEST(CTier, BadTierArgumentsAreRefusedByName) {
  const kvc_params p = tier_params();
  kvc_tier* t = nullptr;
  const auto host = [&](const kvc_params* params, std::uint64_t cap,
                        const kvc_host_tier_options* o) {
    return [=, &t](kvc_error* e) { return kvc_host_tier_create(params, "m", "", cap, o, &t, e); };
  };
  expect_status(host(nullptr, 1 << 20, nullptr), KVC_INVALID_ARGUMENT, {"params is NULL"});
  kvc_params continuous = p;
  continuous.strategy = KVC_STRATEGY_CONTINUOUS;
  continuous.page_size = 0;
  continuous.enable_prefix_caching = 0;
  expect_status(host(&continuous, 1 << 20, nullptr), KVC_INVALID_ARGUMENT, {"KVC_STRATEGY_PAGED"});
  kvc_params bad_dtype = p;
  bad_dtype.dtype = 9;
  expect_status(host(&bad_dtype, 1 << 20, nullptr), KVC_INVALID_ARGUMENT,
                {"params->dtype value 9"});
  kvc_host_tier_options o = kvc_host_tier_options_default();
  o.threads = 0;
  expect_status(host(&p, 1 << 20, &o), KVC_INVALID_ARGUMENT, {"threads is 0"});
  o.threads = 5000;
  expect_status(host(&p, 1 << 20, &o), KVC_INVALID_ARGUMENT, {"options->threads is 5000"});
  o = kvc_host_tier_options_default();
  o.checksums = 2;
  expect_status(host(&p, 1 << 20, &o), KVC_INVALID_ARGUMENT, {"options->checksums is 2"});
  expect_status(
      [&](kvc_error* e) { return kvc_host_tier_create(&p, "m", "", 1, nullptr, nullptr, e); },
      KVC_INVALID_ARGUMENT, {"out is NULL"});
  EXPECT_EQ(t, nullptr) << "no refused call made a tier";

  TempDir dir;
  const auto disk = [&](const char* path, const kvc_disk_tier_options* opt) {
    return [=, &t, &p](kvc_error* e) {
      return kvc_disk_tier_create(&p, "m", "", path, KVC_TIER_UNLIMITED, opt, &t, e);
    };
  };
  expect_status(disk(nullptr, nullptr), KVC_INVALID_ARGUMENT, {"dir is NULL"});
  expect_status(disk("", nullptr), KVC_INVALID_ARGUMENT, {"dir is empty"});
  kvc_disk_tier_options d = kvc_disk_tier_options_default();
  d.io = 7;
  expect_status(disk(dir.path.c_str(), &d), KVC_INVALID_ARGUMENT, {"options->io value 7"});
  d = kvc_disk_tier_options_default();
  d.queue_depth = 0;
  expect_status(disk(dir.path.c_str(), &d), KVC_INVALID_ARGUMENT, {"queue_depth 0"});
  d = kvc_disk_tier_options_default();
  d.durable = -1;
  expect_status(disk(dir.path.c_str(), &d), KVC_INVALID_ARGUMENT, {"options->durable is -1"});
  expect_status(disk("/proc/kvcache-no-such-dir", nullptr), KVC_INVALID_ARGUMENT,
                {"/proc/kvcache-no-such-dir"});
  EXPECT_EQ(t, nullptr);

  kvc_tier_stats st{};
  expect_status([&](kvc_error* e) { return kvc_tier_stats_get(nullptr, &st, e); },
                KVC_INVALID_ARGUMENT, {"tier is NULL"});
  kvc_tier* h = host_tier(p, true);
  expect_status([&](kvc_error* e) { return kvc_tier_stats_get(h, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"out is NULL"});
  kvc_disk_tier_info info{};
  expect_status([&](kvc_error* e) { return kvc_disk_tier_info_get(h, &info, e); },
                KVC_INVALID_ARGUMENT, {"'host' tier, not a disk tier"});
  EXPECT_EQ(kvc_tier_name(nullptr), nullptr);
  kvc_tier_destroy(h);
  kvc_tier_destroy(nullptr);
}

TEST(CTier, BadTierConfigurationsMakeNoManager) {
  const kvc_params p = tier_params();
  kvc_tier* host = host_tier(p, true);
  kvc_manager* m = nullptr;
  const auto create = [&](const kvc_prefix_config& c) {
    return [&m, &p, c](kvc_error* e) { return kvc_manager_create_prefix(&p, 4, 4, 64, &c, &m, e); };
  };
  kvc_prefix_config c = kvc_prefix_config_default();
  c.n_tiers = 1;
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"config->tiers is NULL with 1 elements"});
  kvc_tier* with_null[2] = {host, nullptr};
  c.tiers = with_null;
  c.n_tiers = 2;
  c.model_id = "model";
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"config->tiers[1] is NULL"});
  c.n_tiers = 1;
  c.admission = 5;
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"config->admission value 5"});
  c.admission = KVC_ADMIT_REUSED;
  c.staging_pages = 0;
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"staging_pages is 0"});
  c.staging_pages = 16;
  c.model_id = "other";
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"model_id", "'model'", "'other'"});
  c.model_id = "model";
  c.cache_salt = "tenant";
  expect_status(create(c), KVC_INVALID_ARGUMENT, {"cache_salt"});
  EXPECT_EQ(m, nullptr) << "no refused call made a manager";
  c.cache_salt = nullptr;
  kvc_error err{};
  ASSERT_EQ(create(c)(&err), KVC_OK) << err.message;
  kvc_manager_destroy(m);
  kvc_tier_destroy(host);
}

TEST(CTier, BadPendingLoadCallsAreRefused) {
  kvc_tier* host = host_tier(tier_params(), true);
  Rig r({host});
  kvc_tier_destroy(host);
  std::int32_t p = 0;
  expect_status([&](kvc_error* e) { return kvc_has_pending_loads(r.m, 42, &p, e); },
                KVC_UNKNOWN_SEQUENCE, {"seq 42"});
  expect_status([&](kvc_error* e) { return kvc_has_pending_loads(r.m, 0, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"pending is NULL"});
  expect_status([&](kvc_error* e) { return kvc_wait_loads(r.m, 42, e); }, KVC_UNKNOWN_SEQUENCE,
                {"seq 42"});
  std::uint64_t ids[3];
  std::uint32_t n = 0;
  expect_status([&](kvc_error* e) { return kvc_poll_loads(r.m, ids, 3, &n, e); },
                KVC_INVALID_ARGUMENT, {"seq_ids holds 3", "max_batch_size (4)"});
  expect_status([&](kvc_error* e) { return kvc_poll_loads(r.m, nullptr, 3, &n, e); },
                KVC_INVALID_ARGUMENT, {"seq_ids is NULL with 3"});
  expect_status([&](kvc_error* e) { return kvc_poll_loads(r.m, ids, 4, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"count is NULL"});
  expect_status([&](kvc_error* e) { return kvc_wait_tiers(nullptr, e); }, KVC_INVALID_ARGUMENT,
                {"manager is NULL"});
  kvc_tier_figures f[1];
  expect_status([&](kvc_error* e) { return kvc_manager_tier_figures(r.m, f, 0, &n, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"figures holds 0 entries", "1 tiers"});
  EXPECT_EQ(n, 1u) << "the count is set even when the figures do not fit";
  expect_status(
      [&](kvc_error* e) { return kvc_manager_tier_figures(r.m, nullptr, 2, &n, nullptr, e); },
      KVC_INVALID_ARGUMENT, {"figures is NULL with cap 2"});

  kvc_params cp = tier_params();
  cp.strategy = KVC_STRATEGY_CONTINUOUS;
  cp.page_size = 0;
  cp.enable_prefix_caching = 0;
  kvc_manager* cm = nullptr;
  kvc_error err{};
  ASSERT_EQ(kvc_manager_create(&cp, 0, 2, 16, &cm, &err), KVC_OK) << err.message;
  expect_status([&](kvc_error* e) { return kvc_poll_loads(cm, nullptr, 0, &n, e); },
                KVC_INVALID_ARGUMENT, {"kvc_poll_loads needs the paged strategy"});
  ASSERT_EQ(kvc_manager_tier_figures(cm, nullptr, 0, &n, nullptr, &err), KVC_OK);
  EXPECT_EQ(n, 0u);
  kvc_manager_destroy(cm);
}

}  // namespace
