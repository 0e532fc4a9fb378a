// Tiers below a GPU pool (TierConfig::pool_apart, docs/tiers.md "A pool
// apart"): the manager on the host with a MemoryTier (tests/tier/
// memory_tier.h), the K/V written into a device pool by cuda::store_kv, and
// each batch's transfers made by cuda::apply_tier_transfers from a pinned
// host pool (HostRegistration). A's pages are evicted (device -> staging ->
// tier), A comes back into pages B's were evicted from (their offloads read
// before the loads land), then B comes back: the device bytes of every
// reloaded page equal those written, on both pool arrangements.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kvcache/cuda/host_registration.h"
#include "kvcache/cuda/tier_transfers.h"
#include "kvcache/kvcache.h"
#include "tier/memory_tier.h"

namespace kvcache::cuda::test {
namespace {

constexpr std::uint32_t kLayers = 2, kKvHeads = 2, kDim = 64, kPage = 16, kPages = 4;

using Bytes = std::vector<std::byte>;

class TierFlow : public ::testing::TestWithParam<PoolArrangement> {
 protected:
  void SetUp() override {
    params = bf16_paged_params(kLayers, kKvHeads, kDim, kPage);
    params.pool_arrangement = GetParam();
    params.enable_prefix_caching = true;
    tier = std::make_shared<kvcache::testing::MemoryTier>(TierFingerprint::of(params, "model"));
    PrefixCacheConfig config;
    config.tiers.tiers = {tier};
    config.tiers.model_id = "model";
    config.tiers.pool_apart = true;
    config.tiers.offload_batch = 1;  // each completion's write-backs go at once
    manager = std::make_unique<PagedKVCacheManager>(params, kPages, 4, 256, std::move(config));
    const std::size_t bytes = PagedKVCacheManager::estimated_memory_size(params, kPages);
    pool = DeviceBuffer<BFloat16>(bytes / sizeof(BFloat16));
    pool.fill_bytes(0xff);
  }

  // One step of `seq`: fetch room for n tokens, the batch's transfers, and
  // (with `tokens`) random K/V for them written into the device pool and
  // committed; returns the sequence's page table.
  std::vector<std::uint32_t> run_step(SeqId seq, const std::vector<std::uint32_t>& tokens,
                                      std::uint32_t n) {
    KVCacheBatch batch = manager->fetch(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{n});
    auto host = batch.paged<BFloat16>();
    if (pinned.empty()) {
      pinned = HostRegistration(host.desc().blocks,
                                PagedKVCacheManager::estimated_memory_size(params, kPages));
      const std::span<std::byte> staging = manager->tier_staging();
      pinned_staging = HostRegistration(staging.data(), staging.size());
    }
    apply_tier_transfers(host.desc(), pool.data(), batch);
    if (!tokens.empty()) {
      DeviceCollection<BFloat16> dev(host.desc(), pool.data());
      const std::vector<std::uint32_t> rows{0, n};
      const auto rows_d = DeviceBuffer<std::uint32_t>::from_host(rows);
      for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
        const auto k_d = DeviceBuffer<float>::from_host(
            kvcache::test::random_floats(std::size_t{n} * kKvHeads * kDim, -1.0f, 1.0f, rng));
        const auto v_d = DeviceBuffer<float>::from_host(
            kvcache::test::random_floats(std::size_t{n} * kKvHeads * kDim, -1.0f, 1.0f, rng));
        cuda::store_kv(dev.key(layer), dev.value(layer), k_d.span(), v_d.span(), rows_d.span());
      }
    }
    synchronize();  // the offloads' bytes are in their slots
    completed += manager->complete_offloads(batch);
    const auto table = batch.lookup_table();
    std::vector<std::uint32_t> pages(table.begin(), table.begin() + batch.lookup_stride());
    if (tokens.empty()) {
      manager->step(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{0},
                    std::vector<std::uint32_t>{});
    } else {
      manager->step(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{n}, tokens);
    }
    manager->check_invariants();
    return pages;
  }

  // The device bytes of `page`, packed [2][num_layers][block].
  Bytes device_page(std::uint32_t page) const {
    const std::vector<BFloat16> all = pool.to_host();
    const auto* base = reinterpret_cast<const std::byte*>(all.data());
    const std::size_t run = std::size_t{kPage} * kKvHeads * kDim * sizeof(BFloat16);
    const bool per_layer = params.pool_arrangement == PoolArrangement::per_layer;
    Bytes out(2 * kLayers * run);
    for (std::size_t kv = 0; kv < 2; ++kv)
      for (std::size_t l = 0; l < kLayers; ++l) {
        const std::size_t at = per_layer
                                   ? ((l * 2 + kv) * kPages + page) * run
                                   : (std::size_t{page} * 2 * kLayers + kv * kLayers + l) * run;
        std::memcpy(out.data() + (kv * kLayers + l) * run, base + at, run);
      }
    return out;
  }
  std::vector<Bytes> device_pages(const std::vector<std::uint32_t>& pages, std::size_t n) const {
    std::vector<Bytes> out;
    for (std::size_t j = 0; j < n; ++j) out.push_back(device_page(pages[j]));
    return out;
  }

