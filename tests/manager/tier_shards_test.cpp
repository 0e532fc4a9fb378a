// Tiers below a manager of several devices (TierConfig: a tier per device
// shard at every level, level-major): each device's K/V written back to its
// own tier and loaded back byte-exact, a shard one tier lacks ending the hit,
// per-shard fingerprints refused, one-device rank managers sharing the
// shards' tiers, the metrics' device label, and a pool apart's offloads per
// device. The tier is tests/tier/memory_tier.h.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <tuple>

#include "kvcache/kernels/attention.h"
#include "kvcache/metrics.h"
#include "kvcache/paged_manager.h"
#include "manager/tier_test_util.h"
#include "tier/memory_tier.h"

namespace kvcache {
namespace {

using testing::MemoryTier;

KVCacheParams shard_params(std::uint32_t devices, PoolArrangement arrangement) {
  return testing::tier_test_params(arrangement, /*num_layers=*/2, /*n_kv_heads=*/4, devices);
}

// One MemoryTier per device for each level name, level-major.
std::vector<std::shared_ptr<MemoryTier>> make_tiers(const KVCacheParams& p, const TierConfig& cfg,
                                                    const std::vector<std::string>& levels,
                                                    bool synchronous = true) {
  std::vector<std::shared_ptr<MemoryTier>> out;
  for (const std::string& name : levels)
    for (std::uint32_t d = 0; d < p.n_devices; ++d)
      out.push_back(std::make_shared<MemoryTier>(
          cfg.fingerprint(p, d), MemoryTier::Options{.name = name, .synchronous = synchronous}));
  return out;
}

TierConfig model_config() {
  TierConfig c;
  c.model_id = "model";
  return c;
}

struct Rig {
  Rig(const KVCacheParams& p, std::vector<std::shared_ptr<MemoryTier>> shard_tiers,
      TierConfig cfg = {}, std::uint32_t pages = 4)
      : params(p), tiers(std::move(shard_tiers)) {
    PrefixCacheConfig config;
    config.on_event = [this](const PageEvent& e) {
      events.emplace_back(e.kind, std::string(e.medium), e.key);
    };
    config.tiers = std::move(cfg);
    config.tiers.tiers.assign(tiers.begin(), tiers.end());
    config.tiers.offload_batch = 1;  // each call's write-backs go at once
    m = std::make_unique<PagedKVCacheManager>(params, pages, 4, 64, std::move(config));
  }
  std::size_t count(PageEvent::Kind kind, std::string_view medium) const {
    std::size_t n = 0;
    for (const auto& [k, med, key] : events) n += k == kind && med == medium;
    return n;
  }
  KVCacheParams params;
  std::vector<std::shared_ptr<MemoryTier>> tiers;
  std::vector<std::tuple<PageEvent::Kind, std::string, PageKey>> events;
  std::unique_ptr<PagedKVCacheManager> m;
};

// K and V each device was written with: [device][layer][kv][token][head][dim]
// (heads of that device).
using Written = std::vector<std::vector<float>>;

std::size_t at(const KVCacheParams& p, std::uint32_t layer, std::uint32_t kv, std::uint32_t tok,
               std::uint32_t head, std::uint32_t d, std::uint32_t tokens) {
  return (((std::size_t{layer} * 2 + kv) * tokens + tok) * p.n_kv_heads_per_device() + head) *
             p.head_dim +
         d;
}

// Fetches room for tokens, writes random K/V on every device, commits.
Written prefill(PagedKVCacheManager& m, SeqId seq, const std::vector<std::uint32_t>& tokens,
                std::mt19937& rng) {
  const KVCacheParams& p = m.params();
  const auto n = static_cast<std::uint32_t>(tokens.size());
  const KVCacheBatch batch = m.fetch(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{n});
  std::uniform_real_distribution<float> dist(-4, 4);
  const std::size_t per = std::size_t{n} * p.n_kv_heads_per_device() * p.head_dim;
  const std::vector<std::uint32_t> rows{0, n};
  Written w(p.n_devices);
  for (std::uint32_t dev = 0; dev < p.n_devices; ++dev) {
    w[dev].resize(per * 2 * p.num_layers);
    for (float& x : w[dev]) x = dist(rng);
    const auto col = batch.paged<float>(dev);
    for (std::uint32_t l = 0; l < p.num_layers; ++l) {
      store_kv(col.get_key_cache(l), col.get_value_cache(l),
               std::span<const float>(w[dev]).subspan(at(p, l, 0, 0, 0, 0, n), per),
               std::span<const float>(w[dev]).subspan(at(p, l, 1, 0, 0, 0, n), per), rows);
    }
  }
  m.step(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{n}, tokens);
  return w;
}

// Elements of tokens [0, upto) of seq on device `dev` that differ from w[dev]
// (written for `total` tokens from position 0).
std::size_t differ(PagedKVCacheManager& m, SeqId seq, std::uint32_t dev, const Written& w,
                   std::uint32_t total, std::uint32_t upto) {
  const KVCacheParams& p = m.params();
  const KVCacheBatch batch = m.fetch(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{0});
  const auto col = batch.paged<float>(dev);
  std::size_t n = 0;
  for (std::uint32_t l = 0; l < p.num_layers; ++l)
    for (std::uint32_t kv = 0; kv < 2; ++kv) {
      const auto cache = kv == 0 ? col.get_key_cache(l) : col.get_value_cache(l);
      for (std::uint32_t t = 0; t < upto; ++t)
        for (std::uint32_t h = 0; h < p.n_kv_heads_per_device(); ++h)
          for (std::uint32_t d = 0; d < p.head_dim; ++d)
            n += *cache.ptr(0, h, t, d) != w[dev][at(p, l, kv, t, h, d, total)];
    }
  return n;
}

using testing::iota_tokens;

// Writes prompt a (3 full pages and a token), releases it, and fills the
// 4-page pool with another request so a's pages are evicted (written back).
Written write_and_evict(Rig& r, const std::vector<std::uint32_t>& a, std::mt19937& rng) {
  const SeqId s = r.m->claim(1)[0];
  Written w = prefill(*r.m, s, a, rng);
  r.m->release(s);
  const SeqId other = r.m->claim(1)[0];
  prefill(*r.m, other, iota_tokens(16, 1000), rng);
  r.m->release(other);
  r.m->check_invariants();
  return w;
}

using Shape = std::tuple<std::uint32_t, PoolArrangement>;

class TierShards : public ::testing::TestWithParam<Shape> {
 protected:
  KVCacheParams params() const {
    return shard_params(std::get<0>(GetParam()), std::get<1>(GetParam()));
  }
};

INSTANTIATE_TEST_SUITE_P(Devices, TierShards,
                         ::testing::Combine(::testing::Values(2u, 4u),
                                            ::testing::Values(PoolArrangement::interleaved,
                                                              PoolArrangement::per_layer)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "_devices_" +
                                  std::string(arrangement_name(std::get<1>(info.param)));
                         });

TEST_P(TierShards, EveryDeviceComesBackByteExact) {
  const KVCacheParams p = params();
  const TierConfig cfg = model_config();
  Rig r(p, make_tiers(p, cfg, {"host"}), cfg);
  std::mt19937 rng(11);
  const auto a = iota_tokens(13, 7);
  const Written w = write_and_evict(r, a, rng);
  // Each shard's tier holds a's 3 pages (and the other's, evicted by a's
  // reload below) under keys of its own.
  for (std::uint32_t d = 0; d < p.n_devices; ++d) {
    EXPECT_EQ(r.tiers[d]->keys().size(), 3u) << "device " << d;
    if (d > 0) {
      for (const PageKey& k : r.tiers[d]->keys())
        EXPECT_FALSE(r.tiers[0]->contains(std::span(&k, 1))[0]) << "shards share no key";
    }
  }
  EXPECT_EQ(r.count(PageEvent::Kind::stored, "host"), 3u) << "one event a page, not a shard";

  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 12u);
  EXPECT_TRUE(r.m->has_pending_loads(c));
  EXPECT_EQ(r.m->poll_loads(), std::vector<SeqId>{c});
  r.m->check_invariants();
  for (std::uint32_t d = 0; d < p.n_devices; ++d)
    EXPECT_EQ(differ(*r.m, c, d, w, 13, 12), 0u) << "device " << d;

