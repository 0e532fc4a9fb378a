// The C interface's pool apart (kvc_prefix_config.pool_apart, docs/tiers.md
// "A pool apart"): a second host buffer plays the caller's (device) pool. The
// K/V are written there only; each fetch's transfers are applied with memcpy
// in the documented order (kvc_batch_block_offloads, kvc_batch_block_loads,
// kvc_batch_block_copies), then kvc_complete_offloads. Round trips through a
// host tier bit for bit in both arrangements; refusals (another manager's
// batch, a bad flag, no tier); kvc_estimated_bookkeeping_size equal to C++'s.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "c_api/c_tier_rig.h"
#include "kvcache/c_api.h"
#include "kvcache/host_tier.h"
#include "kvcache/paged_manager.h"

namespace {

using namespace c_tier_test;

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

// The transfers of the batch's last fetch.
struct Transfers {
  kvc_cache_desc desc{};
  std::vector<kvc_block_offload> offloads;
  std::vector<std::uint32_t> loads;
  std::vector<kvc_block_copy> copies;
};

Transfers transfers(const kvc_batch* batch) {
  Transfers t;
  kvc_error err{};
  EXPECT_EQ(kvc_batch_describe(batch, &t.desc, &err), KVC_OK) << err.message;
  const kvc_block_offload* o = nullptr;
  const std::uint32_t* l = nullptr;
  const kvc_block_copy* c = nullptr;
  std::uint32_t n = 0;
  EXPECT_EQ(kvc_batch_block_offloads(batch, &o, &n, &err), KVC_OK) << err.message;
  if (n != 0) t.offloads.assign(o, o + n);
  EXPECT_EQ(kvc_batch_block_loads(batch, &l, &n, &err), KVC_OK) << err.message;
  if (n != 0) t.loads.assign(l, l + n);
  EXPECT_EQ(kvc_batch_block_copies(batch, &c, &n, &err), KVC_OK) << err.message;
  if (n != 0) t.copies.assign(c, c + n);
  return t;
}

// A manager with a pool apart over one synchronous host tier, its batch and
// the caller's pool (`dev`, the manager's shape).
struct ApartRig {
  explicit ApartRig(std::int32_t arrangement, std::uint32_t pages = 4)
      : params(tier_params(arrangement)), tier(host_tier(params, /*synchronous=*/true)) {
    kvc_prefix_config c = kvc_prefix_config_default();
    c.tiers = &tier;
    c.n_tiers = 1;
    c.model_id = "model";
    c.pool_apart = 1;
    kvc_error err{};
    kvc_status s = kvc_manager_create_prefix(&params, pages, 4, 64, &c, &m, &err);
    EXPECT_EQ(s, KVC_OK) << describe(s, err);
    EXPECT_EQ(kvc_batch_create(&batch, &err), KVC_OK);
    std::size_t bytes = 0;
    EXPECT_EQ(kvc_estimated_memory_size(&params, pages, 0, &bytes, &err), KVC_OK);
    dev.resize(bytes);
    for (std::size_t i = 0; i < dev.size(); ++i) dev[i] = std::byte(i * 131 + 7);
  }
  ~ApartRig() {
    kvc_batch_destroy(batch);
    kvc_manager_destroy(m);
    kvc_tier_destroy(tier);
  }
  ApartRig(const ApartRig&) = delete;
  ApartRig& operator=(const ApartRig&) = delete;

