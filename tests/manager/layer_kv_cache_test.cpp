// The ferrum-style facade addresses exactly what the per-layer views address,
// for both layouts, K and V separately, with shuffled page tables.
#include <gtest/gtest.h>

#include <random>
#include <tuple>
#include <vector>

#include "kvcache/kvcache.h"

namespace kvcache {
namespace {

KVCacheParams params(CacheStrategy s, PageLayout layout = PageLayout::nhd,
                     PoolArrangement arrangement = PoolArrangement::interleaved) {
  KVCacheParams p;
  p.page_layout = layout;
  p.pool_arrangement = arrangement;
  p.dtype = DType::bf16;
  p.num_layers = 3;
  p.n_kv_heads = 2;
  p.head_dim = 8;
  p.cache_strategy = s;
  p.page_size = s == CacheStrategy::paged ? 4 : 0;
  return p;
}

template <class Collection>
void expect_same_addresses(const Collection& c, const std::vector<std::uint32_t>& lengths) {
  for (std::uint32_t layer = 0; layer < c.num_layers(); ++layer) {
    for (std::uint32_t b = 0; b < c.batch_size(); ++b) {
      const auto f = make_layer_kv_cache(c, layer, b);
      const auto k = c.get_key_cache(layer), v = c.get_value_cache(layer);
      EXPECT_EQ(f.len, c.cache_length(b));
      if (f.is_paged()) {
        ASSERT_EQ(f.context_lens.size(), 1u);
        EXPECT_EQ(f.context_lens[0], c.cache_length(b));
        EXPECT_EQ(f.capacity, lengths[b]);  // the reserved room
      } else {
        EXPECT_TRUE(f.context_lens.empty());  // ferrum: None when contiguous
        EXPECT_GE(f.capacity, lengths[b]);
      }
      EXPECT_NE(f.k, f.v);
      for (std::uint32_t pos = 0; pos < lengths[b]; ++pos)
        for (std::uint32_t h = 0; h < f.num_kv_heads; ++h) {
          ASSERT_EQ(f.k_at(pos, h), k.ptr(b, h, pos, 0))
              << "layer " << layer << " b " << b << " pos " << pos;
          ASSERT_EQ(f.v_at(pos, h), v.ptr(b, h, pos, 0));
        }
    }
  }
}

class LayerKvCacheLayouts
    : public ::testing::TestWithParam<std::tuple<PageLayout, PoolArrangement>> {};

TEST_P(LayerKvCacheLayouts, PagedMatchesViewsWithShuffledPages) {
  const auto [layout, arrangement] = GetParam();
  PagedKVCacheManager m(params(CacheStrategy::paged, layout, arrangement), 64, 4, 64);
  auto churn = m.claim(4);  // scatter the free list
  for (SeqId id : churn) m.fetch(std::vector<SeqId>{id}, std::vector<std::uint32_t>{7});
  for (SeqId id : {churn[2], churn[0], churn[3], churn[1]}) m.release(id);
  const auto ids = m.claim(3);
  const std::vector<std::uint32_t> lengths{13, 1, 30};
  m.step(ids, std::vector<std::uint32_t>{0, 0, 0});
  KVCacheBatch b = m.fetch(ids, lengths);
  const auto c = b.paged<BFloat16>();
  expect_same_addresses(c, lengths);
  const auto f = make_layer_kv_cache(c, 2, 2);
  EXPECT_EQ(f.layout, layout);
  EXPECT_TRUE(f.is_paged());
  EXPECT_EQ(f.block_size, 4u);
  EXPECT_EQ(f.block_table.size(), 8u);  // ceil(30 / 4)
  EXPECT_EQ(f.capacity, 30u);           // reserved, though 8 pages hold 32
  EXPECT_EQ(f.paged_block_indices.data(), f.block_table.data());
}

TEST_P(LayerKvCacheLayouts, ContiguousMatchesViews) {
  const auto [layout, arrangement] = GetParam();
  ContinuousBatchingKVCacheManager m(params(CacheStrategy::continuous, layout, arrangement), 3, 40);
  const auto ids = m.claim(3);
  const std::vector<std::uint32_t> lengths{5, 40, 17};
  KVCacheBatch b = m.fetch(ids, lengths);
  const auto c = b.continuous<BFloat16>();
  expect_same_addresses(c, lengths);
  const auto f = make_layer_kv_cache(c, 0, 1);
  EXPECT_FALSE(f.is_paged());
  EXPECT_EQ(f.capacity, 40u);
  EXPECT_TRUE(f.block_table.empty());
}

INSTANTIATE_TEST_SUITE_P(Both, LayerKvCacheLayouts,
                         ::testing::Combine(::testing::Values(PageLayout::nhd, PageLayout::hnd),
                                            ::testing::Values(PoolArrangement::interleaved,
                                                              PoolArrangement::per_layer)));

TEST(LayerKvCache, BadIndicesAreRefused) {
  PagedKVCacheManager m(params(CacheStrategy::paged), 8, 2, 16);
  const auto ids = m.claim(1);
  KVCacheBatch b = m.fetch(ids, std::vector<std::uint32_t>{3});
  const auto c = b.paged<BFloat16>();
  EXPECT_THROW(make_layer_kv_cache(c, 3, 0), InvalidArgument);
  try {
    make_layer_kv_cache(c, 0, 1);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("batch index 1"), std::string::npos);
  }
}

}  // namespace
}  // namespace kvcache