  const ManagerStats st = r.m->stats();
  ASSERT_EQ(st.tiers.size(), p.n_devices);
  for (std::uint32_t d = 0; d < p.n_devices; ++d) {
    EXPECT_EQ(st.tiers[d].name, "host");
    EXPECT_EQ(st.tiers[d].device, d);
    EXPECT_EQ(st.tiers[d].pages_onboarded, 3u);
    EXPECT_EQ(st.tiers[d].pages_loaded, 3u);
    EXPECT_EQ(st.tiers[d].load_failures, 0u);
  }
  EXPECT_EQ(st.prefix_hit_tokens, 12u);
  const std::string text = metrics_text(*r.m);
  EXPECT_NE(text.find("tier=\"host\",device=\"1\"} "), std::string::npos) << text;
}

TEST_P(TierShards, AShardOneTierLacksEndsTheHit) {
  const KVCacheParams p = params();
  const TierConfig cfg = model_config();
  Rig r(p, make_tiers(p, cfg, {"host"}), cfg);
  std::mt19937 rng(12);
  const auto a = iota_tokens(13, 7);
  const Written w = write_and_evict(r, a, rng);
  // The chain key of a's second page, as the last device's tier holds it.
  const TierFingerprint last = cfg.fingerprint(p, p.n_devices - 1);
  const std::span<const std::uint32_t> toks(a);
  const PageKey k0 = page_key({}, toks.subspan(0, 4), last.chain_digest());
  const PageKey k1 = page_key(k0, toks.subspan(4, 4), last.chain_digest());
  ASSERT_TRUE(r.tiers.back()->drop(shard_key(k1, last.shard_mask())));
  ASSERT_TRUE(r.tiers.front()->contains(
      std::vector<PageKey>{shard_key(k1, cfg.fingerprint(p, 0).shard_mask())})[0]);

  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 4u) << "the level holds page 1 only in part: not held";
  r.m->wait_loads(c);
  EXPECT_EQ(r.m->cache_length(c), 4u);
  for (std::uint32_t d = 0; d < p.n_devices; ++d)
    EXPECT_EQ(differ(*r.m, c, d, w, 13, 4), 0u) << "device " << d;
  r.m->check_invariants();
}

