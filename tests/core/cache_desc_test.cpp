// CacheDesc: strides resolved from the geometry, per-layer descriptors,
// validation, and the typed wrappers over it.
#include "kvcache/cache_desc.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kvcache/collection.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/paged_manager.h"

namespace kvcache {
namespace {

using U32 = std::vector<std::uint32_t>;

// A geometry with every dimension distinct, so a stride that mixes two up
// cannot pass: 5 blocks, 3 layers, 4 tokens, 2 heads, 6 dims.
CacheDesc geometry(PageLayout layout, PoolArrangement arrangement) {
  CacheDesc d;
  d.num_blocks = 5;
  d.num_layers = 3;
  d.page_size = 4;
  d.n_kv_heads = 2;
  d.head_dim = 6;
  d.layout = layout;
  d.arrangement = arrangement;
  return d.with_strides();
}

TEST(CacheDesc, StridesOfEachLayoutAndArrangement) {
  const std::size_t e = 4 * 2 * 6;  // one layer's K of one block
  const CacheDesc a = geometry(PageLayout::nhd, PoolArrangement::interleaved);
  EXPECT_EQ(a.block_elements(), e);
  EXPECT_EQ(a.block_stride, 2 * 3 * e);
  EXPECT_EQ(a.layer_stride, e);
  EXPECT_EQ(a.kv_stride, 3 * e);
  EXPECT_EQ(a.token_stride, 2u * 6);
  EXPECT_EQ(a.head_stride, 6u);
  const CacheDesc b = geometry(PageLayout::hnd, PoolArrangement::per_layer);
  EXPECT_EQ(b.block_stride, e);
  EXPECT_EQ(b.layer_stride, 2 * 5 * e);
  EXPECT_EQ(b.kv_stride, 5 * e);
  EXPECT_EQ(b.token_stride, 6u);
  EXPECT_EQ(b.head_stride, 4u * 6);
  EXPECT_EQ(a.pool_elements(), 5 * 2 * 3 * e);
  EXPECT_EQ(b.pool_elements(), a.pool_elements());
}

// Every (layer, kv, block, row, head) maps to a distinct element inside the
// pool, for both arrangements and layouts: the offsets tile the pool exactly.
TEST(CacheDesc, OffsetsTileThePool) {
  for (const PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
    for (const PoolArrangement arr : {PoolArrangement::interleaved, PoolArrangement::per_layer}) {
      const CacheDesc d = geometry(layout, arr);
      std::vector<int> hits(d.pool_elements(), 0);
      for (std::uint32_t l = 0; l < d.num_layers; ++l)
        for (std::uint32_t kv = 0; kv < 2; ++kv)
          for (std::uint32_t blk = 0; blk < d.num_blocks; ++blk)
            for (std::uint32_t r = 0; r < d.page_size; ++r)
              for (std::uint32_t h = 0; h < d.n_kv_heads; ++h)
                for (std::uint32_t x = 0; x < d.head_dim; ++x) {
                  const std::size_t at = d.layer_offset(l, kv) + d.elem_offset(blk, r, h) + x;
                  ASSERT_LT(at, hits.size());
                  ++hits[at];
                }
      for (int h : hits) ASSERT_EQ(h, 1);
    }
  }
}

TEST(CacheDesc, LayerAdvancesBlocksByTheLayerOffsetInBytes) {
  std::vector<std::uint16_t> pool(
      geometry(PageLayout::nhd, PoolArrangement::per_layer).pool_elements());
  for (const PoolArrangement arr : {PoolArrangement::interleaved, PoolArrangement::per_layer}) {
    CacheDesc d = geometry(PageLayout::nhd, arr);
    d.blocks = pool.data();
    d.dtype = DType::bf16;
    const CacheDesc v2 = d.layer(2, 1);
    EXPECT_EQ(static_cast<std::uint16_t*>(v2.blocks), pool.data() + d.layer_offset(2, 1));
    EXPECT_EQ(v2.block_stride, d.block_stride);
    EXPECT_EQ(v2.num_layers, d.num_layers);
    EXPECT_THROW((void)d.layer(3, 0), InvalidArgument);
    EXPECT_THROW((void)d.layer(0, 2), InvalidArgument);
  }
}

struct OwnDesc {
  std::vector<float> pool;
  U32 lengths{3, 0};
  U32 table{4, 1, 2, 5};  // stride 2; entry 0 pages {4, 1}, entry 1 page {2}
  CacheDesc d;
  OwnDesc() {
    d = geometry(PageLayout::nhd, PoolArrangement::interleaved);
    pool.assign(d.pool_elements(), 0.5f);
    d.blocks = pool.data();
    d.cache_lengths = lengths.data();
    d.lookup_table = table.data();
    d.lookup_stride = 2;
    d.batch_size = 2;
    d.max_seq_length = 1;
    d.max_cache_length = 3;
  }
};

TEST(CacheDesc, ValidateRefusesStridesOtherThanTheGeometrys) {
  OwnDesc o;
  EXPECT_NO_THROW(o.d.validate());
  for (std::size_t CacheDesc::*field :
       {&CacheDesc::block_stride, &CacheDesc::layer_stride, &CacheDesc::kv_stride,
        &CacheDesc::token_stride, &CacheDesc::head_stride}) {
    CacheDesc bad = o.d;
    bad.*field += 1;
    EXPECT_THROW(bad.validate(), InvalidArgument);
  }
  CacheDesc bad_dtype = o.d;
  bad_dtype.dtype = static_cast<DType>(7);
  EXPECT_THROW(bad_dtype.validate(), InvalidArgument);
  CacheDesc bad_entry = o.d;
  U32 table{4, 1, 9, 5};  // 9 is past the 5 blocks
  bad_entry.lookup_table = table.data();
  EXPECT_THROW(bad_entry.validate(), InvalidArgument);
}

TEST(CacheDesc, CollectionResolvesUnsetStridesAndChecksTheType) {
  OwnDesc o;
  CacheDesc unset = o.d;
  unset.block_stride = unset.layer_stride = unset.kv_stride = 0;
  unset.token_stride = unset.head_stride = 0;
  const PagedKVCacheCollection<float> c(unset);
  EXPECT_EQ(c.desc().block_stride, o.d.block_stride);
  EXPECT_EQ(c.desc().head_stride, o.d.head_stride);
  EXPECT_EQ(c.get_value_cache(1).ptr(0, 1, 2, 3),
            o.pool.data() + o.d.layer_offset(1, 1) + o.d.elem_offset(4, 2, 1) + 3);
  EXPECT_THROW(PagedKVCacheCollection<Half>{o.d}, InvalidArgument);
  EXPECT_THROW(PagedKVCache<Half>{o.d.layer(0, 0)}, InvalidArgument);
}

// What a manager's batch describes is what its views use, and the kernels
// taking the descriptor compute what the typed overloads compute.
TEST(CacheDesc, BatchDescDrivesTheKernels) {
  KVCacheParams p;
  p.dtype = DType::f16;
  p.num_layers = 2;
  p.n_kv_heads = 2;
  p.head_dim = 16;
  p.cache_strategy = CacheStrategy::paged;
  p.page_size = 4;
  PagedKVCacheManager m(p, 16, 4, 64);
  const std::vector<SeqId> ids = m.claim(2);
  const U32 prompt{7, 3};
  const KVCacheBatch batch = m.fetch(ids, prompt);
  const CacheDesc d = batch.desc();
  EXPECT_EQ(d.dtype, DType::f16);
  EXPECT_EQ(d.page_size, 4u);
  EXPECT_EQ(d.block_stride, d.with_strides().block_stride);
  const auto coll = batch.paged<Half>();
  EXPECT_EQ(coll.desc().blocks, d.blocks);
  EXPECT_EQ(coll.get_key_cache(1).desc().blocks, d.layer(1, 0).blocks);

  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1, 1);
  const U32 rows{0, 7, 10};
  std::vector<float> k(10 * 2 * 16), v(k.size()), q(10 * 4 * 16);
  for (float* x : {k.data(), v.data()})
    for (std::size_t i = 0; i < k.size(); ++i) x[i] = dist(rng);
  for (float& x : q) x = dist(rng);
  store_kv(d.layer(1, 0), d.layer(1, 1), k, v, rows);
  std::vector<float> by_desc(q.size()), by_view(q.size()), by_reference(q.size());
  attention(d.layer(1, 0), d.layer(1, 1), q, 4, rows, by_desc);
  attention(coll.get_key_cache(1), coll.get_value_cache(1), q, 4, rows, by_view);
  attention_reference(coll.get_key_cache(1), coll.get_value_cache(1), q, 4, rows, by_reference);
  EXPECT_EQ(by_desc, by_view);
  for (std::size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(by_desc[i], by_reference[i], 1e-5f);

  CacheDesc v_bf16 = d.layer(1, 1);  // K and V must agree on the element type
  v_bf16.dtype = DType::bf16;
  EXPECT_THROW(attention(d.layer(1, 0), v_bf16, q, 4, rows, by_desc), InvalidArgument);
  CacheDesc k_strided = d.layer(1, 0);  // a stride the geometry does not give
  k_strided.head_stride += 1;
  EXPECT_THROW(store_kv(k_strided, d.layer(1, 1), k, v, rows), InvalidArgument);
}

}  // namespace
}  // namespace kvcache
