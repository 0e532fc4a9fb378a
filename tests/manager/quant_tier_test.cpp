// 8-bit pages through a tier: an int8 page (its values and the scales it
// holds) and an fp8 page (its codes; the static scales live in KVScales)
// written back to a tier by one manager and loaded by another, as a
// restarted process would, come back byte-exact and give the same attention
// output. fp8 tier keys include the scales: a manager with other scales
// never loads pages written with these.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kvcache/kernels/attention.h"
#include "kvcache/paged_manager.h"
#include "tier/memory_tier.h"

namespace kvcache {
namespace {

using testing::MemoryTier;
using U32 = std::vector<std::uint32_t>;

constexpr std::uint32_t kLayers = 2, kHeads = 2, kDim = 8, kPage = 4, kQHeads = 4;
constexpr std::uint32_t kRow = kHeads * kDim;

KVCacheParams params_of(DType dtype, PoolArrangement arrangement) {
  return KVCacheParams{.dtype = dtype,
                       .num_layers = kLayers,
                       .n_kv_heads = kHeads,
                       .head_dim = kDim,
                       .cache_strategy = CacheStrategy::paged,
                       .page_size = kPage,
                       .enable_prefix_caching = true,
                       .pool_arrangement = arrangement};
}

// K, V [layer][token][row] and q [layer][kQHeads * kDim] of one run.
struct Data {
  std::vector<float> k, v, q;
  explicit Data(std::uint32_t tokens) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-3, 3);
    for (auto* x : {&k, &v}) {
      x->resize(std::size_t{kLayers} * tokens * kRow);
      for (float& e : *x) e = u(rng);
    }
    q.resize(std::size_t{kLayers} * kQHeads * kDim);
    for (float& e : q) e = u(rng);
  }
};

// A manager over `tier`, with the fp8 scales when given.
std::unique_ptr<PagedKVCacheManager> manager_of(const KVCacheParams& p,
                                                std::shared_ptr<MemoryTier> tier,
                                                const KVScales* scales) {
  PrefixCacheConfig config;
  config.tiers.tiers = {std::move(tier)};
  config.tiers.model_id = "model";
  config.tiers.offload_batch = 1;  // each call's write-backs go at once
  auto m = std::make_unique<PagedKVCacheManager>(p, 4, 2, 64, std::move(config));
  if (scales != nullptr) m->set_kv_scales(*scales);
  return m;
}

// Stores tokens [from, from + n) of `d` (the sequence is at length from).
void store(PagedKVCacheManager& m, SeqId seq, const Data& d, std::uint32_t total,
           std::uint32_t from, std::uint32_t n, const U32& ids) {
  const KVCacheBatch b = m.fetch(std::vector<SeqId>{seq}, U32{n});
  const CacheDesc whole = b.desc();
  for (std::uint32_t l = 0; l < kLayers; ++l) {
    const std::size_t at = (std::size_t{l} * total + from) * kRow;
    store_kv(whole.layer(l, 0), whole.layer(l, 1), std::span(d.k).subspan(at, n * kRow),
             std::span(d.v).subspan(at, n * kRow), U32{0, n});
  }
  m.step(std::vector<SeqId>{seq}, U32{n}, U32(ids.begin() + from, ids.begin() + from + n));
}

// Bytes of the sequence's first `pages` pages (every layer, K and V).
std::vector<std::uint8_t> page_bytes(const KVCacheBatch& b, std::uint32_t pages) {
  const CacheDesc whole = b.desc();
  std::vector<std::uint8_t> out;
  for (std::uint32_t j = 0; j < pages; ++j)
    for (std::uint32_t l = 0; l < kLayers; ++l)
      for (std::uint32_t kv = 0; kv < 2; ++kv) {
        const CacheDesc c = whole.layer(l, kv);
        const auto* p = static_cast<const std::uint8_t*>(c.blocks) +
                        std::size_t{c.lookup_table[j]} * c.block_stride;
        out.insert(out.end(), p, p + c.block_elements());
      }
  return out;
}

// Stores the last token of `d` and attends over the whole sequence (not
// committed): the output of every layer.
std::vector<float> attend_last(PagedKVCacheManager& m, SeqId seq, const Data& d,
                               std::uint32_t total, std::vector<std::uint8_t>* pages) {
  const KVCacheBatch b = m.fetch(std::vector<SeqId>{seq}, U32{1});
  if (pages != nullptr) *pages = page_bytes(b, 3);
  const CacheDesc whole = b.desc();
  std::vector<float> out(std::size_t{kLayers} * kQHeads * kDim);
  for (std::uint32_t l = 0; l < kLayers; ++l) {
    const std::size_t at = (std::size_t{l} * total + total - 1) * kRow;
    const CacheDesc k = whole.layer(l, 0), v = whole.layer(l, 1);
    store_kv(k, v, std::span(d.k).subspan(at, kRow), std::span(d.v).subspan(at, kRow), U32{0, 1});
    attention(k, v, std::span(d.q).subspan(std::size_t{l} * kQHeads * kDim, kQHeads * kDim),
              kQHeads, U32{0, 1},
              std::span(out).subspan(std::size_t{l} * kQHeads * kDim, kQHeads * kDim));
  }
  return out;
}

struct RoundTrip {
  std::uint32_t matched = 0;
  std::vector<std::uint8_t> pages_before, pages_after;
  std::vector<float> out_before, out_after;
};

