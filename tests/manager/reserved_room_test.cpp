// Kernels never touch rows a fetch did not reserve (issue 40, items 1 and 2):
// store_kv / attention check every entry's rows against its reserved room,
// never write a sentinel page, and a fork pair fetched together needs one
// copy-on-write page, not two.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kvcache/kernels/attention.h"
#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::U32;

constexpr std::uint32_t kPage = 16, kHeads = 2, kDim = 8;

KVCacheParams params(PoolArrangement arrangement = PoolArrangement::interleaved) {
  KVCacheParams p = kvtest::make_params(CacheStrategy::paged, 2, kHeads, kDim, kPage);
  p.pool_arrangement = arrangement;
  return p;
}

std::vector<float> rows(std::uint32_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  return kvtest::random_vec(rng, std::size_t{n} * kHeads * kDim);
}

// fetch([a, b], [1, 100]) then row_offsets [0, 100, 101]: entry a reserved
// one row, the call gives it 100. Before the check, a's rows 16..99 went to
// the sentinel page, past the end of the pool.
TEST(ReservedRoom, StoreAndAttentionRefuseRowsPastAnEntrysReservation) {
  for (PoolArrangement arrangement : {PoolArrangement::interleaved, PoolArrangement::per_layer}) {
    PagedKVCacheManager m(params(arrangement), 16, 4, 256);
    const auto ids = m.claim(2);
    const KVCacheBatch batch = m.fetch(ids, U32{1, 100});
    const auto before = kvtest::copy_buffers(m, batch);
    const auto coll = batch.paged<float>();
    const U32 offsets{0, 100, 101};
    const auto k_new = rows(101, 1), v_new = rows(101, 2);
    KV_EXPECT_THROW(store_kv(coll.get_key_cache(0), coll.get_value_cache(0), k_new, v_new, offsets),
                    InvalidArgument, "entry 0", "100 new tokens", "1 tokens its fetch reserved");
    KV_EXPECT_THROW(
        store_kv_reference(coll.get_key_cache(0), coll.get_value_cache(0), k_new, v_new, offsets),
        InvalidArgument, "entry 0");
    std::vector<float> q(std::size_t{101} * kHeads * kDim, 0.5f), out(q.size());
    KV_EXPECT_THROW(
        attention(coll.get_key_cache(0), coll.get_value_cache(0), q, kHeads, offsets, out),
        InvalidArgument, "entry 0");
    EXPECT_EQ(kvtest::copy_buffers(m, batch), before) << "a refused call wrote the pool";
    // Within the reservation the same call shape works.
    const U32 fits{0, 1, 101};
    store_kv(coll.get_key_cache(0), coll.get_value_cache(0), k_new, v_new, fits);
    m.check_invariants();
  }
}

// A view built by hand without reserved_lengths: the room is the blocks each
// entry's table row holds, never the sentinel.
TEST(ReservedRoom, WithoutReservedLengthsTheTableRowIsTheLimit) {
  PagedKVCacheManager m(params(), 16, 4, 256);
  const auto ids = m.claim(2);
  const KVCacheBatch batch = m.fetch(ids, U32{1, 40});  // 1 page and 3 pages
  CacheDesc d = batch.desc();
  d.reserved_lengths = nullptr;
  const PagedKVCacheCollection<float> coll(d);
  EXPECT_EQ(coll.get_key_cache(0).reserved_length(0), kPage);
  const auto k_new = rows(41, 3), v_new = rows(41, 4);
  KV_EXPECT_THROW(
      store_kv(coll.get_key_cache(1), coll.get_value_cache(1), k_new, v_new, U32{0, 17, 41}),
      InvalidArgument, "entry 0", "17 new tokens");
  store_kv(coll.get_key_cache(1), coll.get_value_cache(1), k_new, v_new, U32{0, 16, 41});
}

// A sequence truncated into a page it shares with its fork child, fetched
// with 0 new tokens beside one that fetched 16, must not be given rows: it
// got no copy-on-write, and its rows would overwrite the child's K/V.
TEST(ReservedRoom, AForkParentWithNoReservationCannotOverwriteItsChild) {
  PagedKVCacheManager m(params(), 16, 4, 256);
  const auto ids = m.claim(2);
  const SeqId parent = ids[0], other = ids[1];
  m.fetch(Ids{parent}, U32{20});
  {  // the parent's K/V: 20 tokens
    const KVCacheBatch b = m.fetch(Ids{parent}, U32{20});
    const auto c = b.paged<float>();
    const auto k = rows(20, 5), v = rows(20, 6);
    for (std::uint32_t layer = 0; layer < 2; ++layer)
      store_kv(c.get_key_cache(layer), c.get_value_cache(layer), k, v, U32{0, 20});
  }
  m.step(Ids{parent}, U32{20});
  const SeqId child = m.fork(parent);
  m.truncate(parent, 8);  // into page 0, which the child shares
  const KVCacheBatch probe = m.fetch(Ids{child}, U32{0});
  const std::vector<float> child_k0(
      probe.paged<float>().get_key_cache(0).ptr(0, 0, 0),
      probe.paged<float>().get_key_cache(0).ptr(0, 0, 0) + std::size_t{kPage} * kHeads * kDim);
  const KVCacheBatch batch = m.fetch(Ids{parent, other}, U32{0, 16});
  EXPECT_TRUE(batch.block_copies().empty());  // nothing to write, nothing copied
  const auto coll = batch.paged<float>();
  const auto k_new = rows(24, 7), v_new = rows(24, 8);
  KV_EXPECT_THROW(
      store_kv(coll.get_key_cache(0), coll.get_value_cache(0), k_new, v_new, U32{0, 8, 24}),
      InvalidArgument, "entry 0", "8 new tokens after 8 cached");
  const KVCacheBatch after = m.fetch(Ids{child}, U32{0});
  const float* k0 = after.paged<float>().get_key_cache(0).ptr(0, 0, 0);
  EXPECT_EQ(std::vector<float>(k0, k0 + child_k0.size()), child_k0);
  m.check_invariants();
}

