// Conformance with seed page 001: Mojo struct PagedKVCache[dtype_, kv_params_,
// page_size] (seed 001_28b61ec13276cf12.txt, docs/seeds.md). Each test quotes the
// sentence it checks.
#include <gtest/gtest.h>

#include <array>
#include <random>
#include <type_traits>
#include <vector>

#include "kvcache/kernels/attention.h"
#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::U32;

constexpr std::uint32_t kPage = 4, kLayers = 3, kHeads = 2, kDim = 8;

PagedKVCacheManager make_manager(PoolArrangement arrangement, std::uint32_t pages = 24) {
  KVCacheParams p = kvtest::make_params(CacheStrategy::paged, kLayers, kHeads, kDim, kPage);
  p.pool_arrangement = arrangement;
  return PagedKVCacheManager(p, pages, 4, 64);
}

// A batch whose pages interleave: entry 0 has 9 cached + 2 new, entry 1 has
// 0 cached + 6 new (context encoding).
struct Batch {
  KVCacheBatch batch;
  std::vector<SeqId> ids;
};
Batch mixed_batch(PagedKVCacheManager& m) {
  Batch out;
  out.ids = m.claim(2);
  for (int r = 0; r < 3; ++r) {
    m.fetch(Ids{out.ids[0]}, U32{3});
    m.fetch(Ids{out.ids[1]}, U32{2});  // a page of entry 1 between entry 0's
    m.step(Ids{out.ids[0]}, U32{3});
  }
  out.batch = m.fetch(out.ids, U32{2, 6});
  return out;
}

class SeedPagedKVCache : public ::testing::TestWithParam<PoolArrangement> {};

// "struct PagedKVCache[dtype_: DType, kv_params_: KVCacheStaticParams,
// page_size: Int]" with "static max_tile_size() -> Int: Returns the maximum
// tile size for the KVCache."
TEST_P(SeedPagedKVCache, PageSizeIsATemplateParameterWithStaticMaxTileSize) {
  static_assert(PagedKVCache<float, 16>::max_tile_size() == 16);
  static_assert(PagedKVCache<BFloat16, 128>::page_size_ == 128);
  static_assert(KVCacheT<PagedKVCache<Half, 32>>);
  static_assert(std::is_trivially_copyable_v<PagedKVCache<float, kPage>>);
  PagedKVCacheManager m = make_manager(GetParam());
  const Batch b = mixed_batch(m);
  const auto coll = b.batch.paged<float>();
  const PagedKVCache<float, kPage> k = coll.get_key_cache<kPage>(1);
  const PagedKVCache<float> runtime = coll.get_key_cache(1);
  EXPECT_EQ(k.page_size(), kPage);
  for (std::uint32_t tok = 0; tok < 11; ++tok)
    for (std::uint32_t h = 0; h < kHeads; ++h) EXPECT_EQ(k.ptr(0, h, tok, 3), runtime.ptr(0, h, tok, 3));
  EXPECT_THROW((void)coll.get_key_cache<8>(1), InvalidArgument);  // the cache's pages are 4
  // "static get_type_name() -> String", "static get_device_type_name() -> String"
  EXPECT_EQ((PagedKVCache<float, 16>::get_type_name()), "PagedKVCache<f32, 16>");
  EXPECT_EQ(PagedKVCache<BFloat16>::get_device_type_name(), "PagedKVCache<bf16>");
  EXPECT_THROW((PagedKVCache<float, 8>(runtime)), InvalidArgument);
}

// "cache_length(self, batch_idx: Int) -> Int: Returns the length of the cache
// for a given batch index." and "empty_cache(self) -> Bool: Returns true if
// the cache_lengths for all requests is 0, false otherwise."
TEST_P(SeedPagedKVCache, CacheLengthAndEmptyCache) {
  PagedKVCacheManager m = make_manager(GetParam());
  const Batch b = mixed_batch(m);
  const auto v = b.batch.paged<float>().get_value_cache(2);
  // "cache_lengths_nd(self) -> LayoutTensor[DType.uint32, Layout(IntTuple(-1))]"
  ASSERT_EQ(v.cache_lengths_nd().size(), 2u);
  EXPECT_EQ(v.cache_lengths_nd()[0], 9u);
  EXPECT_EQ(v.cache_length(0), 9u);
  EXPECT_EQ(v.cache_length(1), 0u);
  EXPECT_FALSE(v.empty_cache());
  const auto fresh = m.fetch(Ids{m.claim(1)[0]}, U32{5});
  EXPECT_TRUE(fresh.paged<float>().get_key_cache(0).empty_cache());
}

