// Tiers below a pool kept apart from the manager's (TierConfig::pool_apart):
// a second host buffer plays the caller's (device) pool. The K/V are written
// there only; a small helper applies each batch's transfers with memcpy in
// the documented order (block_offloads, block_loads, block_copies), then
// complete_offloads. The manager's own pool is only the loads' bounce buffer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "kvcache/kernels/attention.h"
#include "kvcache/paged_manager.h"
#include "manager/tier_test_util.h"
#include "tier/memory_tier.h"

namespace kvcache {
namespace {

using testing::MemoryTier;

// One layer's K or V of page `page` in a pool of either arrangement
// (interleaved [pages][2][layers][block], per_layer [layers][2][pages][block]),
// and in the packed form [2][layers][block].
struct PoolGeometry {
  PoolGeometry(const KVCacheParams& p, std::uint32_t pages)
      : layers(p.num_layers),
        num_pages(pages),
        run(std::size_t{p.page_size} * p.bytes_per_token_per_device() / (2 * p.num_layers)),
        per_layer(p.pool_arrangement == PoolArrangement::per_layer) {}
  std::size_t in_pool(std::uint32_t page, std::uint32_t kv, std::uint32_t l) const {
    return per_layer ? ((std::size_t{l} * 2 + kv) * num_pages + page) * run
                     : (std::size_t{page} * 2 * layers + std::size_t{kv} * layers + l) * run;
  }
  std::size_t packed(std::uint32_t kv, std::uint32_t l) const {
    return (std::size_t{kv} * layers + l) * run;
  }
  std::uint32_t layers, num_pages;
  std::size_t run;
  bool per_layer;
};

// Applies a batch's transfers to the caller's pool `dev`, in the documented order.
void apply_transfers(const KVCacheBatch& b, std::span<std::byte> dev) {
  const PoolGeometry g(b.params(), b.num_blocks());
  const auto* host = static_cast<const std::byte*>(b.blocks());
  auto each_run = [&](auto&& f) {
    for (std::uint32_t kv = 0; kv < 2; ++kv)
      for (std::uint32_t l = 0; l < g.layers; ++l) f(kv, l);
  };
  for (const BlockOffload& o : b.block_offloads()) {
    EXPECT_EQ(o.bytes.size(), 2 * g.layers * g.run);
    each_run([&](auto kv, auto l) {
      std::memcpy(o.bytes.data() + g.packed(kv, l), dev.data() + g.in_pool(o.page, kv, l), g.run);
    });
  }
  for (std::uint32_t page : b.block_loads()) {
    each_run([&](auto kv, auto l) {
      std::memcpy(dev.data() + g.in_pool(page, kv, l), host + g.in_pool(page, kv, l), g.run);
    });
  }
  for (const BlockCopy& c : b.block_copies()) {
    each_run([&](auto kv, auto l) {
      std::memcpy(dev.data() + g.in_pool(c.dst, kv, l), dev.data() + g.in_pool(c.src, kv, l),
                  g.run);
    });
  }
}

// K and V a sequence was written with: [layer][kv][token][head][dim].
using Written = std::vector<float>;

struct ApartRig {
  explicit ApartRig(PoolArrangement arrangement, std::uint32_t pages = 4,
                    std::uint32_t staging = 16)
      : params(testing::tier_test_params(arrangement)),
        tier(std::make_shared<MemoryTier>(TierFingerprint::of(params, "model"))),
        dev(PagedKVCacheManager::estimated_memory_size(params, pages)) {
    PrefixCacheConfig config;
    config.tiers.tiers = {tier};
    config.tiers.model_id = "model";
    config.tiers.staging_pages = staging;
    config.tiers.pool_apart = true;
    config.tiers.offload_batch = 1;  // each completion's write-backs go at once
    m = std::make_unique<PagedKVCacheManager>(params, pages, 4, 64, std::move(config));
    for (std::size_t i = 0; i < dev.size(); ++i) dev[i] = std::byte(i * 131 + 7);
  }