  static std::vector<std::uint32_t> tokens_from(std::uint32_t n, std::uint32_t first) {
    std::vector<std::uint32_t> t(n);
    for (std::uint32_t i = 0; i < n; ++i) t[i] = first + i;
    return t;
  }

  KVCacheParams params;
  std::shared_ptr<kvcache::testing::MemoryTier> tier;
  std::unique_ptr<PagedKVCacheManager> manager;
  DeviceBuffer<BFloat16> pool;
  HostRegistration pinned;          // declared after the manager: unregistered before it goes
  HostRegistration pinned_staging;  // the write-back slots: the offloads are DMA too
  std::mt19937 rng{43};
  std::size_t completed = 0;
};

TEST_P(TierFlow, EvictedPagesComeBackIntoTheDevicePool) {
  const auto a = tokens_from(3 * kPage + 4, 7), b = tokens_from(4 * kPage, 5000);
  const SeqId sa = manager->claim(1)[0];
  const std::vector<Bytes> wrote_a =
      device_pages(run_step(sa, a, static_cast<std::uint32_t>(a.size())), 3);
  manager->release(sa);
  const SeqId sb = manager->claim(1)[0];
  const std::vector<Bytes> wrote_b =
      device_pages(run_step(sb, b, static_cast<std::uint32_t>(b.size())), 3);
  EXPECT_EQ(completed, 3u) << "A's published pages went down through their slots";
  EXPECT_EQ(tier->keys().size(), 3u);
  manager->release(sb);

  const SeqId c = manager->claim(1)[0];
  ASSERT_EQ(manager->match_prefix(c, a), 3 * kPage);
  manager->wait_loads(c);
  const std::vector<std::uint32_t> pages_c = run_step(c, {}, 1);
  EXPECT_EQ(completed, 3u + 4u) << "B's pages, the loads' destinations among them";
  EXPECT_TRUE(device_pages(pages_c, 3) == wrote_a) << "A's K/V back in the device pool";
  manager->release(c);

  const SeqId d = manager->claim(1)[0];
  ASSERT_EQ(manager->match_prefix(d, b), 3 * kPage);
  manager->wait_loads(d);
  const std::vector<std::uint32_t> pages_d = run_step(d, {}, 1);
  EXPECT_TRUE(device_pages(pages_d, 3) == wrote_b) << "B's K/V, saved before A's loads landed";
  const ManagerStats st = manager->stats();
  EXPECT_EQ(st.tiers[0].pages_onboarded, 6u);
  EXPECT_EQ(st.tiers[0].offload_dropped, 0u);
}

INSTANTIATE_TEST_SUITE_P(Arrangements, TierFlow,
                         ::testing::Values(PoolArrangement::interleaved,
                                           PoolArrangement::per_layer),
                         [](const auto& info) {
                           return std::string(arrangement_name(info.param));
                         });

// Two devices (two pools on this GPU play them): each device's shard goes
// down to its own tier and comes back into its own pool, byte-exact.
TEST(TierFlowShards, EveryDevicesPagesComeBack) {
  constexpr std::uint32_t kDevices = 2;
  KVCacheParams p = bf16_paged_params(kLayers, kKvHeads * kDevices, kDim, kPage);
  p.n_devices = kDevices;
  p.enable_prefix_caching = true;
  PrefixCacheConfig config;
  config.tiers.model_id = "model";
  config.tiers.pool_apart = true;
  for (std::uint32_t d = 0; d < kDevices; ++d) {
    config.tiers.tiers.push_back(
        std::make_shared<kvcache::testing::MemoryTier>(config.tiers.fingerprint(p, d)));
  }
  PagedKVCacheManager m(p, kPages, 4, 256, config);
  const std::size_t bytes = PagedKVCacheManager::estimated_memory_size(p, kPages) / kDevices;
  std::vector<DeviceBuffer<BFloat16>> pools;
  for (std::uint32_t d = 0; d < kDevices; ++d) {
    pools.emplace_back(bytes / sizeof(BFloat16));
    pools.back().fill_bytes(0xff);
  }
  std::mt19937 rng(44);
  auto step = [&](SeqId seq, const std::vector<std::uint32_t>& tokens, std::uint32_t n) {
    KVCacheBatch batch = m.fetch(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{n});
    for (std::uint32_t d = 0; d < kDevices; ++d) {
      auto host = batch.paged<BFloat16>(d);
      apply_tier_transfers(host.desc(), pools[d].data(), batch, nullptr, d);
      if (tokens.empty()) continue;
      DeviceCollection<BFloat16> dev(host.desc(), pools[d].data());
      const auto rows_d = DeviceBuffer<std::uint32_t>::from_host(std::vector<std::uint32_t>{0, n});
      for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
        const auto k_d = DeviceBuffer<float>::from_host(
            kvcache::test::random_floats(std::size_t{n} * kKvHeads * kDim, -1.0f, 1.0f, rng));
        const auto v_d = DeviceBuffer<float>::from_host(
            kvcache::test::random_floats(std::size_t{n} * kKvHeads * kDim, -1.0f, 1.0f, rng));
        cuda::store_kv(dev.key(layer), dev.value(layer), k_d.span(), v_d.span(), rows_d.span());
      }
    }
    synchronize();
    m.complete_offloads(batch);
    const auto table = batch.lookup_table();
    std::vector<std::uint32_t> pages(table.begin(), table.begin() + 3);
    m.step(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{tokens.empty() ? 0 : n}, tokens);
    return pages;
  };
  // Interleaved pools: a page is one contiguous run of page_bytes.
  const std::size_t page_bytes = bytes / kPages;
  auto device_pages = [&](const std::vector<std::uint32_t>& pages) {
    std::vector<Bytes> out;
    for (std::uint32_t d = 0; d < kDevices; ++d) {
      const std::vector<BFloat16> all = pools[d].to_host();
      const auto* base = reinterpret_cast<const std::byte*>(all.data());
      for (std::uint32_t page : pages)
        out.emplace_back(base + page * page_bytes, base + (page + 1) * page_bytes);
    }
    return out;
  };
  std::vector<std::uint32_t> a(3 * kPage + 4), b(4 * kPage);
  for (std::uint32_t i = 0; i < a.size(); ++i) a[i] = 7 + i;
  for (std::uint32_t i = 0; i < b.size(); ++i) b[i] = 5000 + i;
  const SeqId sa = m.claim(1)[0];
  const std::vector<Bytes> wrote = device_pages(step(sa, a, static_cast<std::uint32_t>(a.size())));
  m.release(sa);
  const SeqId sb = m.claim(1)[0];
  step(sb, b, static_cast<std::uint32_t>(b.size()));
  m.release(sb);
  const SeqId c = m.claim(1)[0];
  ASSERT_EQ(m.match_prefix(c, a), 3 * kPage);
  m.wait_loads(c);
  EXPECT_TRUE(device_pages(step(c, {}, 1)) == wrote) << "every device's K/V back in its pool";
  m.check_invariants();
}

