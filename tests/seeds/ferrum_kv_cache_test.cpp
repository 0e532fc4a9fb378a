// Conformance with seed page 004: ferrum's `pub struct KvCache<B: Backend>`
// (seed 004_10d568028917798b.txt, docs/seeds.md), as LayerKvCache<T>
// (kvcache/layer_kv_cache.h) over a collection with PageLayout::hnd and
// PoolArrangement::per_layer. Each test quotes the sentence it checks.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::U32;

constexpr std::uint32_t kLayers = 2, kHeads = 3, kDim = 4, kBlock = 4;

KVCacheParams ferrum_params(CacheStrategy s) {
  KVCacheParams p =
      kvtest::make_params(s, kLayers, kHeads, kDim, s == CacheStrategy::paged ? kBlock : 0);
  p.page_layout = PageLayout::hnd;
  p.pool_arrangement = PoolArrangement::per_layer;
  return p;
}

// Writes a distinct value at every (head, pos, d) of layer `layer` through
// the view's own accessors; returns them in [pos][head][d] order.
std::vector<float> fill(const LayerKvCache<float>& c, std::uint32_t len, std::uint64_t seed,
                        bool value) {
  std::mt19937_64 rng(seed);
  std::vector<float> out;
  for (std::uint32_t pos = 0; pos < len; ++pos)
    for (std::uint32_t h = 0; h < c.num_kv_heads; ++h)
      for (std::uint32_t d = 0; d < c.head_dim; ++d) {
        const float x = kvtest::nonzero(rng);
        (value ? c.v_at(pos, h) : c.k_at(pos, h))[d] = x;
        out.push_back(x);
      }
  return out;
}

// "Paged (vLLM-style): k/v are [num_blocks, num_kv_heads, block_size,
// head_dim] block pools. block_size > 0 and block_table
// (u32[max_num_blocks_per_seq]) + context_lens (u32[1] single-seq for now)
// are populated."
TEST(SeedFerrumKvCache, PagedBuffersAreBlocksHeadsTokensDim) {
  PagedKVCacheManager m(ferrum_params(CacheStrategy::paged), 16, 4, 64);
  const auto ids = m.claim(2);
  m.fetch(Ids{ids[1]}, U32{5});  // entry 1's pages come first: the table is not 0, 1, 2
  const KVCacheBatch batch = m.fetch(ids, U32{10, 1});
  const auto coll = batch.paged<float>();
  for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
    const LayerKvCache<float> c = make_layer_kv_cache(coll, layer, 0);
    ASSERT_GT(c.block_size, 0u);
    ASSERT_EQ(c.block_size, kBlock);
    ASSERT_EQ(c.context_lens.size(), 1u);
    EXPECT_EQ(c.context_lens[0], c.len);
    ASSERT_EQ(c.block_table.size(), 3u);  // 10 tokens in blocks of 4
    const std::vector<float> k = fill(c, 10, 11 + layer, false);
    const std::vector<float> v = fill(c, 10, 21 + layer, true);
    // ferrum-style indexing: k + blk * H * bs * D + h * bs * D + t * D + d.
    std::size_t i = 0;
    for (std::uint32_t pos = 0; pos < 10; ++pos)
      for (std::uint32_t h = 0; h < kHeads; ++h)
        for (std::uint32_t d = 0; d < kDim; ++d, ++i) {
          const std::size_t blk = c.block_table[pos / kBlock];
          const std::size_t off = blk * kHeads * kBlock * kDim + std::size_t{h} * kBlock * kDim +
                                  (pos % kBlock) * kDim + d;
          ASSERT_EQ(c.k[off], k[i]) << "layer " << layer << " pos " << pos;
          ASSERT_EQ(c.v[off], v[i]) << "layer " << layer << " pos " << pos;
        }
  }
}