  // fetch, the transfers into `dev`, complete_offloads (counted in `completed`).
  KVCacheBatch fetch(SeqId s, std::uint32_t n) {
    KVCacheBatch b = m->fetch(std::vector<SeqId>{s}, std::vector<std::uint32_t>{n});
    apply_transfers(b, dev);
    completed += m->complete_offloads(b);
    m->check_invariants();
    return b;
  }
  // The layer's K (kv 0) or V view of the caller's pool for batch b.
  PagedKVCache<float> view(const KVCacheBatch& b, std::uint32_t layer, std::uint32_t kv) {
    CacheDesc d = b.desc();
    d.blocks = dev.data();
    const PagedKVCacheCollection<float> col(d);
    return kv == 0 ? col.get_key_cache(layer) : col.get_value_cache(layer);
  }
  std::size_t at(std::uint32_t l, std::uint32_t kv, std::uint32_t t, std::uint32_t h,
                 std::uint32_t d, std::uint32_t tokens) const {
    return (((std::size_t{l} * 2 + kv) * tokens + t) * params.n_kv_heads + h) * params.head_dim + d;
  }

  // Room for tokens.size() new tokens of a fresh seq, random K/V written into
  // the caller's pool, committed with their ids.
  Written prefill(SeqId seq, const std::vector<std::uint32_t>& tokens, std::mt19937& rng) {
    const auto n = static_cast<std::uint32_t>(tokens.size());
    const KVCacheBatch b = fetch(seq, n);
    std::uniform_real_distribution<float> dist(-4, 4);
    Written w(std::size_t{params.num_layers} * 2 * n * params.n_kv_heads * params.head_dim);
    for (float& x : w) x = dist(rng);
    const std::size_t per = std::size_t{n} * params.n_kv_heads * params.head_dim;
    const std::vector<std::uint32_t> rows{0, n};
    for (std::uint32_t l = 0; l < params.num_layers; ++l) {
      store_kv(view(b, l, 0), view(b, l, 1),
               std::span<const float>(w).subspan(at(l, 0, 0, 0, 0, n), per),
               std::span<const float>(w).subspan(at(l, 1, 0, 0, 0, n), per), rows);
    }
    m->step(std::vector<SeqId>{seq}, std::vector<std::uint32_t>{n}, tokens);
    return w;
  }

  // Elements of tokens [0, upto) of batch entry 0 in the caller's pool that
  // differ from `w` (written for `total` tokens).
  std::size_t differ(const KVCacheBatch& b, const Written& w, std::uint32_t total,
                     std::uint32_t upto) {
    std::size_t n = 0;
    for (std::uint32_t l = 0; l < params.num_layers; ++l)
      for (std::uint32_t kv = 0; kv < 2; ++kv) {
        const PagedKVCache<float> c = view(b, l, kv);
        for (std::uint32_t t = 0; t < upto; ++t)
          for (std::uint32_t h = 0; h < params.n_kv_heads; ++h)
            for (std::uint32_t d = 0; d < params.head_dim; ++d)
              n += *c.ptr(0, h, t, d) != w[at(l, kv, t, h, d, total)];
      }
    return n;
  }

