// The C interface's storage tiers (kvcache/c_api.h "storage tiers"): pages
// the pool evicts written back to a host tier and to a disk tier, loaded back
// by kvc_match_prefix and read through kvc_batch_describe bit for bit equal
// to what kvc_store_kv wrote; pending loads refused by fetch / fork /
// truncate; a second manager on the disk tier's directory after a restart;
// events with their medium; per-tier figures. Bad arguments:
// tiers_errors_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "c_api/c_tier_rig.h"
#include "kvcache/c_api.h"
#include "tier/tier_test_util.h"

namespace {

using namespace c_tier_test;
using kvcache::tier_test::TempDir;

// K and V written for a sequence: [layer][kv][token][head][dim].
using Written = std::vector<float>;

std::size_t at(std::uint32_t layer, std::uint32_t kv, std::uint32_t tok, std::uint32_t head,
               std::uint32_t d, std::uint32_t tokens) {
  return (((std::size_t{layer} * 2 + kv) * tokens + tok) * kHeads + head) * kDim + d;
}

std::vector<std::uint32_t> iota_tokens(std::uint32_t n, std::uint32_t from) {
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = from + i;
  return t;
}

// Fetches room for every token of a fresh seq, stores random K and V with
// kvc_store_kv, commits them with their ids.
Written prefill(Rig& r, std::uint64_t seq, const std::vector<std::uint32_t>& tokens,
                std::mt19937& rng) {
  const auto n = static_cast<std::uint32_t>(tokens.size());
  kvc_error err{};
  kvc_status s = kvc_fetch(r.m, r.batch, &seq, &n, 1, 1, &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  std::uniform_real_distribution<float> dist(-4, 4);
  Written w(std::size_t{kLayers} * 2 * n * kHeads * kDim);
  for (float& x : w) x = dist(rng);
  const std::uint32_t rows[2] = {0, n};
  for (std::uint32_t l = 0; l < kLayers; ++l) {
    s = kvc_store_kv(r.batch, l, &w[at(l, 0, 0, 0, 0, n)], &w[at(l, 1, 0, 0, 0, n)], rows, nullptr,
                     nullptr, &err);
    EXPECT_EQ(s, KVC_OK) << describe(s, err);
  }
  s = kvc_step(r.m, &seq, &n, 1, tokens.data(), &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  return w;
}

// Tokens [0, upto) of seq (fetched for one new token) hold, bit for bit,
// what `w` (written for `total` tokens from position 0) says.
void expect_holds(Rig& r, std::uint64_t seq, const Written& w, std::uint32_t total,
                  std::uint32_t upto) {
  const std::uint32_t one = 1;
  kvc_error err{};
  kvc_status s = kvc_fetch(r.m, r.batch, &seq, &one, 1, 1, &err);
  ASSERT_EQ(s, KVC_OK) << describe(s, err);
  kvc_cache_desc d{};
  s = kvc_batch_describe(r.batch, &d, &err);
  ASSERT_EQ(s, KVC_OK) << describe(s, err);
  std::size_t differ = 0;
  for (std::uint32_t l = 0; l < kLayers; ++l)
    for (std::uint32_t kv = 0; kv < 2; ++kv)
      for (std::uint32_t t = 0; t < upto; ++t)
        for (std::uint32_t h = 0; h < kHeads; ++h)
          for (std::uint32_t e = 0; e < kDim; ++e) {
            const std::uint32_t block = d.lookup_table[t / d.page_size];
            const std::uint64_t off = l * d.layer_stride + kv * d.kv_stride +
                                      block * d.block_stride + (t % d.page_size) * d.token_stride +
                                      h * d.head_stride + e;
            const float* cache = static_cast<const float*>(d.blocks) + off;
            differ += std::memcmp(cache, &w[at(l, kv, t, h, e, total)], sizeof(float)) != 0;
          }
  EXPECT_EQ(differ, 0u) << "elements that differ from what was written";
}

// Writes prompt a (13 tokens: 3 full pages), releases it, then fills the
// 4-page pool with another request's 16 tokens so a's pages are evicted.
Written write_and_evict(Rig& r, const std::vector<std::uint32_t>& a, std::mt19937& rng) {
  kvc_error err{};
  const std::uint64_t s = claim(r);
  Written w = prefill(r, s, a, rng);
  EXPECT_EQ(kvc_release(r.m, s, KVC_REUSE_UNKNOWN, &err), KVC_OK) << err.message;
  const std::uint64_t other = claim(r);
  prefill(r, other, iota_tokens(16, 1000), rng);
  EXPECT_EQ(kvc_release(r.m, other, KVC_REUSE_UNKNOWN, &err), KVC_OK) << err.message;
  // Write-backs wait in staging for a batch (offload_batch): hand them over.
  EXPECT_EQ(kvc_wait_tiers(r.m, &err), KVC_OK) << err.message;
  EXPECT_EQ(kvc_check_invariants(r.m, &err), KVC_OK) << err.message;
  return w;
}

std::uint32_t cache_length(Rig& r, std::uint64_t seq) {
  std::uint32_t n = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_cache_length(r.m, seq, &n, &err), KVC_OK) << err.message;
  return n;
}

// Matches a on a fresh seq: 12 tokens, pending, and fetch / fork / truncate
// refused naming the seq without changing its length.
std::uint64_t match_pending(Rig& r, const std::vector<std::uint32_t>& a) {
  const std::uint64_t c = claim(r);
  std::uint32_t reused = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_match_prefix(r.m, c, a.data(), a.size(), 0, &reused, &err), KVC_OK) << err.message;
  EXPECT_EQ(reused, 12u);
  EXPECT_EQ(pending(r, c), 1);
  const std::string name = "seq " + std::to_string(c);
  const std::uint32_t one = 1;
  expect_status([&](kvc_error* e) { return kvc_fetch(r.m, r.batch, &c, &one, 1, 1, e); },
                KVC_INVALID_ARGUMENT, {name, "pending loads"});
  std::uint64_t child = 0;
  expect_status([&](kvc_error* e) { return kvc_fork(r.m, c, &child, e); }, KVC_INVALID_ARGUMENT,
                {name, "pending loads"});
  expect_status([&](kvc_error* e) { return kvc_truncate(r.m, c, 4, e); }, KVC_INVALID_ARGUMENT,
                {name, "pending loads"});
  EXPECT_EQ(cache_length(r, c), 12u) << "the refused calls changed nothing";
  EXPECT_EQ(pending(r, c), 1);
  return c;
}

std::vector<kvc_tier_figures> figures(Rig& r, std::uint32_t* pending_loads = nullptr) {
  std::uint32_t n = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_manager_tier_figures(r.m, nullptr, 0, &n, pending_loads, &err), KVC_OK);
  std::vector<kvc_tier_figures> f(n);
  EXPECT_EQ(kvc_manager_tier_figures(r.m, f.data(), n, &n, pending_loads, &err), KVC_OK)
      << err.message;
  return f;
}