  float* element(const kvc_cache_desc& d, std::uint32_t page, std::uint32_t layer,
                 std::uint32_t kv) {
    return reinterpret_cast<float*>(dev.data()) + layer * d.layer_stride + kv * d.kv_stride +
           page * d.block_stride;
  }
  // Applies the batch's transfers to `dev` in the documented order.
  Transfers apply() {
    Transfers t = transfers(batch);
    const kvc_cache_desc& d = t.desc;
    const std::size_t run = std::size_t{d.page_size} * d.n_kv_heads * d.head_dim * sizeof(float);
    const auto* host = static_cast<const std::byte*>(d.blocks);
    for (const kvc_block_offload& o : t.offloads) {
      EXPECT_EQ(o.size, 2 * d.num_layers * run);
      for (std::uint32_t kv = 0; kv < 2; ++kv)
        for (std::uint32_t l = 0; l < d.num_layers; ++l)
          std::memcpy(static_cast<std::byte*>(o.bytes) + (kv * d.num_layers + l) * run,
                      element(d, o.page, l, kv), run);
    }
    for (std::uint32_t page : t.loads) {
      for (std::uint32_t kv = 0; kv < 2; ++kv)
        for (std::uint32_t l = 0; l < d.num_layers; ++l) {
          float* to = element(d, page, l, kv);
          std::memcpy(to, host + (reinterpret_cast<std::byte*>(to) - dev.data()), run);
        }
    }
    for (const kvc_block_copy& c : t.copies) {
      for (std::uint32_t kv = 0; kv < 2; ++kv)
        for (std::uint32_t l = 0; l < d.num_layers; ++l)
          std::memcpy(element(d, c.dst, l, kv), element(d, c.src, l, kv), run);
    }
    return t;
  }
  // kvc_fetch of n new tokens for seq, its transfers applied and completed.
  Transfers fetch(std::uint64_t seq, std::uint32_t n) {
    kvc_error err{};
    kvc_status s = kvc_fetch(m, batch, &seq, &n, 1, 1, &err);
    EXPECT_EQ(s, KVC_OK) << describe(s, err);
    Transfers t = apply();
    std::uint32_t done = 0;
    s = kvc_complete_offloads(m, batch, &done, &err);
    EXPECT_EQ(s, KVC_OK) << describe(s, err);
    EXPECT_EQ(done, t.offloads.size());
    completed += done;
    EXPECT_EQ(kvc_check_invariants(m, &err), KVC_OK) << err.message;
    return t;
  }
  // Element (layer, kv, token t, head, d) of batch entry 0 in `dev`.
  float* token(const kvc_cache_desc& d, std::uint32_t l, std::uint32_t kv, std::uint32_t t,
               std::uint32_t h, std::uint32_t e) {
    return element(d, d.lookup_table[t / d.page_size], l, kv) + (t % d.page_size) * d.token_stride +
           h * d.head_stride + e;
  }
  // Random K/V for every token of a fresh seq, written into `dev`, committed with their ids.
  Written prefill(std::uint64_t seq, const std::vector<std::uint32_t>& tokens, std::mt19937& rng) {
    const auto n = static_cast<std::uint32_t>(tokens.size());
    const Transfers t = fetch(seq, n);
    std::uniform_real_distribution<float> dist(-4, 4);
    Written w(std::size_t{kLayers} * 2 * n * kHeads * kDim);
    for (float& x : w) x = dist(rng);
    for (std::uint32_t l = 0; l < kLayers; ++l)
      for (std::uint32_t kv = 0; kv < 2; ++kv)
        for (std::uint32_t i = 0; i < n; ++i)
          for (std::uint32_t h = 0; h < kHeads; ++h)
            for (std::uint32_t e = 0; e < kDim; ++e)
              *token(t.desc, l, kv, i, h, e) = w[at(l, kv, i, h, e, n)];
    kvc_error err{};
    EXPECT_EQ(kvc_step(m, &seq, &n, 1, tokens.data(), &err), KVC_OK) << err.message;
    return w;
  }
  // Elements of tokens [0, upto) of entry 0 in `dev` that differ from `w`
  // (written for `total` tokens).
  std::size_t differ(const kvc_cache_desc& d, const Written& w, std::uint32_t total,
                     std::uint32_t upto) {
    std::size_t n = 0;
    for (std::uint32_t l = 0; l < kLayers; ++l)
      for (std::uint32_t kv = 0; kv < 2; ++kv)
        for (std::uint32_t t = 0; t < upto; ++t)
          for (std::uint32_t h = 0; h < kHeads; ++h)
            for (std::uint32_t e = 0; e < kDim; ++e)
              n += std::memcmp(token(d, l, kv, t, h, e), &w[at(l, kv, t, h, e, total)],
                               sizeof(float)) != 0;
    return n;
  }
  std::uint64_t claim_one() {
    std::uint64_t seq = 0;
    kvc_error err{};
    EXPECT_EQ(kvc_claim(m, 1, &seq, &err), KVC_OK) << err.message;
    return seq;
  }
  void release(std::uint64_t seq) {
    kvc_error err{};
    EXPECT_EQ(kvc_release(m, seq, KVC_REUSE_UNKNOWN, &err), KVC_OK) << err.message;
  }
  std::uint32_t match(std::uint64_t seq, const std::vector<std::uint32_t>& tokens) {
    std::uint32_t reused = 0;
    kvc_error err{};
    EXPECT_EQ(kvc_match_prefix(m, seq, tokens.data(), tokens.size(), 0, &reused, &err), KVC_OK)
        << err.message;
    EXPECT_EQ(kvc_wait_loads(m, seq, &err), KVC_OK) << err.message;
    return reused;
  }
  kvc_tier_figures figures() {
    kvc_tier_figures f{};
    std::uint32_t n = 0;
    kvc_error err{};
    EXPECT_EQ(kvc_manager_tier_figures(m, &f, 1, &n, nullptr, &err), KVC_OK) << err.message;
    return f;
  }