  KVCacheParams params;
  std::shared_ptr<MemoryTier> tier;
  std::vector<std::byte> dev;  // the caller's pool
  std::unique_ptr<PagedKVCacheManager> m;
  std::size_t completed = 0;
};

using testing::iota_tokens;

class TierApart : public ::testing::TestWithParam<PoolArrangement> {};

INSTANTIATE_TEST_SUITE_P(Arrangements, TierApart,
                         ::testing::Values(PoolArrangement::interleaved,
                                           PoolArrangement::per_layer),
                         [](const auto& info) {
                           return std::string(arrangement_name(info.param));
                         });

// A's 3 published pages are evicted by B's prefill (write-back through
// block_offloads), A comes back from the tier into the pages B's were evicted
// from (their offloads must be read before the loads land), then B comes back.
TEST_P(TierApart, RoundTripThroughTheCallersPool) {
  ApartRig r(GetParam());
  std::mt19937 rng(1);
  const auto a = iota_tokens(13, 7), b = iota_tokens(16, 1000);
  const SeqId sa = r.m->claim(1)[0];
  const Written wa = r.prefill(sa, a, rng);
  r.m->release(sa);
  const SeqId sb = r.m->claim(1)[0];
  {
    const KVCacheBatch batch = r.m->fetch(std::vector<SeqId>{sb}, std::vector<std::uint32_t>{16});
    EXPECT_EQ(batch.block_offloads().size(), 3u) << "A's published pages wait for their bytes";
    const std::span<std::byte> staging = r.m->tier_staging();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(staging.data()) % 4096, 0u);
    for (const BlockOffload& o : batch.block_offloads()) {
      EXPECT_GE(o.bytes.data(), staging.data()) << "a slot inside the one staging allocation";
      EXPECT_LE(o.bytes.data() + o.bytes.size(), staging.data() + staging.size());
    }
    EXPECT_TRUE(batch.block_loads().empty());
    EXPECT_TRUE(r.tier->keys().empty()) << "nothing stored before complete_offloads";
    apply_transfers(batch, r.dev);
    EXPECT_EQ(r.m->complete_offloads(batch), 3u);
    EXPECT_EQ(r.m->complete_offloads(batch), 0u) << "completed once only";
    r.m->step(std::vector<SeqId>{sb}, std::vector<std::uint32_t>{0}, std::vector<std::uint32_t>{});
  }
  EXPECT_EQ(r.tier->keys().size(), 3u);
  r.m->release(sb);
  // Write B's K/V (B's 4 pages are A's 3 + the free one).
  const SeqId sb2 = r.m->claim(1)[0];
  const Written wb = r.prefill(sb2, b, rng);
  r.m->release(sb2);
  r.m->check_invariants();

  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 12u);  // evicts 3 of B's pages for the loads
  EXPECT_THROW(r.m->fetch(std::vector<SeqId>{c}, std::vector<std::uint32_t>{1}), InvalidArgument);
  EXPECT_EQ(r.m->poll_loads(), std::vector<SeqId>{c});
  r.m->check_invariants();
  {
    const KVCacheBatch batch = r.m->fetch(std::vector<SeqId>{c}, std::vector<std::uint32_t>{1});
    EXPECT_EQ(batch.block_offloads().size(), 4u) << "B's 3 pages + the one this fetch took";
    std::vector<std::uint32_t> loads(batch.block_loads().begin(), batch.block_loads().end());
    std::sort(loads.begin(), loads.end());
    std::vector<std::uint32_t> want(batch.lookup_table().begin(), batch.lookup_table().begin() + 3);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(loads, want) << "the loaded pages, to upload";
    apply_transfers(batch, r.dev);
    EXPECT_EQ(r.m->complete_offloads(batch), 4u);
    EXPECT_EQ(r.differ(batch, wa, 13, 12), 0u) << "A's K/V in the caller's pool";
    r.m->step(std::vector<SeqId>{c}, std::vector<std::uint32_t>{0}, std::vector<std::uint32_t>{});
  }
  r.m->release(c);
  r.m->check_invariants();

  const SeqId d = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(d, b), 12u);
  r.m->wait_loads(d);
  const KVCacheBatch batch = r.fetch(d, 1);
  EXPECT_EQ(r.differ(batch, wb, 16, 12), 0u) << "B's K/V, saved before A's loads overwrote them";
  const ManagerStats st = r.m->stats();
  EXPECT_EQ(st.tiers[0].offload_dropped, 0u);
  EXPECT_EQ(st.tiers[0].pages_onboarded, 6u);
  EXPECT_EQ(st.tiers[0].load_failures, 0u);
}

// A loaded page evicted again before a fetch delivered its upload: its bytes
// are the host pool's, so it is written back from there at once.
TEST_P(TierApart, HostFreshPageIsWrittenBackFromTheHostPool) {
  ApartRig r(GetParam());
  std::mt19937 rng(2);
  const auto a = iota_tokens(13, 7);
  const SeqId sa = r.m->claim(1)[0];
  const Written wa = r.prefill(sa, a, rng);
  r.m->release(sa);
  const SeqId sb = r.m->claim(1)[0];
  r.prefill(sb, iota_tokens(16, 1000), rng);  // A's pages go down, B's K/V land on them
  r.m->release(sb);

  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 12u);
  r.m->poll_loads();  // uploads pending, not delivered
  r.m->release(c);
  for (const PageKey& k : r.tier->keys()) r.tier->drop(k);  // the tier forgets A
  const std::size_t stored_before = r.tier->stats().pages_stored;

  // A prefill that evicts every page: A's 3 are host-fresh.
  const SeqId e = r.m->claim(1)[0];
  const KVCacheBatch batch = r.m->fetch(std::vector<SeqId>{e}, std::vector<std::uint32_t>{16});
  EXPECT_TRUE(batch.block_loads().empty()) << "uploads of pages taken again are void";
  // B's 4 pages wait for the caller's pool (3 were evicted by the loads, whose
  // uploads never came); A's 3 went down from the host pool at once.
  EXPECT_EQ(batch.block_offloads().size(), 4u);
  EXPECT_EQ(r.tier->stats().pages_stored, stored_before + 3) << "A's went down from the host";
  apply_transfers(batch, r.dev);
  r.m->complete_offloads(batch);
  r.m->step(std::vector<SeqId>{e}, std::vector<std::uint32_t>{0}, std::vector<std::uint32_t>{});
  r.m->release(e);
  r.m->check_invariants();

  const SeqId f = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(f, a), 12u);
  r.m->wait_loads(f);
  const KVCacheBatch back = r.fetch(f, 1);
  EXPECT_EQ(r.differ(back, wa, 13, 12), 0u);
}

