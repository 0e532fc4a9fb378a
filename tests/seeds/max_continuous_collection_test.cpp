// Conformance with seed page 000: Mojo struct ContinuousBatchingKVCacheCollection
// (seed 000_c02b956dcc7af99e.txt, docs/seeds.md). Each test quotes the sentence it checks.
#include <gtest/gtest.h>

#include <type_traits>
#include <vector>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::U32;

KVCacheParams continuous_params(std::uint32_t layers, std::uint32_t heads, std::uint32_t dim) {
  return kvtest::make_params(CacheStrategy::continuous, layers, heads, dim);
}

// "This is a "view" of the cache for the given sequences in the batch. This
// object does not own the underlying buffers in k_cache and v_cache, it's
// borrowing them from the BlockWrappers in our KVCacheManager."
TEST(SeedContinuousCollection, IsAViewBorrowingTheManagersBuffers) {
  static_assert(std::is_trivially_copyable_v<ContinuousBatchingKVCacheCollection<float>>);
  ContinuousBatchingKVCacheManager m(continuous_params(2, 2, 4), 3, 8);
  const auto ids = m.claim(2);
  const KVCacheBatch batch = m.fetch(ids, U32{3, 1});
  const auto coll = batch.continuous<float>();
  EXPECT_EQ(static_cast<void*>(coll.blocks()), batch.blocks());
  {
    const auto copy = coll;  // copying a view copies no cache memory
    copy.get_key_cache(1).ptr(1, 1, 0)[3] = 42.0f;
  }
  EXPECT_EQ(coll.get_key_cache(1).ptr(1, 1, 0)[3], 42.0f);  // the write reached the pool
}

// "__init__(out self, blocks, cache_lengths, lookup_table, max_seq_length,
// max_cache_length)" and "blocks_shape = DimList(Dim(-31337) x 4,
// Dim(kv_params_.num_heads), Dim(kv_params_.head_size))": a collection built
// from caller memory of shape [slots][2][layers][max_seq_len][heads][head_size].
TEST(SeedContinuousCollection, InitFromBlocksLengthsTableAndMaxima) {
  constexpr std::uint32_t kSlots = 3, kLayers = 2, kSeq = 8, kHeads = 2, kDim = 4;
  std::vector<float> blocks(std::size_t{kSlots} * 2 * kLayers * kSeq * kHeads * kDim);
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<float>(i) + 0.5f;
  const U32 cache_lengths{0, 4};
  const U32 lookup_table{2, 0};  // entry 0 in slot 2, entry 1 in slot 0
  CacheDesc d;
  d.blocks = blocks.data();
  d.cache_lengths = cache_lengths.data();
  d.lookup_table = lookup_table.data();
  d.lookup_stride = 1;
  d.batch_size = 2;
  d.max_seq_length = 3;    // MAX: the most new tokens of an entry
  d.max_cache_length = 4;  // MAX: the most cached tokens of an entry
  d.num_layers = kLayers;
  d.page_size = kSeq;
  d.n_kv_heads = kHeads;
  d.head_dim = kDim;
  d.num_blocks = kSlots;
  const ContinuousBatchingKVCacheCollection<float> coll(d);
  EXPECT_EQ(coll.max_seq_length(), 3u);
  EXPECT_EQ(coll.max_cache_length(), 4u);
  // Element [slot][kv][layer][tok][head][dim] of the 6-D blocks.
  auto at = [&](std::size_t slot, std::size_t kv, std::size_t layer, std::size_t tok,
                std::size_t head, std::size_t dim) {
    return blocks[((((slot * 2 + kv) * kLayers + layer) * kSeq + tok) * kHeads + head) * kDim +
                  dim];
  };
  EXPECT_EQ(coll.get_key_cache(1).ptr(0, 1, 5, 2)[0], at(2, 0, 1, 5, 1, 2));
  EXPECT_EQ(coll.get_value_cache(0).ptr(1, 0, 3, 1)[0], at(0, 1, 0, 3, 0, 1));
}