// A parent and its fork child fetched together write into one shared page:
// the first writer copies, the second then holds the page alone. One copy
// page is needed, and a pool with exactly one free page serves them.
TEST(ReservedRoom, AForkPairFetchedTogetherNeedsOneCopy) {
  for (PoolArrangement arrangement : {PoolArrangement::interleaved, PoolArrangement::per_layer}) {
    PagedKVCacheManager m(params(arrangement), 3, 4, 64);
    const SeqId parent = m.claim(1)[0];
    m.fetch(Ids{parent}, U32{20});  // 2 pages, the second partial
    m.step(Ids{parent}, U32{20});
    const SeqId child = m.fork(parent);
    ASSERT_EQ(m.free_blocks(), 1u);
    const KVCacheBatch batch = m.fetch(Ids{parent, child}, U32{1, 1});
    ASSERT_EQ(batch.block_copies().size(), 1u);
    EXPECT_EQ(m.free_blocks(), 0u);
    const auto coll = batch.paged<float>();
    EXPECT_NE(coll.get_key_cache(0).block_id(0, 1), coll.get_key_cache(0).block_id(1, 1));
    m.step(Ids{parent, child}, U32{1, 1});
    m.check_invariants();
  }
}

// The copy a fork pair's fetch makes holds every layer's K and V of the page,
// in both arrangements.
TEST(ReservedRoom, CopyOnWriteCopiesEveryLayerInBothArrangements) {
  for (PoolArrangement arrangement : {PoolArrangement::interleaved, PoolArrangement::per_layer}) {
    PagedKVCacheManager m(params(arrangement), 8, 4, 64);
    const SeqId parent = m.claim(1)[0];
    const auto k = rows(20, 9), v = rows(20, 10);
    {
      const KVCacheBatch b = m.fetch(Ids{parent}, U32{20});
      const auto c = b.paged<float>();
      for (std::uint32_t layer = 0; layer < 2; ++layer)
        store_kv(c.get_key_cache(layer), c.get_value_cache(layer), k, v, U32{0, 20});
    }
    m.step(Ids{parent}, U32{20});
    const SeqId child = m.fork(parent);
    const KVCacheBatch batch = m.fetch(Ids{child}, U32{1});
    ASSERT_EQ(batch.block_copies().size(), 1u);
    const auto c = batch.paged<float>();
    for (std::uint32_t layer = 0; layer < 2; ++layer) {
      for (std::uint32_t tok = 16; tok < 20; ++tok) {
        for (std::uint32_t h = 0; h < kHeads; ++h) {
          for (std::uint32_t d = 0; d < kDim; ++d) {
            const std::size_t i = (std::size_t{tok} * kHeads + h) * kDim + d;
            ASSERT_EQ(c.get_key_cache(layer).ptr(0, h, tok, d)[0], k[i]);
            ASSERT_EQ(c.get_value_cache(layer).ptr(0, h, tok, d)[0], v[i]);
          }
        }
      }
    }
  }
}

}  // namespace

namespace {

// With prefix caching, the two-argument step would leave the manager without
// the tokens' ids and silently stop publishing the sequence's later pages: it
// is refused, changing nothing; step_without_token_ids does it on purpose.
TEST(PrefixStep, WithoutTokenIdsIsRefusedUnlessOnPurpose) {
  KVCacheParams p = params();
  p.enable_prefix_caching = true;
  PagedKVCacheManager m(p, 8, 2, 64);
  const SeqId s = m.claim(1)[0];
  m.fetch(Ids{s}, U32{20});
  const auto before = m.snapshot();
  KV_EXPECT_THROW(m.step(Ids{s}, U32{20}), InvalidArgument, "step_without_token_ids");
  EXPECT_EQ(m.snapshot(), before);
  std::vector<std::uint32_t> tokens(20);
  for (std::uint32_t i = 0; i < 20; ++i) tokens[i] = 100 + i;
  m.step(Ids{s}, U32{16}, std::span<const std::uint32_t>(tokens).first(16));
  EXPECT_EQ(m.metrics().pages_published, 1u);
  m.step_without_token_ids(Ids{s}, U32{4});  // on purpose: no more publishing
  EXPECT_EQ(m.cache_length(s), 20u);
  m.step(Ids{s}, U32{0});  // nothing committed: allowed
  m.check_invariants();
  // A manager without prefix caching keeps the plain step.
  PagedKVCacheManager plain(params(), 8, 2, 64);
  const SeqId t = plain.claim(1)[0];
  plain.fetch(Ids{t}, U32{5});
  plain.step(Ids{t}, U32{5});
  EXPECT_EQ(plain.cache_length(t), 5u);
  // The capability instead of a downcast.
  KVCacheManager& base = m;
  EXPECT_EQ(base.paged(), &m);
  ContinuousBatchingKVCacheManager c(kvtest::make_params(CacheStrategy::continuous, 1, 1, 8), 1, 8);
  EXPECT_EQ(static_cast<KVCacheManager&>(c).paged(), nullptr);
}

}  // namespace