TEST_P(TierShards, AShardLostWhileLoadingTruncatesEveryDevice) {
  const KVCacheParams p = params();
  const TierConfig cfg = model_config();
  Rig r(p, make_tiers(p, cfg, {"host"}, /*synchronous=*/false), cfg);
  std::mt19937 rng(13);
  const auto a = iota_tokens(13, 7);
  const Written w = write_and_evict(r, a, rng);
  for (const auto& t : r.tiers) t->complete_all();
  r.m->wait_tiers();
  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 12u);
  // Device 1's tier loses a's second page before its queued load runs.
  const TierFingerprint f1 = cfg.fingerprint(p, 1);
  const std::span<const std::uint32_t> toks(a);
  const PageKey k0 = page_key({}, toks.subspan(0, 4), f1.chain_digest());
  const PageKey k1 = page_key(k0, toks.subspan(4, 4), f1.chain_digest());
  ASSERT_TRUE(r.tiers[1]->drop(shard_key(k1, f1.shard_mask())));
  for (const auto& t : r.tiers) t->complete_all();
  r.m->wait_loads(c);
  EXPECT_EQ(r.m->cache_length(c), 4u) << "the hit ends at the page a shard lacked";
  r.m->check_invariants();
  for (std::uint32_t d = 0; d < p.n_devices; ++d)
    EXPECT_EQ(differ(*r.m, c, d, w, 13, 4), 0u) << "device " << d;
  const ManagerStats st = r.m->stats();
  EXPECT_EQ(st.tiers[1].load_failures, 1u);
  EXPECT_EQ(st.tiers[0].load_failures, 0u) << "device 0's tier served its shard";
  EXPECT_EQ(r.count(PageEvent::Kind::removed, "host"), 1u);
  EXPECT_EQ(st.blocks_free + st.blocks_used + st.blocks_cached, st.blocks_total);
}

TEST_P(TierShards, TwoLevelsServeWhatTheFirstLacks) {
  const KVCacheParams p = params();
  const TierConfig cfg = model_config();
  const auto tiers = make_tiers(p, cfg, {"host", "disk"});
  const std::vector<std::shared_ptr<MemoryTier>> disk(tiers.begin() + p.n_devices, tiers.end());
  std::mt19937 rng(14);
  const auto a = iota_tokens(13, 7);
  Written w;
  {
    Rig first(p, disk, cfg);  // writes to the disk level alone
    w = write_and_evict(first, a, rng);
  }
  Rig second(p, tiers, cfg);
  const SeqId c = second.m->claim(1)[0];
  EXPECT_EQ(second.m->match_prefix(c, a), 12u);
  second.m->poll_loads();
  for (std::uint32_t d = 0; d < p.n_devices; ++d) {
    EXPECT_EQ(differ(*second.m, c, d, w, 13, 12), 0u) << "device " << d;
    EXPECT_EQ(second.m->stats().tiers[p.n_devices + d].pages_onboarded, 3u);
  }
  second.m->check_invariants();
}