// A loaded page shared by a fork and cut by truncate: the copy-on-write copy
// reads it in the caller's pool, so its upload comes first.
TEST_P(TierApart, LoadedPageUploadedBeforeItsCopyOnWrite) {
  ApartRig r(GetParam());
  std::mt19937 rng(3);
  const auto a = iota_tokens(13, 7);
  const SeqId sa = r.m->claim(1)[0];
  const Written wa = r.prefill(sa, a, rng);
  r.m->release(sa);
  const SeqId sb = r.m->claim(1)[0];
  r.prefill(sb, iota_tokens(16, 1000), rng);
  r.m->release(sb);

  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 12u);
  r.m->poll_loads();
  const SeqId child = r.m->fork(c);
  r.m->truncate(c, 10);  // page 2 is shared with the child: the next write copies it
  const KVCacheBatch batch = r.m->fetch(std::vector<SeqId>{c}, std::vector<std::uint32_t>{1});
  ASSERT_EQ(batch.block_copies().size(), 1u);
  EXPECT_EQ(batch.block_loads().size(), 3u);
  apply_transfers(batch, r.dev);
  r.m->complete_offloads(batch);
  EXPECT_EQ(r.differ(batch, wa, 13, 10), 0u) << "the copy holds A's tokens 8 and 9";
  r.m->check_invariants();
  (void)child;
}

// Slots never completed stay reserved: later write-backs find none, are
// dropped and counted, and nothing waits; completing frees them again.
TEST(TierApartSlots, UncompletedOffloadsDropLaterWriteBacks) {
  ApartRig r(PoolArrangement::interleaved, 4, /*staging=*/2);
  std::mt19937 rng(4);
  const SeqId sa = r.m->claim(1)[0];
  r.prefill(sa, iota_tokens(13, 7), rng);
  r.m->release(sa);
  const SeqId sb = r.m->claim(1)[0];
  const KVCacheBatch held = r.m->fetch(std::vector<SeqId>{sb}, std::vector<std::uint32_t>{16});
  EXPECT_EQ(held.block_offloads().size(), 2u) << "two slots for A's three pages";
  EXPECT_EQ(r.m->stats().tiers[0].offload_dropped, 1u);
  apply_transfers(held, r.dev);
  r.m->step(std::vector<SeqId>{sb}, std::vector<std::uint32_t>{16}, iota_tokens(16, 1000));
  r.m->release(sb);
  r.m->check_invariants();

  // Every slot is handed out and not completed: B's evicted pages are dropped.
  const SeqId sc = r.m->claim(1)[0];
  const KVCacheBatch next = r.m->fetch(std::vector<SeqId>{sc}, std::vector<std::uint32_t>{16});
  EXPECT_TRUE(next.block_offloads().empty());
  EXPECT_EQ(r.m->stats().tiers[0].offload_dropped, 1u + 4u);
  EXPECT_EQ(r.m->complete_offloads(next), 0u);
  r.m->check_invariants();

  // Another manager's batch is refused and changes nothing.
  ApartRig other(PoolArrangement::interleaved);
  const SeqId so = other.m->claim(1)[0];
  other.prefill(so, iota_tokens(13, 7), rng);
  other.m->release(so);
  const SeqId so2 = other.m->claim(1)[0];
  const KVCacheBatch foreign =
      other.m->fetch(std::vector<SeqId>{so2}, std::vector<std::uint32_t>{16});
  ASSERT_FALSE(foreign.block_offloads().empty());
  const ManagerSnapshot before = r.m->snapshot();
  EXPECT_THROW(r.m->complete_offloads(foreign), InvalidArgument);
  EXPECT_EQ(r.m->snapshot(), before);
  EXPECT_TRUE(r.tier->keys().empty());

  EXPECT_EQ(r.m->complete_offloads(held), 2u);
  EXPECT_EQ(r.tier->keys().size(), 2u);
  r.m->check_invariants();
}