// Process A writes a 13-token prompt (3 full pages) + 1 token, attends,
// releases; another request evicts A's pages to the tier. Process B (a new
// manager on the same tier, scales `b_scales`) matches the prompt, loads
// what the tier gives, recomputes the rest and attends the same way.
RoundTrip round_trip(DType dtype, PoolArrangement arrangement, const KVScales* a_scales,
                     const KVScales* b_scales) {
  const KVCacheParams p = params_of(dtype, arrangement);
  auto tier = std::make_shared<MemoryTier>(TierFingerprint::of(p, "model"));
  constexpr std::uint32_t kTotal = 14;
  const Data d(kTotal);
  U32 ids(kTotal);
  for (std::uint32_t i = 0; i < kTotal; ++i) ids[i] = 100 + i;
  const U32 prompt(ids.begin(), ids.begin() + 13);
  RoundTrip r;
  {
    auto a = manager_of(p, tier, a_scales);
    const SeqId s = a->claim(1)[0];
    store(*a, s, d, kTotal, 0, 13, ids);
    r.out_before = attend_last(*a, s, d, kTotal, &r.pages_before);
    a->release(s);
    const SeqId other = a->claim(1)[0];  // fills the 4-page pool: A's pages go down
    const Data filler(16);
    U32 filler_ids(16);
    for (std::uint32_t i = 0; i < 16; ++i) filler_ids[i] = 1000 + i;
    store(*a, other, filler, 16, 0, 16, filler_ids);
    a->release(other);
    a->wait_tiers();
  }
  auto b = manager_of(p, tier, b_scales);
  const SeqId s = b->claim(1)[0];
  r.matched = b->match_prefix(s, prompt);
  b->wait_loads(s);
  b->check_invariants();
  const std::uint32_t have = b->cache_length(s);
  store(*b, s, d, kTotal, have, 13 - have, ids);
  r.out_after = attend_last(*b, s, d, kTotal, &r.pages_after);
  b->check_invariants();
  return r;
}

KVScales some_scales(float base) {
  KVScales s(kLayers, kHeads);
  for (std::uint32_t l = 0; l < kLayers; ++l)
    for (std::uint32_t kv = 0; kv < 2; ++kv)
      s.set(l, kv, std::vector<float>{base * (1 + l + kv), base * (2 + l)});
  return s;
}

class QuantTier : public ::testing::TestWithParam<PoolArrangement> {};

INSTANTIATE_TEST_SUITE_P(Arrangements, QuantTier,
                         ::testing::Values(PoolArrangement::interleaved,
                                           PoolArrangement::per_layer),
                         [](const auto& info) {
                           return std::string(arrangement_name(info.param));
                         });

TEST_P(QuantTier, Int8PagesAndTheirScalesComeBackByteExact) {
  const RoundTrip r = round_trip(DType::int8, GetParam(), nullptr, nullptr);
  EXPECT_EQ(r.matched, 12u) << "the 3 full pages came from the tier";
  ASSERT_EQ(r.pages_before.size(), 3u * kLayers * 2 * (kPage * kRow + kPage * kHeads * 4));
  EXPECT_EQ(r.pages_after, r.pages_before) << "values and in-page scales";
  EXPECT_EQ(r.out_after, r.out_before);
}

TEST_P(QuantTier, Fp8PagesComeBackByteExactUnderTheSameScales) {
  for (DType dtype : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const KVScales s = some_scales(0.01f);
    const RoundTrip r = round_trip(dtype, GetParam(), &s, &s);
    EXPECT_EQ(r.matched, 12u);
    ASSERT_EQ(r.pages_before.size(), 3u * kLayers * 2 * kPage * kRow);
    EXPECT_EQ(r.pages_after, r.pages_before);
    EXPECT_EQ(r.out_after, r.out_before);
  }
}

// The codes written under scales S mean other numbers under S': the tier
// keys of a manager with S' differ, so it finds nothing and computes the
// prompt itself, and its output is what S' gives (not S's codes read as S').
TEST_P(QuantTier, Fp8PagesOfOtherScalesAreNeverLoaded) {
  const KVScales s = some_scales(0.01f), other = some_scales(0.02f);
  ASSERT_NE(s.digest(), other.digest());
  const RoundTrip r = round_trip(DType::fp8_e4m3, GetParam(), &s, &other);
  EXPECT_EQ(r.matched, 0u);
  const RoundTrip fresh = round_trip(DType::fp8_e4m3, GetParam(), &other, &other);
  EXPECT_EQ(r.pages_after, fresh.pages_before) << "B computed every page under its scales";
  EXPECT_EQ(r.out_after, fresh.out_before);
  // The default scales (1) are scales too: pages written under them stay apart.
  EXPECT_EQ(round_trip(DType::fp8_e4m3, GetParam(), nullptr, &s).matched, 0u);
  EXPECT_EQ(round_trip(DType::fp8_e4m3, GetParam(), nullptr, nullptr).matched, 12u);
}

// A tier's page is the manager's: int8's in-page scales included (without
// them every int8 write-back was refused as the wrong size).
TEST(QuantTierFingerprint, PageBytesAreTheManagersForEveryDType) {
  for (DType dtype :
       {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2, DType::int8}) {
    const KVCacheParams p = params_of(dtype, PoolArrangement::interleaved);
    EXPECT_EQ(TierFingerprint::of(p).page_bytes(), kPage * p.bytes_per_token_per_device())
        << dtype_name(dtype);
  }
}

TEST(KVScalesDigest, EqualScalesEqualDigests) {
  EXPECT_EQ(some_scales(0.5f).digest(), some_scales(0.5f).digest());
  EXPECT_NE(some_scales(0.5f).digest(), some_scales(0.25f).digest());
  EXPECT_NE(KVScales(2, 2).digest(), KVScales(2, 4).digest());
  EXPECT_NE(KVScales(1, 4).digest(), KVScales(2, 2).digest()) << "same count, other shape";
}

}  // namespace
}  // namespace kvcache