// Ranks of the group in their own managers (one device each, naming their
// shard) load what the group's manager wrote, each its own heads.
TEST_P(TierShards, RankManagersShareTheGroupsTiers) {
  const KVCacheParams p = params();
  const TierConfig cfg = model_config();
  const auto tiers = make_tiers(p, cfg, {"host"});
  std::mt19937 rng(15);
  const auto a = iota_tokens(13, 7);
  Written w;
  {
    Rig group(p, tiers, cfg);
    w = write_and_evict(group, a, rng);
  }
  KVCacheParams rank = p;
  rank.n_devices = 1;
  rank.n_kv_heads = p.n_kv_heads_per_device();
  for (std::uint32_t d = 0; d < p.n_devices; ++d) {
    TierConfig rank_cfg = model_config();
    rank_cfg.first_shard = d;
    rank_cfg.shard_count = p.n_devices;
    EXPECT_EQ(rank_cfg.fingerprint(rank), tiers[d]->fingerprint());
    Rig r(rank, {tiers[d]}, rank_cfg);
    const SeqId c = r.m->claim(1)[0];
    EXPECT_EQ(r.m->match_prefix(c, a), 12u) << "rank " << d;
    r.m->poll_loads();
    EXPECT_EQ(differ(*r.m, c, 0, Written{w[d]}, 13, 12), 0u) << "rank " << d;
    r.m->check_invariants();
  }
}