// A fetch that throws hands nothing out: the next one does.
TEST(TierApartSlots, RefusedFetchKeepsTheTransfersForTheNext) {
  ApartRig r(PoolArrangement::per_layer);
  std::mt19937 rng(5);
  const auto a = iota_tokens(13, 7);
  const SeqId sa = r.m->claim(1)[0];
  const Written wa = r.prefill(sa, a, rng);
  r.m->release(sa);
  const SeqId sb = r.m->claim(1)[0];
  r.prefill(sb, iota_tokens(16, 1000), rng);
  r.m->release(sb);
  const SeqId c = r.m->claim(1)[0];
  EXPECT_EQ(r.m->match_prefix(c, a), 12u);  // 3 offloads waiting
  r.m->poll_loads();                        // 3 uploads pending
  KVCacheBatch out;
  EXPECT_THROW(r.m->fetch_into(out, std::vector<SeqId>{c}, std::vector<std::uint32_t>{64}, 1),
               CapacityExceeded);
  EXPECT_THROW(r.m->fetch_into(out, std::vector<SeqId>{c}, std::vector<std::uint32_t>{9}, 1),
               OutOfPages);
  EXPECT_TRUE(out.block_offloads().empty());
  r.m->check_invariants();
  const KVCacheBatch batch = r.fetch(c, 1);
  EXPECT_EQ(batch.block_offloads().size(), 4u);
  EXPECT_EQ(batch.block_loads().size(), 3u);
  EXPECT_EQ(r.completed, 3u + 4u) << "A's pages in B's prefill, then B's now";
  EXPECT_EQ(r.differ(batch, wa, 13, 12), 0u);
}

TEST(TierApartConfig, PoolApartNeedsATierAndCountsItsBookkeeping) {
  const KVCacheParams p = testing::tier_test_params(PoolArrangement::interleaved);
  PrefixCacheConfig none;
  none.tiers.pool_apart = true;
  try {
    PagedKVCacheManager m(p, 4, 4, 64, none);
    FAIL() << "pool_apart without a tier was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("pool_apart"), std::string::npos) << e.what();
  }
  PrefixCacheConfig config;
  config.tiers.tiers = {std::make_shared<MemoryTier>(TierFingerprint::of(p, "model"))};
  config.tiers.model_id = "model";
  const std::size_t plain = PagedKVCacheManager::estimated_bookkeeping_size(p, 100, config);
  config.tiers.pool_apart = true;
  EXPECT_EQ(PagedKVCacheManager::estimated_bookkeeping_size(p, 100, config), plain + 100 * 5);
  // The estimate refuses what the constructor refuses, naming the field.
  for (const auto& [field, bad] : std::vector<std::pair<std::string, PrefixCacheConfig>>{
           {"staging_pages",
            [&] {
              auto c = config;
              c.tiers.staging_pages = 0;
              return c;
            }()},
           {"offload_batch",
            [&] {
              auto c = config;
              c.tiers.offload_batch = 65537;
              return c;
            }()},
           {"offload_delay", [&] {
              auto c = config;
              c.tiers.offload_delay = std::chrono::seconds{2};
              return c;
            }()}}) {
    try {
      (void)PagedKVCacheManager::estimated_bookkeeping_size(p, 100, bad);
      ADD_FAILURE() << field << " out of range was estimated";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
  // Without pool_apart no batch has transfers, and complete_offloads is a no-op.
  ApartRig r(PoolArrangement::interleaved);
  PagedKVCacheManager plain_manager(p, 4, 4, 64);
  EXPECT_TRUE(plain_manager.tier_staging().empty()) << "no tiers, no staging";
  const SeqId s = plain_manager.claim(1)[0];
  const KVCacheBatch b = plain_manager.fetch(std::vector<SeqId>{s}, std::vector<std::uint32_t>{16});
  EXPECT_TRUE(b.block_offloads().empty());
  EXPECT_TRUE(b.block_loads().empty());
  EXPECT_EQ(plain_manager.complete_offloads(b), 0u);
  EXPECT_EQ(r.m->complete_offloads(b), 0u);
}

}  // namespace
}  // namespace kvcache