kvc_tier* disk_tier(const kvc_params& p, const std::string& dir, std::int32_t io) {
  kvc_disk_tier_options o = kvc_disk_tier_options_default();
  o.io = io;
  o.slab_bytes = 1 << 20;
  kvc_tier* t = nullptr;
  kvc_error err{};
  const kvc_status s =
      kvc_disk_tier_create(&p, "model", "", dir.c_str(), KVC_TIER_UNLIMITED, &o, &t, &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  return t;
}

class CTierRoundTrip : public ::testing::TestWithParam<std::int32_t> {};

INSTANTIATE_TEST_SUITE_P(Arrangements, CTierRoundTrip,
                         ::testing::Values(KVC_ARRANGEMENT_INTERLEAVED, KVC_ARRANGEMENT_PER_LAYER),
                         arrangement_name);

TEST_P(CTierRoundTrip, HostTierWriteBackAndReloadByteExact) {
  const kvc_params p = tier_params(GetParam());
  kvc_tier* host = host_tier(p, /*synchronous=*/true);
  ASSERT_NE(host, nullptr);
  EXPECT_STREQ(kvc_tier_name(host), "host");
  Rig r({host}, 4, GetParam());
  kvc_tier_destroy(host);  // the manager keeps its own reference
  std::mt19937 rng(1);
  const auto a = iota_tokens(13, 7);
  const Written w = write_and_evict(r, a, rng);

  const std::uint64_t c = match_pending(r, a);
  std::uint32_t loading = 0;
  EXPECT_EQ(figures(r, &loading).size(), 1u);
  EXPECT_EQ(loading, 3u);
  std::vector<std::uint64_t> ready(4, 99);
  std::uint32_t n = 0;
  kvc_error err{};
  ASSERT_EQ(kvc_poll_loads(r.m, ready.data(), 4, &n, &err), KVC_OK) << err.message;
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(ready[0], c);
  EXPECT_EQ(pending(r, c), 0);
  EXPECT_EQ(cache_length(r, c), 12u);
  expect_holds(r, c, w, 13, 12);
  EXPECT_EQ(kvc_check_invariants(r.m, &err), KVC_OK) << err.message;

  const std::vector<kvc_tier_figures> f = figures(r, &loading);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_STREQ(f[0].name, "host");
  EXPECT_EQ(f[0].enabled, 1);
  EXPECT_EQ(f[0].pages_onboarded, 3u);
  EXPECT_EQ(f[0].pages_loaded, 3u);
  EXPECT_EQ(f[0].load_failures, 0u);
  EXPECT_GE(f[0].pages_offloaded, 3u);
  EXPECT_EQ(loading, 0u);
  EXPECT_EQ(count(r.events, KVC_PAGE_STORED, "host"), f[0].pages_offloaded);
  EXPECT_GE(count(r.events, KVC_PAGE_REMOVED, "device"), 3u);
  for (const Event& e : r.events) {
    EXPECT_TRUE(e.key_hi != 0 || e.key_lo != 0) << "with tiers every event carries its key";
  }
}

TEST(CTier, DiskTierWriteBackReloadAndRestart) {
  TempDir dir;
  const kvc_params p = tier_params();
  std::mt19937 rng(2);
  const auto a = iota_tokens(13, 7);
  Written w;
  {
    kvc_tier* disk = disk_tier(p, dir.path.string(), KVC_DISK_IO_AUTOMATIC);
    ASSERT_NE(disk, nullptr);
    EXPECT_STREQ(kvc_tier_name(disk), "disk");
    Rig r({disk}, 4);
    w = write_and_evict(r, a, rng);
    kvc_error err{};
    ASSERT_EQ(kvc_wait_tiers(r.m, &err), KVC_OK) << err.message;
    kvc_tier_stats st{};
    ASSERT_EQ(kvc_tier_stats_get(disk, &st, &err), KVC_OK) << err.message;
    EXPECT_GE(st.pages_stored, 3u);
    EXPECT_EQ(st.io_errors, 0u);
    EXPECT_EQ(st.capacity_bytes, KVC_TIER_UNLIMITED);

    const std::uint64_t c = match_pending(r, a);
    ASSERT_EQ(kvc_wait_loads(r.m, c, &err), KVC_OK) << err.message;
    EXPECT_EQ(pending(r, c), 0);
    expect_holds(r, c, w, 13, 12);
    EXPECT_EQ(count(r.events, KVC_PAGE_STORED, "disk"), st.pages_stored);

    // The directory is locked while this tier lives.
    kvc_tier* second = nullptr;
    expect_status(
        [&](kvc_error* e) {
          return kvc_disk_tier_create(&p, "model", "", dir.path.c_str(), KVC_TIER_UNLIMITED,
                                      nullptr, &second, e);
        },
        KVC_INVALID_ARGUMENT, {dir.path.string()});
    EXPECT_EQ(second, nullptr);
    ASSERT_EQ(kvc_wait_tiers(r.m, &err), KVC_OK) << err.message;
    kvc_tier_destroy(disk);
  }
  // A restart: a new tier on the directory finds the pages, a new manager loads them.
  kvc_tier* disk = disk_tier(p, dir.path.string(), KVC_DISK_IO_THREADS);
  ASSERT_NE(disk, nullptr);
  kvc_disk_tier_info info{};
  kvc_error err{};
  ASSERT_EQ(kvc_disk_tier_info_get(disk, &info, &err), KVC_OK) << err.message;
  EXPECT_EQ(info.fresh, 0);
  EXPECT_GE(info.pages_recovered, 3u);
  EXPECT_EQ(info.io, KVC_DISK_IO_THREADS);
  EXPECT_GT(info.slot_bytes, 0u);
  Rig r({disk}, 4);
  kvc_tier_destroy(disk);
  const std::uint64_t c = match_pending(r, a);
  ASSERT_EQ(kvc_wait_loads(r.m, c, &err), KVC_OK) << err.message;
  EXPECT_EQ(cache_length(r, c), 12u);
  expect_holds(r, c, w, 13, 12);
  const std::vector<kvc_tier_figures> f = figures(r);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_STREQ(f[0].name, "disk");
  EXPECT_EQ(f[0].pages_onboarded, 3u);
}

}  // namespace