// MAX-style values: a context-encoding step has cache_lengths {0},
// max_seq_length = the prompt and max_cache_length = 0 (the history).
TEST(SeedContinuousCollection, AcceptsMaxStyleContextEncodingValues) {
  std::vector<float> blocks(2 * 1 * 8 * 1 * 4, 1.0f);
  const U32 cache_lengths{0}, lookup_table{0};
  CacheDesc d;
  d.blocks = blocks.data();
  d.cache_lengths = cache_lengths.data();
  d.lookup_table = lookup_table.data();
  d.lookup_stride = 1;
  d.batch_size = 1;
  d.max_seq_length = 5;
  d.max_cache_length = 0;
  d.num_layers = 1;
  d.page_size = 8;
  d.n_kv_heads = 1;
  d.head_dim = 4;
  d.num_blocks = 1;
  const ContinuousBatchingKVCacheCollection<float> coll(d);
  EXPECT_EQ(coll.get_key_cache(0).max_context_length(), 0u);
  EXPECT_EQ(coll.get_key_cache(0).max_prompt_length(), 5u);
  EXPECT_TRUE(coll.get_key_cache(0).empty_cache());
}

// "get_key_cache(self, layer_idx: Int) -> ContinuousBatchingKVCache" and
// "get_value_cache(self, layer_idx: Int) -> ContinuousBatchingKVCache": K and V
// of every layer are different memory.
TEST(SeedContinuousCollection, KeyAndValueCachesPerLayerAreDistinct) {
  ContinuousBatchingKVCacheManager m(continuous_params(3, 2, 4), 2, 8);
  const auto ids = m.claim(1);
  const auto batch = m.fetch(ids, U32{2});
  const auto coll = batch.continuous<float>();
  static_assert(std::is_same_v<decltype(coll.get_key_cache(0)), ContinuousBatchingKVCache<float>>);
  std::vector<const float*> seen;
  for (std::uint32_t l = 0; l < 3; ++l) {
    seen.push_back(coll.get_key_cache(l).ptr(0, 0, 0));
    seen.push_back(coll.get_value_cache(l).ptr(0, 0, 0));
  }
  for (std::size_t i = 0; i < seen.size(); ++i)
    for (std::size_t j = i + 1; j < seen.size(); ++j) EXPECT_NE(seen[i], seen[j]);
  EXPECT_THROW((void)coll.get_key_cache(3), InvalidArgument);
}

// "cache_length(self, bs_idx: Int) -> Int"
TEST(SeedContinuousCollection, CacheLengthPerBatchIndex) {
  ContinuousBatchingKVCacheManager m(continuous_params(1, 1, 4), 3, 16);
  const auto ids = m.claim(3);
  m.fetch(ids, U32{5, 2, 7});
  m.step(ids, U32{5, 2, 7});
  const auto batch = m.fetch(Ids{ids[2], ids[0]}, U32{1, 1});
  const auto coll = batch.continuous<float>();
  EXPECT_EQ(coll.cache_length(0), 7u);
  EXPECT_EQ(coll.cache_length(1), 5u);
  EXPECT_EQ(coll.get_value_cache(0).cache_length(1), 5u);
}

// "copy(self) -> Self: Explicitly construct a copy of self." A copy views the
// same cache with the same lengths.
TEST(SeedContinuousCollection, CopyViewsTheSameCache) {
  ContinuousBatchingKVCacheManager m(continuous_params(1, 1, 4), 1, 8);
  const auto batch = m.fetch(m.claim(1), U32{3});
  const auto coll = batch.continuous<float>();
  const ContinuousBatchingKVCacheCollection<float> copy = coll.copy();
  EXPECT_EQ(copy.blocks(), coll.blocks());
  EXPECT_EQ(copy.cache_lengths(), coll.cache_lengths());
  EXPECT_EQ(copy.max_seq_length(), coll.max_seq_length());
}

}  // namespace