  kvc_params params;
  kvc_tier* tier = nullptr;
  kvc_manager* m = nullptr;
  kvc_batch* batch = nullptr;
  std::vector<std::byte> dev;  // the caller's pool
  std::size_t completed = 0;
};

std::uint64_t tier_pages_stored(kvc_tier* t) {
  kvc_tier_stats s{};
  kvc_error err{};
  EXPECT_EQ(kvc_tier_stats_get(t, &s, &err), KVC_OK) << err.message;
  return s.pages_stored;
}

class CTierApart : public ::testing::TestWithParam<std::int32_t> {};

INSTANTIATE_TEST_SUITE_P(Arrangements, CTierApart,
                         ::testing::Values(KVC_ARRANGEMENT_INTERLEAVED, KVC_ARRANGEMENT_PER_LAYER),
                         arrangement_name);

// A's 3 published pages are evicted by B's prefill and written back through
// the slots; A comes back from the tier into the pages B's were evicted from
// (their offloads are read before the loads land), then B comes back.
TEST_P(CTierApart, RoundTripThroughTheCallersPool) {
  ApartRig r(GetParam());
  std::mt19937 rng(11);
  const auto a = iota_tokens(13, 7), b = iota_tokens(16, 1000);
  const std::uint64_t sa = r.claim_one();
  const Written wa = r.prefill(sa, a, rng);
  r.release(sa);

  const std::uint64_t sb = r.claim_one();
  kvc_error err{};
  const std::uint32_t sixteen = 16;
  ASSERT_EQ(kvc_fetch(r.m, r.batch, &sb, &sixteen, 1, 1, &err), KVC_OK) << err.message;
  const Transfers first = r.apply();
  EXPECT_EQ(first.offloads.size(), 3u) << "A's published pages wait for their bytes";
  EXPECT_TRUE(first.loads.empty());
  EXPECT_EQ(tier_pages_stored(r.tier), 0u) << "nothing stored before kvc_complete_offloads";
  std::uint32_t done = 99;
  ASSERT_EQ(kvc_complete_offloads(r.m, r.batch, &done, &err), KVC_OK) << err.message;
  EXPECT_EQ(done, 3u);
  ASSERT_EQ(kvc_complete_offloads(r.m, r.batch, &done, &err), KVC_OK) << err.message;
  EXPECT_EQ(done, 0u) << "completed once only";
  EXPECT_EQ(tier_pages_stored(r.tier), 3u);
  r.release(sb);

  const std::uint64_t sb2 = r.claim_one();  // B's 4 pages: A's 3 + the free one
  const Written wb = r.prefill(sb2, b, rng);
  r.release(sb2);

  const std::uint64_t c = r.claim_one();
  EXPECT_EQ(r.match(c, a), 12u);  // evicts 3 of B's pages for the loads
  const Transfers back = r.fetch(c, 1);
  EXPECT_EQ(back.offloads.size(), 4u) << "B's 3 pages + the one this fetch took";
  std::vector<std::uint32_t> loads = back.loads,
                             want(back.desc.lookup_table, back.desc.lookup_table + 3);
  std::sort(loads.begin(), loads.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(loads, want) << "the loaded pages, to upload";
  EXPECT_EQ(r.differ(back.desc, wa, 13, 12), 0u) << "A's K/V in the caller's pool";
  r.release(c);

  const std::uint64_t d = r.claim_one();
  EXPECT_EQ(r.match(d, b), 12u);
  const Transfers again = r.fetch(d, 1);
  EXPECT_EQ(r.differ(again.desc, wb, 16, 12), 0u)
      << "B's K/V, saved before A's loads overwrote them";
  const kvc_tier_figures f = r.figures();
  EXPECT_EQ(f.offload_dropped, 0u);
  EXPECT_EQ(f.pages_onboarded, 6u);
  EXPECT_EQ(f.load_failures, 0u);
  EXPECT_EQ(r.completed, 4u) << "C's fetch: B's 4 pages; A's, evicted for D, are in the tier";
}

// Without a pool apart the lists are empty and completing is a no-op.
TEST(CTierApartConfig, WithoutAPoolApartNoTransfers) {
  EXPECT_EQ(kvc_prefix_config_default().pool_apart, 0);
  const kvc_params p = tier_params();
  kvc_tier* host = host_tier(p, true);
  Rig r({host});
  kvc_tier_destroy(host);
  std::mt19937 rng(3);
  const std::uint64_t s = claim(r);
  const std::uint32_t n = 16;
  kvc_error err{};
  ASSERT_EQ(kvc_fetch(r.m, r.batch, &s, &n, 1, 1, &err), KVC_OK) << err.message;
  const Transfers t = transfers(r.batch);
  EXPECT_TRUE(t.offloads.empty());
  EXPECT_TRUE(t.loads.empty());
  std::uint32_t done = 99;
  EXPECT_EQ(kvc_complete_offloads(r.m, r.batch, &done, &err), KVC_OK) << err.message;
  EXPECT_EQ(done, 0u);
  EXPECT_EQ(kvc_complete_offloads(r.m, r.batch, nullptr, &err), KVC_OK) << err.message;
}

// Another manager's batch is refused naming it, and changes nothing: the
// slots stay reserved until their own manager completes them.
TEST(CTierApartErrors, AnotherManagersBatchIsRefused) {
  ApartRig r(KVC_ARRANGEMENT_INTERLEAVED), other(KVC_ARRANGEMENT_INTERLEAVED);
  std::mt19937 rng(5);
  for (ApartRig* x : {&r, &other}) {
    const std::uint64_t s = x->claim_one();
    x->prefill(s, iota_tokens(13, 7), rng);
    x->release(s);
  }
  const std::uint32_t sixteen = 16;
  kvc_error err{};
  const std::uint64_t mine = r.claim_one(), theirs = other.claim_one();
  ASSERT_EQ(kvc_fetch(r.m, r.batch, &mine, &sixteen, 1, 1, &err), KVC_OK) << err.message;
  ASSERT_EQ(kvc_fetch(other.m, other.batch, &theirs, &sixteen, 1, 1, &err), KVC_OK);
  ASSERT_EQ(transfers(other.batch).offloads.size(), 3u);
  r.apply();
  std::uint32_t done = 99;
  expect_status([&](kvc_error* e) { return kvc_complete_offloads(r.m, other.batch, &done, e); },
                KVC_INVALID_ARGUMENT, {"3 offloads", "not fetched from this manager"});
  EXPECT_EQ(done, 99u) << "nothing written on failure";
  EXPECT_EQ(tier_pages_stored(r.tier), 0u);
  EXPECT_EQ(tier_pages_stored(other.tier), 0u);
  EXPECT_EQ(kvc_check_invariants(r.m, &err), KVC_OK) << err.message;
  ASSERT_EQ(kvc_complete_offloads(r.m, r.batch, &done, &err), KVC_OK) << err.message;
  EXPECT_EQ(done, 3u);
  EXPECT_EQ(tier_pages_stored(r.tier), 3u);
}

TEST(CTierApartErrors, RefusedArguments) {
  const kvc_params p = tier_params();
  kvc_tier* host = host_tier(p, true);
  kvc_prefix_config c = kvc_prefix_config_default();
  c.tiers = &host;
  c.n_tiers = 1;
  c.model_id = "model";
  c.pool_apart = 2;
  kvc_manager* m = nullptr;
  expect_status([&](kvc_error* e) { return kvc_manager_create_prefix(&p, 4, 4, 64, &c, &m, e); },
                KVC_INVALID_ARGUMENT, {"config->pool_apart", "2"});
  c.n_tiers = 0;
  c.tiers = nullptr;
  c.pool_apart = 1;
  expect_status([&](kvc_error* e) { return kvc_manager_create_prefix(&p, 4, 4, 64, &c, &m, e); },
                KVC_INVALID_ARGUMENT, {"pool_apart"});
  EXPECT_EQ(m, nullptr);
  kvc_tier_destroy(host);

  ApartRig r(KVC_ARRANGEMENT_INTERLEAVED);
  kvc_batch* fresh = nullptr;
  kvc_error err{};
  ASSERT_EQ(kvc_batch_create(&fresh, &err), KVC_OK);
  std::uint32_t n = 0;
  const kvc_block_offload* o = nullptr;
  const std::uint32_t* l = nullptr;
  expect_status([&](kvc_error* e) { return kvc_complete_offloads(r.m, fresh, &n, e); },
                KVC_INVALID_ARGUMENT, {"batch", "not been fetched"});
  expect_status([&](kvc_error* e) { return kvc_batch_block_offloads(fresh, &o, &n, e); },
                KVC_INVALID_ARGUMENT, {"not been fetched"});
  expect_status([&](kvc_error* e) { return kvc_batch_block_loads(fresh, &l, &n, e); },
                KVC_INVALID_ARGUMENT, {"not been fetched"});
  kvc_batch_destroy(fresh);
  expect_status([&](kvc_error* e) { return kvc_complete_offloads(nullptr, r.batch, &n, e); },
                KVC_INVALID_ARGUMENT, {"manager"});
  expect_status([&](kvc_error* e) { return kvc_complete_offloads(r.m, nullptr, &n, e); },
                KVC_INVALID_ARGUMENT, {"batch is NULL"});
  const std::uint64_t s = r.claim_one();
  r.fetch(s, 1);
  expect_status([&](kvc_error* e) { return kvc_batch_block_offloads(r.batch, nullptr, &n, e); },
                KVC_INVALID_ARGUMENT, {"offloads is NULL"});
  expect_status([&](kvc_error* e) { return kvc_batch_block_loads(r.batch, &l, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"count is NULL"});

  kvc_params cp = tier_params();
  cp.strategy = KVC_STRATEGY_CONTINUOUS;
  cp.enable_prefix_caching = 0;
  kvc_manager* continuous = nullptr;
  ASSERT_EQ(kvc_manager_create(&cp, 0, 2, 16, &continuous, &err), KVC_OK) << err.message;
  expect_status([&](kvc_error* e) { return kvc_complete_offloads(continuous, r.batch, &n, e); },
                KVC_INVALID_ARGUMENT, {"kvc_complete_offloads"});
  kvc_manager_destroy(continuous);
}

// kvc_estimated_bookkeeping_size is C++'s figure for the same configuration,
// staging and a pool apart's flags included.
TEST(CTierApartConfig, BookkeepingSizeEqualsTheCppFigure) {
  const kvc_params p = tier_params();
  kvc_tier* host = host_tier(p, true);
  const kvcache::KVCacheParams cpp{.dtype = kvcache::DType::f32,
                                   .num_layers = kLayers,
                                   .n_kv_heads = kHeads,
                                   .head_dim = kDim,
                                   .cache_strategy = kvcache::CacheStrategy::paged,
                                   .page_size = kPage,
                                   .enable_prefix_caching = true};
  kvcache::HostTierOptions synchronous;
  synchronous.synchronous = true;
  auto cpp_tier = std::make_shared<kvcache::HostTier>(kvcache::TierFingerprint::of(cpp, "model"),
                                                      4096, synchronous);
  auto bytes = [&](const kvc_prefix_config* c) {
    std::size_t n = 0;
    kvc_error err{};
    EXPECT_EQ(kvc_estimated_bookkeeping_size(&p, 100, c, &n, &err), KVC_OK) << err.message;
    return n;
  };
  kvcache::PrefixCacheConfig want;
  EXPECT_EQ(bytes(nullptr), kvcache::PagedKVCacheManager::estimated_bookkeeping_size(cpp, 100));
  kvc_prefix_config c = kvc_prefix_config_default();
  EXPECT_EQ(bytes(&c), kvcache::PagedKVCacheManager::estimated_bookkeeping_size(cpp, 100, want));
  c.tiers = &host;
  c.n_tiers = 1;
  c.staging_pages = 7;
  want.tiers.tiers = {cpp_tier};
  want.tiers.staging_pages = 7;
  const std::size_t staged = bytes(&c);
  EXPECT_EQ(staged, kvcache::PagedKVCacheManager::estimated_bookkeeping_size(cpp, 100, want));
  c.pool_apart = 1;
  want.tiers.pool_apart = true;
  EXPECT_EQ(bytes(&c), kvcache::PagedKVCacheManager::estimated_bookkeeping_size(cpp, 100, want));
  EXPECT_GT(bytes(&c), staged);
  c.policy = 9;
  std::size_t n = 0;
  expect_status([&](kvc_error* e) { return kvc_estimated_bookkeeping_size(&p, 100, &c, &n, e); },
                KVC_INVALID_ARGUMENT, {"config->policy", "9"});
  kvc_tier_destroy(host);
}

}  // namespace