TEST_P(TierShards, FingerprintsAreCheckedPerShard) {
  const KVCacheParams p = params();
  const TierConfig cfg = model_config();
  auto tiers = make_tiers(p, cfg, {"host"});
  auto refused = [&](std::vector<std::shared_ptr<MemoryTier>> t, TierConfig c,
                     const std::string& what) {
    try {
      Rig r(p, std::move(t), std::move(c));
      ADD_FAILURE() << "accepted: " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  EXPECT_THROW((void)cfg.fingerprint(p, p.n_devices), InvalidArgument);
  auto swapped = tiers;
  std::swap(swapped[0], swapped[1]);
  refused(swapped, cfg,
          "tier 'host' (tiers[0]: level 0, device 0) fingerprint device_index is 1 but this "
          "manager's is 0");
  refused(
      {tiers.begin(), tiers.end() - 1}, cfg,
      std::to_string(p.n_devices - 1) + " given for " + std::to_string(p.n_devices) + " devices");
  refused(std::vector(p.n_devices, tiers[0]), cfg, "device_index is 0 but this manager's is 1");
  auto other = tiers;
  other[1] = std::make_shared<MemoryTier>(cfg.fingerprint(p, 1), MemoryTier::Options{.name = "x"});
  refused(other, cfg, "the tiers of a level share a name");
  TierConfig salted = cfg;
  salted.cache_salt = "tenant";
  refused(tiers, salted, "cache_salt is '' but this manager's is 'tenant'");
  TierConfig past = cfg;
  past.first_shard = 1;
  past.shard_count = p.n_devices;
  refused(tiers, past, "lie past tiers.shard_count " + std::to_string(p.n_devices));
  TierConfig no_count = cfg;
  no_count.first_shard = 1;
  refused(tiers, no_count, "tiers.first_shard is 1 but tiers.shard_count is 0");
  // A one-device manager's tiers (device_count 1) do not fit a shard.
  const KVCacheParams one = shard_params(1, std::get<1>(GetParam()));
  std::vector<std::shared_ptr<MemoryTier>> whole;
  for (std::uint32_t d = 0; d < p.n_devices; ++d)
    whole.push_back(std::make_shared<MemoryTier>(TierFingerprint::of(one, "model")));
  refused(whole, cfg,
          "fingerprint n_kv_heads is 4 but this manager's is " +
              std::to_string(p.n_kv_heads_per_device()));
}

// ---- a pool apart over several devices ---------------------------------------------

// The caller's pools (one per device) in the manager's arrangement.
struct DevicePools {
  DevicePools(const KVCacheParams& p, std::uint32_t pages)
      : params(p),
        num_pages(pages),
        run(std::size_t{p.page_size} * p.bytes_per_token_per_device() / (2 * p.num_layers)),
        pools(p.n_devices,
              std::vector<std::byte>(PagedKVCacheManager::estimated_memory_size(p, pages) /
                                     p.n_devices)) {}
  std::size_t in_pool(std::uint32_t page, std::uint32_t kv, std::uint32_t l) const {
    return params.pool_arrangement == PoolArrangement::per_layer
               ? ((std::size_t{l} * 2 + kv) * num_pages + page) * run
               : (std::size_t{page} * 2 * params.num_layers + std::size_t{kv} * params.num_layers +
                  l) *
                     run;
  }
  std::size_t packed(std::uint32_t kv, std::uint32_t l) const {
    return (std::size_t{kv} * params.num_layers + l) * run;
  }
  template <class F>
  void each_run(F&& f) const {
    for (std::uint32_t kv = 0; kv < 2; ++kv)
      for (std::uint32_t l = 0; l < params.num_layers; ++l) f(kv, l);
  }
  // The batch's offloads and loads, in the documented order, device by device.
  void apply(const KVCacheBatch& b) {
    for (const BlockOffload& o : b.block_offloads()) {
      EXPECT_EQ(o.bytes.size(), 2 * params.num_layers * run);
      each_run([&](auto kv, auto l) {
        std::memcpy(o.bytes.data() + packed(kv, l),
                    pools.at(o.device).data() + in_pool(o.page, kv, l), run);
      });
    }
    for (std::uint32_t d = 0; d < params.n_devices; ++d) {
      const auto* host = static_cast<const std::byte*>(b.blocks(d));
      for (std::uint32_t page : b.block_loads())
        each_run([&](auto kv, auto l) {
          std::memcpy(pools[d].data() + in_pool(page, kv, l), host + in_pool(page, kv, l), run);
        });
    }
  }
  KVCacheParams params;
  std::uint32_t num_pages;
  std::size_t run;
  std::vector<std::vector<std::byte>> pools;
};

TEST_P(TierShards, APoolApartOffloadsAndLoadsEveryDevice) {
  const KVCacheParams p = params();
  TierConfig cfg = model_config();
  cfg.pool_apart = true;
  Rig r(p, make_tiers(p, cfg, {"host"}), cfg);
  DevicePools dev(p, 4);
  std::mt19937 rng(16);
  for (auto& pool : dev.pools)
    for (std::byte& b : pool) b = std::byte(rng());
  auto fetch = [&](SeqId s, std::uint32_t n) {
    KVCacheBatch b = r.m->fetch(std::vector<SeqId>{s}, std::vector<std::uint32_t>{n});
    dev.apply(b);
    r.m->complete_offloads(b);
    return b;
  };
  const auto a = iota_tokens(13, 7);
  const SeqId sa = r.m->claim(1)[0];
  const KVCacheBatch ba = fetch(sa, 13);
  const std::vector<std::uint32_t> pages_a(ba.lookup_table().begin(),
                                           ba.lookup_table().begin() + 3);
  // The bytes a's pages hold on each device (random: "written by the kernels").
  std::vector<std::vector<std::byte>> held(p.n_devices);
  for (std::uint32_t d = 0; d < p.n_devices; ++d)
    for (std::uint32_t page : pages_a)
      dev.each_run([&](auto kv, auto l) {
        const std::byte* src = dev.pools[d].data() + dev.in_pool(page, kv, l);
        held[d].insert(held[d].end(), src, src + dev.run);
      });
  r.m->step(std::vector<SeqId>{sa}, std::vector<std::uint32_t>{13}, a);
  r.m->release(sa);
  const SeqId sb = r.m->claim(1)[0];
  {
    const KVCacheBatch bb = r.m->fetch(std::vector<SeqId>{sb}, std::vector<std::uint32_t>{16});
    ASSERT_EQ(bb.block_offloads().size(), 3u * p.n_devices) << "a page once per device";
    for (std::size_t i = 0; i < bb.block_offloads().size(); ++i)
      EXPECT_EQ(bb.block_offloads()[i].device, i % p.n_devices);
    dev.apply(bb);
    EXPECT_EQ(r.m->complete_offloads(bb), 3u);
    r.m->step(std::vector<SeqId>{sb}, std::vector<std::uint32_t>{0}, std::vector<std::uint32_t>{});
  }
  r.m->release(sb);
  // Scribble over every device pool: the reload must bring a's bytes back.
  for (auto& pool : dev.pools) std::fill(pool.begin(), pool.end(), std::byte{0x5a});
  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 12u);
  r.m->wait_loads(c);
  const KVCacheBatch bc = fetch(c, 1);
  EXPECT_EQ(bc.block_loads().size(), 3u);
  for (std::uint32_t d = 0; d < p.n_devices; ++d) {
    std::vector<std::byte> now;
    for (std::uint32_t j = 0; j < 3; ++j)
      dev.each_run([&](auto kv, auto l) {
        const std::byte* src = dev.pools[d].data() + dev.in_pool(bc.lookup_table()[j], kv, l);
        now.insert(now.end(), src, src + dev.run);
      });
    EXPECT_EQ(now, held[d]) << "device " << d;
  }
  r.m->check_invariants();
}

}  // namespace
}  // namespace kvcache