// "max_prompt_length: Returns the maximum sequence length across all batches
// of the current request." and "max_context_length: Returns the maximum cache
// length used across all batches of the current request." MAX computes the
// latter over cache_lengths (the history before this step's tokens).
TEST_P(SeedPagedKVCache, MaxPromptAndContextLength) {
  PagedKVCacheManager m = make_manager(GetParam());
  const Batch b = mixed_batch(m);
  const auto k = b.batch.paged<float>().get_key_cache(0);
  EXPECT_EQ(k.max_prompt_length(), 6u);              // max new tokens: 2, 6
  EXPECT_EQ(k.max_context_length(), 9u);             // max cache length: 9, 0
  EXPECT_EQ(k.max_full_context_length(), 11u);       // 9 + 2 vs 0 + 6
  EXPECT_EQ(b.batch.max_cache_length(), 9u);
  // Multistep (increment_cache_lengths): advanced by the first step's
  // max_seq_length, then by 1 a step.
  KVCacheBatch multi = m.fetch(b.ids, U32{1, 1}, 3);
  const U32 first_step{0, 1, 2};
  multi.increment_cache_lengths(first_step);
  EXPECT_EQ(multi.max_cache_length(), 9u + 1u);
  EXPECT_EQ(multi.max_seq_length(), 1u);
}

// "row_idx(self, batch_idx, tok_idx) -> UInt32: Returns the row idx when
// viewing the memory as a matrix." and "col_idx(self, head_idx) -> UInt32:
// Returns the col idx when viewing the memory as a matrix." The matrix has
// n_kv_heads * head_size columns and starts at the layer's base, so one
// descriptor covers every page of the pool.
TEST_P(SeedPagedKVCache, RowAndColumnIndexAddressEveryPage) {
  PagedKVCacheManager m = make_manager(GetParam());
  const Batch b = mixed_batch(m);
  const auto coll = b.batch.paged<float>();
  for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
    for (const auto& c : {coll.get_key_cache(layer), coll.get_value_cache(layer)}) {
      // Layer base: where page 0 of this layer's K (or V) starts.
      const float* base = c.page_ptr(0, 0) - std::size_t{c.block_id(0, 0)} * c.desc().block_stride;
      for (std::uint32_t bi = 0; bi < 2; ++bi) {
        for (std::uint32_t tok = 0; tok < (bi == 0 ? 11u : 6u); ++tok) {
          for (std::uint32_t h = 0; h < kHeads; ++h) {
            for (std::uint32_t d = 0; d < kDim; ++d) {
              const float* p =
                  base + c.row_idx(bi, tok) * (kHeads * kDim) + c.col_idx(h) + d;
              ASSERT_EQ(p, c.ptr(bi, h, tok, d)) << "entry " << bi << " tok " << tok;
            }
          }
        }
      }
    }
  }
}

// "load[width](self, bs, head_idx, tok_idx, head_dim_idx) -> SIMD: Loads an
// element from the given index." / "store(...): Stores an element at the given
// index." K and V of one layer are separate: a store to one never shows in
// the other.
TEST_P(SeedPagedKVCache, LoadReturnsWhatStoreWrote) {
  PagedKVCacheManager m = make_manager(GetParam());
  const Batch b = mixed_batch(m);
  const auto fcoll = b.batch.paged<float>();
  const auto k = fcoll.get_key_cache(2);
  const auto v = fcoll.get_value_cache(2);
  std::mt19937_64 rng(5);
  const std::array<float, 4> kv{kvtest::nonzero(rng), kvtest::nonzero(rng), kvtest::nonzero(rng),
                                kvtest::nonzero(rng)};
  const std::array<float, 4> vv{-kv[0], -kv[1], -kv[2], -kv[3]};
  k.store<4>(0, 1, 10, 4, kv);
  v.store<4>(0, 1, 10, 4, vv);
  EXPECT_EQ(k.load<4>(0, 1, 10, 4), kv);
  EXPECT_EQ(v.load<4>(0, 1, 10, 4), vv);
}

// "block_paged_ptr[tile_size](self, batch_idx, start_tok_idx, head_idx,
// head_dim_idx=0) -> pointer": a tile of tile_size tokens from there lies in
// one page.
TEST_P(SeedPagedKVCache, BlockPagedPtrPointsAtATileInOnePage) {
  PagedKVCacheManager m = make_manager(GetParam());
  const Batch b = mixed_batch(m);
  const auto k = b.batch.paged<float>().get_key_cache<kPage>(0);
  for (std::uint32_t start = 0; start < 8; start += kPage) {
    float* tile = k.block_paged_ptr<kPage>(0, start, 1, 2);
    for (std::uint32_t t = 0; t < kPage; ++t)
      EXPECT_EQ(tile + t * k.token_stride(), k.ptr(0, 1, start + t, 2));
  }
}

INSTANTIATE_TEST_SUITE_P(Arrangements, SeedPagedKVCache,
                         ::testing::Values(PoolArrangement::interleaved,
                                           PoolArrangement::per_layer));

}  // namespace