TEST(TierTransfers, RefusedArgumentsEnqueueNothing) {
  EXPECT_THROW(HostRegistration(nullptr, 64), InvalidArgument);
  std::vector<std::byte> host(1 << 16);
  EXPECT_THROW(HostRegistration(host.data(), 0), InvalidArgument);
  HostRegistration first(host.data(), host.size());
  EXPECT_THROW(HostRegistration(host.data(), host.size()), DeviceError) << "registered already";
  HostRegistration moved = std::move(first);
  EXPECT_TRUE(first.empty());
  EXPECT_EQ(moved.bytes(), host.size());

  // A batch with transfers, and a pool that is host memory or of another dtype.
  KVCacheParams p = bf16_paged_params(kLayers, kKvHeads, kDim, kPage);
  p.enable_prefix_caching = true;
  PrefixCacheConfig config;
  config.tiers.tiers = {std::make_shared<kvcache::testing::MemoryTier>(TierFingerprint::of(p))};
  config.tiers.pool_apart = true;
  config.tiers.offload_batch = 1;
  PagedKVCacheManager m(p, 2, 2, 64, std::move(config));
  const SeqId s = m.claim(1)[0];
  const auto toks = std::vector<std::uint32_t>(kPage + 1, 3);
  (void)m.fetch(std::vector<SeqId>{s}, std::vector<std::uint32_t>{kPage + 1});
  m.step(std::vector<SeqId>{s}, std::vector<std::uint32_t>{kPage + 1}, toks);
  m.release(s);
  const SeqId t = m.claim(1)[0];
  const KVCacheBatch batch = m.fetch(std::vector<SeqId>{t}, std::vector<std::uint32_t>{2 * kPage});
  ASSERT_EQ(batch.block_offloads().size(), 1u);
  const CacheDesc desc = batch.desc();
  std::vector<BFloat16> on_host(desc.pool_elements());
  EXPECT_THROW(apply_tier_transfers(desc, on_host.data(), batch), InvalidArgument);
  DeviceBuffer<float> wrong(desc.pool_elements());
  EXPECT_THROW(apply_tier_transfers(desc, wrong.data(), batch), InvalidArgument);
  DeviceBuffer<BFloat16> right(desc.pool_elements());
  EXPECT_THROW(apply_tier_transfers(desc, right.data(), batch, nullptr, 1), InvalidArgument)
      << "device 1 of a one-device batch";
  EXPECT_EQ(m.complete_offloads(batch), 1u);
}

}  // namespace
}  // namespace kvcache::cuda::test