// "Contiguous (default): k/v are [num_kv_heads, capacity, head_dim] f32
// buffers. block_size == 0 and block_table / context_lens are None."
TEST(SeedFerrumKvCache, ContiguousBuffersAreHeadsCapacityDim) {
  ContinuousBatchingKVCacheManager m(ferrum_params(CacheStrategy::continuous), 3, 16);
  const auto ids = m.claim(2);
  const KVCacheBatch batch = m.fetch(ids, U32{6, 2});
  const LayerKvCache<float> c = make_layer_kv_cache(batch.continuous<float>(), 1, 0);
  EXPECT_EQ(c.block_size, 0u);
  EXPECT_FALSE(c.is_paged());
  EXPECT_TRUE(c.block_table.empty());
  EXPECT_TRUE(c.context_lens.empty());
  EXPECT_TRUE(c.paged_block_indices.empty());
  EXPECT_EQ(c.capacity, 16u);
  const std::vector<float> k = fill(c, 6, 3, false);
  std::size_t i = 0;
  for (std::uint32_t pos = 0; pos < 6; ++pos)
    for (std::uint32_t h = 0; h < kHeads; ++h)
      for (std::uint32_t d = 0; d < kDim; ++d, ++i)
        ASSERT_EQ(c.k[std::size_t{h} * c.capacity * kDim + pos * kDim + d], k[i]);
}

// "paged_block_indices: Vec<u32>. Paged: host-side mirror of the physical
// block indices owned by this cache. Lets the model's release path return
// blocks to the shared allocator without reading them back from device."
TEST(SeedFerrumKvCache, PagedBlockIndicesMirrorTheBlocksOwned) {
  PagedKVCacheManager m(ferrum_params(CacheStrategy::paged), 16, 4, 64);
  const auto ids = m.claim(1);
  const KVCacheBatch batch = m.fetch(ids, U32{9});
  const KvCache<float> c = make_layer_kv_cache(batch.paged<float>(), 0, 0);  // ferrum's name
  const auto snap = m.snapshot();
  ASSERT_EQ(snap.sequences.size(), 1u);
  EXPECT_EQ(std::vector<std::uint32_t>(c.paged_block_indices.begin(), c.paged_block_indices.end()),
            snap.sequences[0].blocks);
}

// "len: usize, capacity: usize": len is what is committed, capacity what a
// kernel may write (the room the fetch reserved), never past the blocks held.
TEST(SeedFerrumKvCache, LenAndCapacity) {
  PagedKVCacheManager m(ferrum_params(CacheStrategy::paged), 16, 4, 64);
  const auto ids = m.claim(1);
  m.fetch(ids, U32{6});
  m.step(ids, U32{6});
  const KVCacheBatch batch = m.fetch(ids, U32{1});
  const LayerKvCache<float> c = make_layer_kv_cache(batch.paged<float>(), 1, 0);
  EXPECT_EQ(c.len, 6u);
  EXPECT_EQ(c.capacity, 7u);  // 6 committed + 1 new, though 2 pages hold 8
  EXPECT_EQ(c.num_kv_heads, kHeads);
  EXPECT_EQ(c.head_dim, kDim);
}

// "Per-layer KV cache. Each model owns its own Vec<KvCache<B>> per sequence."
// One view per layer, K and V of different layers never overlap.
TEST(SeedFerrumKvCache, OneViewPerLayerWithoutOverlap) {
  PagedKVCacheManager m(ferrum_params(CacheStrategy::paged), 8, 2, 32);
  const auto ids = m.claim(1);
  const KVCacheBatch batch = m.fetch(ids, U32{8});
  const auto coll = batch.paged<float>();
  const LayerKvCache<float> l0 = make_layer_kv_cache(coll, 0, 0);
  const LayerKvCache<float> l1 = make_layer_kv_cache(coll, 1, 0);
  const std::vector<float> k0 = fill(l0, 8, 1, false), v0 = fill(l0, 8, 2, true);
  const std::vector<float> k1 = fill(l1, 8, 3, false), v1 = fill(l1, 8, 4, true);
  std::size_t i = 0;
  for (std::uint32_t pos = 0; pos < 8; ++pos)
    for (std::uint32_t h = 0; h < kHeads; ++h)
      for (std::uint32_t d = 0; d < kDim; ++d, ++i) {
        ASSERT_EQ(l0.k_at(pos, h)[d], k0[i]);
        ASSERT_EQ(l0.v_at(pos, h)[d], v0[i]);
        ASSERT_EQ(l1.k_at(pos, h)[d], k1[i]);
        ASSERT_EQ(l1.v_at(pos, h)[d], v1[i]);
      }
}

}  // namespace
