// The medium-independent part of the tier interface: fingerprints, page keys
// and tickets.
#include "kvcache/tier.h"

#define XXH_INLINE_ALL
#include <gtest/gtest.h>
#include <xxhash.h>

#include <thread>
#include <vector>

#include "kvcache/error.h"
#include "tier/eviction_log.h"
#include "tier/ticket_state.h"

namespace kvcache {
namespace {

KVCacheParams params() {
  KVCacheParams p;
  p.dtype = DType::bf16;
  p.num_layers = 4;
  p.n_kv_heads = 8;
  p.head_dim = 64;
  p.cache_strategy = CacheStrategy::paged;
  p.page_size = 16;
  p.n_devices = 2;
  return p;
}

TEST(TierFingerprint, OfParamsAndPageBytes) {
  const TierFingerprint f = TierFingerprint::of(params(), "llama", "salt", 1);
  EXPECT_EQ(f.n_kv_heads, 4u);  // per device
  EXPECT_EQ(f.layer_end, 4u);
  EXPECT_EQ(f.device_index, 1u);
  EXPECT_EQ(f.page_bytes(), std::size_t{2} * 4 * 16 * 4 * 64 * 2);
  EXPECT_THROW(TierFingerprint::of(params(), "", "", 2), InvalidArgument);
}

TEST(TierFingerprint, ShardsChainOneKeyUnderMasksOfTheirOwn) {
  const TierFingerprint s0 = TierFingerprint::of(params(), "m", "s", 0);
  const TierFingerprint s1 = TierFingerprint::of(params(), "m", "s", 1);
  EXPECT_EQ(s0.chain_digest(), s1.chain_digest()) << "one chain for every shard";
  EXPECT_EQ(s0.chain_digest(), s0.digest());
  EXPECT_NE(s0.shard_mask(), s1.shard_mask());
  EXPECT_NE(s0.shard_mask(), PageKey{});
  const PageKey k{0x1234, 0x5678};
  EXPECT_NE(shard_key(k, s0.shard_mask()), shard_key(k, s1.shard_mask()));
  EXPECT_EQ(shard_key(shard_key(k, s1.shard_mask()), s1.shard_mask()), k);
  // One device: the chain key is the tier's key, as before shards existed.
  KVCacheParams one = params();
  one.n_devices = 1;
  const TierFingerprint whole = TierFingerprint::of(one, "m", "s");
  EXPECT_EQ(whole.shard_mask(), PageKey{});
  EXPECT_EQ(whole.chain_digest(), whole.digest());
}

TEST(TierFingerprint, DigestChangesWithEveryField) {
  const TierFingerprint base = TierFingerprint::of(params(), "m", "s");
  std::vector<TierFingerprint> changed(11, base);
  changed[0].dtype = DType::f16;
  changed[1].layout = PageLayout::hnd;
  changed[2].page_size = 32;
  changed[3].n_kv_heads = 2;
  changed[4].head_dim = 128;
  changed[5].layer_begin = 1;
  changed[6].layer_end = 3;
  changed[7].device_index = 1;
  changed[8].device_count = 4;
  changed[9].model_id = "m2";
  changed[10].cache_salt = "";
  for (const TierFingerprint& c : changed) EXPECT_NE(c.digest(), base.digest());
  EXPECT_EQ(TierFingerprint::of(params(), "m", "s").digest(), base.digest());
  // The strings are length-prefixed: moving a character between them changes the digest.
  TierFingerprint a = base, b = base;
  a.model_id = "ab", a.cache_salt = "c";
  b.model_id = "a", b.cache_salt = "bc";
  EXPECT_NE(a.digest(), b.digest());
}

TEST(PageKeyTest, ChainsOverParentTokensAndNamespace) {
  const std::vector<std::uint32_t> t1{1, 2, 3, 4}, t2{1, 2, 3, 5};
  const PageKey k1 = page_key({}, t1, 7);
  EXPECT_EQ(page_key({}, t1, 7), k1);
  EXPECT_NE(page_key({}, t2, 7), k1);
  EXPECT_NE(page_key({}, t1, 8), k1);
  EXPECT_NE(page_key(k1, t1, 7), k1);
  EXPECT_NE(page_key(k1, t1, 7), page_key(page_key({}, t2, 7), t1, 7));
}

// The definition (tier.h, docs/tiers.md): XXH3-128 seeded by the digest over
// the parent's 16 bytes {hi, lo} then the token ids, streamed. Keys live on
// disk across restarts, so page_key must give exactly these values whatever
// path it takes (one call up to 1024 tokens, a stream beyond).
PageKey streamed_key(PageKey parent, std::span<const std::uint32_t> tokens, std::uint64_t digest) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset_withSeed(&state, digest);
  const std::uint64_t head[2] = {parent.hi, parent.lo};
  XXH3_128bits_update(&state, head, sizeof head);
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return {h.high64, h.low64};
}

TEST(PageKeyTest, EqualsTheStreamedDefinitionAtEverySize) {
  const PageKey parent{0x0123456789abcdefull, 42};
  for (std::size_t n : {0, 1, 3, 16, 60, 61, 512, 1023, 1024, 1025, 4096}) {
    std::vector<std::uint32_t> t(n);
    for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint32_t>(i * 2654435761u);
    EXPECT_EQ(page_key(parent, t, 99), streamed_key(parent, t, 99)) << n << " tokens";
    EXPECT_EQ(page_key({}, t, 7), streamed_key({}, t, 7)) << n << " tokens";
  }
}

TEST(EvictionLogTest, KeepsTheNewestReportsOldestFirst) {
  tier::EvictionLog log;
  std::vector<PageKey> out;
  log.take(out);
  EXPECT_TRUE(out.empty());
  const std::size_t n = Tier::kEvictionReports + 3;
  for (std::size_t i = 0; i < n; ++i) log.record({i, i});
  log.take(out);
  ASSERT_EQ(out.size(), Tier::kEvictionReports);
  EXPECT_EQ(out.front(), (PageKey{3, 3}));  // the 3 oldest gave way
  EXPECT_EQ(out.back(), (PageKey{n - 1, n - 1}));
  EXPECT_EQ(log.lost(), 3u);
  out.clear();
  log.record({7, 7});
  log.take(out);
  EXPECT_EQ(out, (std::vector<PageKey>{PageKey{7, 7}}));
}

TEST(TierTicketTest, DoneWhenEveryPageFinishedOnce) {
  auto state = TierTicket::State::for_loads(3);
  const TierTicket t(state);
  EXPECT_FALSE(t.done());
  state->finish_load(2, LoadResult::missing);
  state->finish_load(0, LoadResult::loaded);
  state->finish_load(0, LoadResult::corrupt);  // a second finish of one page is ignored
  EXPECT_FALSE(t.done());
  std::thread worker([&] { state->finish_load(1, LoadResult::corrupt); });
  t.wait();
  worker.join();
  ASSERT_TRUE(t.done());
  const std::vector<LoadResult> want{LoadResult::loaded, LoadResult::corrupt, LoadResult::missing};
  EXPECT_EQ(std::vector<LoadResult>(t.load_results().begin(), t.load_results().end()), want);
  EXPECT_TRUE(TierTicket().done());
  EXPECT_TRUE(TierTicket().store_results().empty());
  EXPECT_EQ(load_result_name(LoadResult::corrupt), "corrupt");
  EXPECT_EQ(store_result_name(StoreResult::present), "present");
}

}  // namespace
}  // namespace kvcache
