// The C interface's tiers below a manager of several devices
// (kvc_params.n_devices, kvc_host_tier_options.device_index,
// kvc_prefix_config.first_shard / shard_count, kvc_tier_figures.device,
// kvc_batch_describe_device; docs/tiers.md "Several devices"): a 2-device
// manager with a host tier per device writes every device's random K/V
// back and loads it again byte for byte; a tier opened for the wrong device
// is refused naming it; a rank manager (one device, shard 1 of 2) loads
// device 1's bytes from the group's tier and from a disk directory the
// group wrote.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "c_api/c_tier_rig.h"
#include "kvcache/c_api.h"
#include "tier/tier_test_util.h"

namespace {

using c_tier_test::describe;
using c_tier_test::expect_status;
using kvcache::tier_test::TempDir;

constexpr std::uint32_t kLayers = 2;
constexpr std::uint32_t kHeads = 4;  // over every device
constexpr std::uint32_t kDim = 4;
constexpr std::uint32_t kPage = 4;
constexpr std::uint32_t kDevices = 2;

kvc_params params_of(std::uint32_t n_devices, std::uint32_t heads) {
  kvc_params p{};
  p.dtype = KVC_DTYPE_F32;
  p.num_layers = kLayers;
  p.n_kv_heads = heads;
  p.head_dim = kDim;
  p.strategy = KVC_STRATEGY_PAGED;
  p.page_size = kPage;
  p.enable_prefix_caching = 1;
  p.n_devices = n_devices;
  return p;
}
kvc_params group_params() { return params_of(kDevices, kHeads); }
kvc_params rank_params() { return params_of(1, kHeads / kDevices); }

// A synchronous host tier holding device `device` (first_shard / shard_count
// as a rank names its shards).
kvc_tier* host_tier(const kvc_params& p, std::uint32_t device, std::uint32_t first_shard = 0,
                    std::uint32_t shard_count = 0) {
  kvc_host_tier_options o = kvc_host_tier_options_default();
  o.synchronous = 1;
  o.device_index = device;
  o.first_shard = first_shard;
  o.shard_count = shard_count;
  kvc_tier* t = nullptr;
  kvc_error err{};
  const kvc_status s = kvc_host_tier_create(&p, "model", nullptr, 64 << 10, &o, &t, &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  return t;
}

kvc_tier* disk_tier(const kvc_params& p, const std::string& dir, std::uint32_t device,
                    std::uint32_t first_shard = 0, std::uint32_t shard_count = 0) {
  kvc_disk_tier_options o = kvc_disk_tier_options_default();
  o.io = KVC_DISK_IO_THREADS;
  o.direct_io = 0;
  o.durable = 0;
  o.slab_bytes = 1 << 20;
  o.device_index = device;
  o.first_shard = first_shard;
  o.shard_count = shard_count;
  kvc_tier* t = nullptr;
  kvc_error err{};
  const kvc_status s =
      kvc_disk_tier_create(&p, "model", nullptr, dir.c_str(), KVC_TIER_UNLIMITED, &o, &t, &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  return t;
}

// A manager of 4 pages over `tiers` (and its batch).
struct Manager {
  Manager(const kvc_params& p, std::vector<kvc_tier*> tiers, std::uint32_t first_shard = 0,
          std::uint32_t shard_count = 0, std::int32_t pool_apart = 0)
      : params(p) {
    kvc_prefix_config c = kvc_prefix_config_default();
    c.pool_apart = pool_apart;
    c.tiers = tiers.data();
    c.n_tiers = static_cast<std::uint32_t>(tiers.size());
    c.model_id = "model";
    c.first_shard = first_shard;
    c.shard_count = shard_count;
    kvc_error err{};
    const kvc_status s = kvc_manager_create_prefix(&params, 4, 4, 64, &c, &m, &err);
    EXPECT_EQ(s, KVC_OK) << describe(s, err);
    EXPECT_EQ(kvc_batch_create(&batch, &err), KVC_OK);
  }
  ~Manager() {
    kvc_batch_destroy(batch);
    kvc_manager_destroy(m);
  }
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  std::uint32_t heads() const { return params.n_kv_heads / params.n_devices; }

  std::uint64_t claim() {
    std::uint64_t seq = 0;
    kvc_error err{};
    EXPECT_EQ(kvc_claim(m, 1, &seq, &err), KVC_OK) << err.message;
    return seq;
  }

  // Element (layer, kv, token t, head h, dim e) of device `device` in the
  // last fetched batch, whose only entry is the sequence.
  float* element(std::uint32_t device, std::uint32_t l, std::uint32_t kv, std::uint32_t t,
                 std::uint32_t h, std::uint32_t e) const {
    kvc_cache_desc d{};
    kvc_error err{};
    EXPECT_EQ(kvc_batch_describe_device(batch, device, &d, &err), KVC_OK) << err.message;
    EXPECT_EQ(d.n_kv_heads, heads());
    const std::uint32_t block = d.lookup_table[t / d.page_size];
    return static_cast<float*>(d.blocks) + l * d.layer_stride + kv * d.kv_stride +
           block * d.block_stride + (t % d.page_size) * d.token_stride + h * d.head_stride + e;
  }

  kvc_params params;
  kvc_manager* m = nullptr;
  kvc_batch* batch = nullptr;
};

// What one device holds of a sequence's tokens: [layer][kv][token][head][dim].
using Written = std::vector<float>;

std::size_t at(std::uint32_t l, std::uint32_t kv, std::uint32_t t, std::uint32_t h, std::uint32_t e,
               std::uint32_t tokens, std::uint32_t heads) {
  return (((std::size_t{l} * 2 + kv) * tokens + t) * heads + h) * kDim + e;
}

// Fetches room for `tokens` on a fresh sequence, writes random K and V into
// every device's pool, commits them; returns each device's values.
std::vector<Written> prefill(Manager& m, std::uint64_t seq,
                             const std::vector<std::uint32_t>& tokens, std::mt19937& rng) {
  const auto n = static_cast<std::uint32_t>(tokens.size());
  kvc_error err{};
  kvc_status s = kvc_fetch(m.m, m.batch, &seq, &n, 1, 1, &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  std::uniform_real_distribution<float> dist(-4, 4);
  const std::uint32_t heads = m.heads();
  std::vector<Written> w(m.params.n_devices, Written(std::size_t{kLayers} * 2 * n * heads * kDim));
  for (std::uint32_t d = 0; d < m.params.n_devices; ++d)
    for (std::uint32_t l = 0; l < kLayers; ++l)
      for (std::uint32_t kv = 0; kv < 2; ++kv)
        for (std::uint32_t t = 0; t < n; ++t)
          for (std::uint32_t h = 0; h < heads; ++h)
            for (std::uint32_t e = 0; e < kDim; ++e) {
              const float x = dist(rng);
              w[d][at(l, kv, t, h, e, n, heads)] = x;
              *m.element(d, l, kv, t, h, e) = x;
            }
  s = kvc_step(m.m, &seq, &n, 1, tokens.data(), &err);
  EXPECT_EQ(s, KVC_OK) << describe(s, err);
  return w;
}

std::vector<std::uint32_t> iota_tokens(std::uint32_t n, std::uint32_t from) {
  std::vector<std::uint32_t> t(n);
  for (std::uint32_t i = 0; i < n; ++i) t[i] = from + i;
  return t;
}

// Writes prompt a, releases it, then fills the 4-page pool with another
// request so a's pages are evicted and written back.
std::vector<Written> write_and_evict(Manager& m, const std::vector<std::uint32_t>& a,
                                     std::mt19937& rng) {
  kvc_error err{};
  const std::uint64_t s = m.claim();
  std::vector<Written> w = prefill(m, s, a, rng);
  EXPECT_EQ(kvc_release(m.m, s, KVC_REUSE_UNKNOWN, &err), KVC_OK) << err.message;
  const std::uint64_t other = m.claim();
  prefill(m, other, iota_tokens(16, 1000), rng);
  EXPECT_EQ(kvc_release(m.m, other, KVC_REUSE_UNKNOWN, &err), KVC_OK) << err.message;
  EXPECT_EQ(kvc_wait_tiers(m.m, &err), KVC_OK) << err.message;
  return w;
}

// Matches a (13 tokens: 3 full pages, all in the tiers) on a fresh sequence,
// waits for the loads, then expects device `device` of it to hold, bit for
// bit, what `w` (written for 13 tokens, `heads` heads) holds.
void expect_loaded(Manager& m, const std::vector<std::uint32_t>& a, const std::vector<Written>& w) {
  const std::uint64_t c = m.claim();
  std::uint32_t reused = 0;
  kvc_error err{};
  ASSERT_EQ(kvc_match_prefix(m.m, c, a.data(), a.size(), 0, &reused, &err), KVC_OK) << err.message;
  ASSERT_EQ(reused, 12u) << "three pages loaded from the tiers";
  ASSERT_EQ(kvc_wait_loads(m.m, c, &err), KVC_OK) << err.message;
  const std::uint32_t one = 1;
  ASSERT_EQ(kvc_fetch(m.m, m.batch, &c, &one, 1, 1, &err), KVC_OK) << err.message;
  const std::uint32_t heads = m.heads();
  for (std::uint32_t d = 0; d < m.params.n_devices; ++d) {
    std::size_t differ = 0;
    for (std::uint32_t l = 0; l < kLayers; ++l)
      for (std::uint32_t kv = 0; kv < 2; ++kv)
        for (std::uint32_t t = 0; t < reused; ++t)
          for (std::uint32_t h = 0; h < heads; ++h)
            for (std::uint32_t e = 0; e < kDim; ++e)
              differ += std::memcmp(m.element(d, l, kv, t, h, e),
                                    &w[d][at(l, kv, t, h, e, 13, heads)], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "elements of device " << d << " that differ from what was written";
  }
}

std::vector<kvc_tier_figures> figures(const Manager& m) {
  std::uint32_t n = 0;
  kvc_error err{};
  EXPECT_EQ(kvc_manager_tier_figures(m.m, nullptr, 0, &n, nullptr, &err), KVC_OK);
  std::vector<kvc_tier_figures> f(n);
  EXPECT_EQ(kvc_manager_tier_figures(m.m, f.data(), n, &n, nullptr, &err), KVC_OK) << err.message;
  return f;
}

TEST(CTiersDevices, TwoDevicesWriteBackAndReloadEveryDevicesBytes) {
  const kvc_params p = group_params();
  kvc_tier* h0 = host_tier(p, 0);
  kvc_tier* h1 = host_tier(p, 1);
  Manager m(p, {h0, h1});
  kvc_tier_destroy(h0);  // the manager keeps its own references
  kvc_tier_destroy(h1);
  std::mt19937 rng(43);
  const std::vector<std::uint32_t> a = iota_tokens(13, 1);
  const std::vector<Written> w = write_and_evict(m, a, rng);
  ASSERT_NE(w[0], w[1]) << "the devices hold different bytes";
  expect_loaded(m, a, w);
  const std::vector<kvc_tier_figures> f = figures(m);
  ASSERT_EQ(f.size(), 2u);
  for (std::uint32_t d = 0; d < kDevices; ++d) {
    EXPECT_STREQ(f[d].name, "host");
    EXPECT_EQ(f[d].device, d);
    EXPECT_EQ(f[d].pages_offloaded, 3u) << "device " << d;
    EXPECT_EQ(f[d].pages_onboarded, 3u) << "device " << d;
  }
  kvc_error err{};
  EXPECT_EQ(kvc_check_invariants(m.m, &err), KVC_OK) << err.message;
}

TEST(CTiersDevices, ATierOfTheWrongDeviceIsRefusedNamingIt) {
  const kvc_params p = group_params();
  kvc_tier* h0 = host_tier(p, 0);
  kvc_tier* h1 = host_tier(p, 1);
  kvc_prefix_config c = kvc_prefix_config_default();
  kvc_tier* swapped[2] = {h1, h0};
  c.tiers = swapped;
  c.n_tiers = 2;
  c.model_id = "model";
  kvc_manager* m = nullptr;
  expect_status([&](kvc_error* e) { return kvc_manager_create_prefix(&p, 4, 4, 64, &c, &m, e); },
                KVC_INVALID_ARGUMENT, {"tiers[0]", "device 0", "device_index is 1"});
  EXPECT_EQ(m, nullptr);
  c.n_tiers = 1;  // one tier for two devices
  expect_status([&](kvc_error* e) { return kvc_manager_create_prefix(&p, 4, 4, 64, &c, &m, e); },
                KVC_INVALID_ARGUMENT, {"1 given for 2 devices"});
  kvc_tier_destroy(h0);
  kvc_tier_destroy(h1);

  kvc_host_tier_options o = kvc_host_tier_options_default();
  o.device_index = 2;
  kvc_tier* t = nullptr;
  expect_status(
      [&](kvc_error* e) { return kvc_host_tier_create(&p, "model", nullptr, 1 << 16, &o, &t, e); },
      KVC_INVALID_ARGUMENT, {"device_index 2", "2 devices"});
  kvc_disk_tier_options d = kvc_disk_tier_options_default();
  d.device_index = 5;
  TempDir dir;
  expect_status(
      [&](kvc_error* e) {
        return kvc_disk_tier_create(&p, "model", nullptr, dir.path.c_str(), 1 << 20, &d, &t, e);
      },
      KVC_INVALID_ARGUMENT, {"device_index 5", "2 devices"});
  o.device_index = 0;
  o.first_shard = 1;  // without shard_count
  expect_status(
      [&](kvc_error* e) { return kvc_host_tier_create(&p, "model", nullptr, 1 << 16, &o, &t, e); },
      KVC_INVALID_ARGUMENT, {"first_shard is 1", "shard_count is 0"});
  o.shard_count = 2;  // shards [1, 3) of 2
  expect_status(
      [&](kvc_error* e) { return kvc_host_tier_create(&p, "model", nullptr, 1 << 16, &o, &t, e); },
      KVC_INVALID_ARGUMENT, {"shards [1, 3)", "shard_count 2"});
  EXPECT_EQ(t, nullptr);
}

TEST(CTiersDevices, DescribeDeviceAndKernelsRefuseWhatTheyCannotServe) {
  const kvc_params p = group_params();
  kvc_tier* h0 = host_tier(p, 0);
  kvc_tier* h1 = host_tier(p, 1);
  Manager m(p, {h0, h1});
  kvc_tier_destroy(h0);
  kvc_tier_destroy(h1);
  const std::uint64_t seq = m.claim();
  const std::uint32_t n = 2;
  kvc_error err{};
  ASSERT_EQ(kvc_fetch(m.m, m.batch, &seq, &n, 1, 1, &err), KVC_OK) << err.message;
  kvc_cache_desc d0{}, d1{};
  ASSERT_EQ(kvc_batch_describe(m.batch, &d0, &err), KVC_OK) << err.message;
  ASSERT_EQ(kvc_batch_describe_device(m.batch, 1, &d1, &err), KVC_OK) << err.message;
  EXPECT_NE(d0.blocks, d1.blocks) << "each device has a pool of its own";
  EXPECT_EQ(d0.n_kv_heads, kHeads / kDevices);
  kvc_cache_desc d{};
  expect_status([&](kvc_error* e) { return kvc_batch_describe_device(m.batch, 2, &d, e); },
                KVC_INVALID_ARGUMENT, {"device 2", "2 devices"});
  const std::vector<float> k(std::size_t{n} * kHeads * kDim);
  const std::uint32_t rows[2] = {0, n};
  expect_status(
      [&](kvc_error* e) {
        return kvc_store_kv(m.batch, 0, k.data(), k.data(), rows, nullptr, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"kvc_store_kv", "2 devices"});
}

TEST(CTiersDevices, APoolApartListsEachEvictedPageOncePerDevice) {
  const kvc_params p = group_params();
  kvc_tier* h0 = host_tier(p, 0);
  kvc_tier* h1 = host_tier(p, 1);
  Manager m(p, {h0, h1}, 0, 0, 1);
  kvc_tier_destroy(h0);
  kvc_tier_destroy(h1);
  std::mt19937 rng(3);
  kvc_error err{};
  const std::uint64_t s = m.claim();
  prefill(m, s, iota_tokens(8, 1), rng);  // two full pages, published
  ASSERT_EQ(kvc_release(m.m, s, KVC_REUSE_UNKNOWN, &err), KVC_OK) << err.message;
  const std::uint64_t other = m.claim();
  const std::uint32_t n = 16;  // the whole pool: both pages evicted
  ASSERT_EQ(kvc_fetch(m.m, m.batch, &other, &n, 1, 1, &err), KVC_OK) << err.message;
  const kvc_block_offload* o = nullptr;
  std::uint32_t count = 0;
  ASSERT_EQ(kvc_batch_block_offloads(m.batch, &o, &count, &err), KVC_OK) << err.message;
  ASSERT_EQ(count, 4u) << "two pages, once per device";
  std::uint32_t per_device[kDevices] = {};
  for (std::uint32_t i = 0; i < count; ++i) {
    ASSERT_LT(o[i].device, kDevices);
    ++per_device[o[i].device];
    EXPECT_EQ(o[i].size, std::size_t{2} * kLayers * kPage * (kHeads / kDevices) * kDim * 4)
        << "one device's page";
  }
  EXPECT_EQ(per_device[0], 2u);
  EXPECT_EQ(per_device[1], 2u);
  std::uint32_t completed = 0;
  EXPECT_EQ(kvc_complete_offloads(m.m, m.batch, &completed, &err), KVC_OK) << err.message;
}

TEST(CTiersDevices, ARankLoadsDeviceOnesBytesFromTheGroupsTier) {
  const kvc_params p = group_params();
  kvc_tier* h0 = host_tier(p, 0);
  kvc_tier* h1 = host_tier(p, 1);
  std::mt19937 rng(7);
  const std::vector<std::uint32_t> a = iota_tokens(13, 1);
  std::vector<Written> w;
  {
    Manager group(p, {h0, h1});
    w = write_and_evict(group, a, rng);
  }
  const kvc_params r = rank_params();
  // The group's device-1 tier serves the rank that is shard 1 of 2 ...
  Manager rank(r, {h1}, 1, 2);
  expect_loaded(rank, a, {w[1]});
  EXPECT_EQ(figures(rank).at(0).device, 0u) << "the rank's device 0";
  // ... and is refused by one that says it is shard 0.
  kvc_prefix_config c = kvc_prefix_config_default();
  c.tiers = &h1;
  c.n_tiers = 1;
  c.model_id = "model";
  c.shard_count = 2;
  kvc_manager* m = nullptr;
  expect_status([&](kvc_error* e) { return kvc_manager_create_prefix(&r, 4, 4, 64, &c, &m, e); },
                KVC_INVALID_ARGUMENT, {"device_index is 1 but this manager's is 0"});
  c.first_shard = 2;  // shards [2, 3) of 2
  expect_status([&](kvc_error* e) { return kvc_manager_create_prefix(&r, 4, 4, 64, &c, &m, e); },
                KVC_INVALID_ARGUMENT, {"shards [2, 3)", "shard_count 2"});
  kvc_tier_destroy(h0);
  kvc_tier_destroy(h1);
}

TEST(CTiersDevices, ARankOpensTheDiskDirectoryTheGroupWroteForItsShard) {
  TempDir dir0;
  TempDir dir1;
  const kvc_params p = group_params();
  std::mt19937 rng(11);
  const std::vector<std::uint32_t> a = iota_tokens(13, 1);
  std::vector<Written> w;
  {
    kvc_tier* d0 = disk_tier(p, dir0.path.string(), 0);
    kvc_tier* d1 = disk_tier(p, dir1.path.string(), 1);
    Manager group(p, {d0, d1});
    kvc_tier_destroy(d0);
    kvc_tier_destroy(d1);
    w = write_and_evict(group, a, rng);
  }  // the group's process ends: its tiers close
  const kvc_params r = rank_params();
  kvc_tier* t = disk_tier(r, dir1.path.string(), 0, 1, 2);  // this rank is shard 1 of 2
  kvc_disk_tier_info info{};
  kvc_error err{};
  ASSERT_EQ(kvc_disk_tier_info_get(t, &info, &err), KVC_OK) << err.message;
  EXPECT_EQ(info.fresh, 0) << "the same fingerprint as the group's device 1";
  EXPECT_EQ(info.pages_recovered, 3u);
  {
    Manager rank(r, {t}, 1, 2);
    expect_loaded(rank, a, {w[1]});
  }
  kvc_tier_destroy(t);
}

}  // namespace
