// int8 scales live in the page: copy-on-write after fork, truncate and
// prefix reuse carry them with the values.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kvcache/kernels/attention.h"
#include "kvcache/kvcache.h"

namespace kvcache {
namespace {

using U32 = std::vector<std::uint32_t>;

KVCacheParams int8_params(bool prefix) {
  KVCacheParams p;
  p.dtype = DType::int8;
  p.num_layers = 2;
  p.n_kv_heads = 2;
  p.head_dim = 8;
  p.cache_strategy = CacheStrategy::paged;
  p.page_size = 4;
  p.enable_prefix_caching = prefix;
  return p;
}

// Dequantised K and V of every (layer, token, head, d) of entry 0 of `batch`.
std::vector<float> read_all(const KVCacheBatch& batch, std::uint32_t tokens) {
  std::vector<float> out;
  const auto col = batch.paged<Int8>();
  for (std::uint32_t l = 0; l < 2; ++l)
    for (const auto& view : {col.get_key_cache(l), col.get_value_cache(l)})
      for (std::uint32_t t = 0; t < tokens; ++t)
        for (std::uint32_t h = 0; h < 2; ++h)
          for (std::uint32_t d = 0; d < 8; ++d) out.push_back(view.load_float(0, h, t, d));
  return out;
}

void write(const KVCacheBatch& batch, std::uint32_t tokens, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-3, 3);
  std::vector<float> k(tokens * 16), v(tokens * 16);
  for (auto& x : k) x = u(rng);
  for (auto& x : v) x = u(rng);
  const U32 ro{0, tokens};
  const auto col = batch.paged<Int8>();
  for (std::uint32_t l = 0; l < 2; ++l)
    store_kv(col.get_key_cache(l), col.get_value_cache(l), k, v, ro);
}

TEST(Int8Pages, ScalesSurviveForkCopyOnWriteAndTruncate) {
  std::mt19937 rng(5);
  PagedKVCacheManager m(int8_params(false), 16, 4, 64);
  const auto a = m.claim(1);
  write(m.fetch(a, U32{6}), 6, rng);
  m.step(a, U32{6});
  const std::vector<float> before = read_all(m.fetch(a), 6);
  const SeqId child = m.fork(a[0]);
  const std::vector<SeqId> c{child};
  const KVCacheBatch cb = m.fetch(c, U32{1});
  ASSERT_EQ(cb.block_copies().size(), 1u);  // the shared partial page was copied
  EXPECT_EQ(read_all(cb, 6), before);       // values and scales, every layer
  write(cb, 1, rng);                        // the child's token 6 goes to its copy
  m.step(c, U32{1});
  EXPECT_EQ(read_all(m.fetch(a), 6), before);  // the parent's page is untouched
  m.truncate(child, 3);
  const KVCacheBatch tb = m.fetch(c, U32{1});
  // After the cut the first 3 tokens read as before (layer 0 K: the
  // first 3 * 16 values of both reads).
  const std::vector<float> cut = read_all(tb, 3);
  EXPECT_TRUE(std::equal(cut.begin(), cut.begin() + 48, before.begin()));
}

// MAX's matrix view of an int8 layer: the block holds its scales after the
// values, so the matrix is a logical one (rows_per_block rounds the block up
// to whole rows) and matrix_ptr(row_idx, col_idx + d) is the element ptr names,
// on both arrangements, for page sizes whose scale bytes are and are not a
// whole number of rows (head_dim 8 x 2 heads: 4 scale bytes a row and head).
TEST(Int8Pages, MatrixViewAddressesEveryElement) {
  for (const PoolArrangement arr : {PoolArrangement::interleaved, PoolArrangement::per_layer}) {
    for (const std::uint32_t page : {3u, 4u}) {
      KVCacheParams p = int8_params(false);
      p.pool_arrangement = arr;
      p.page_size = page;
      PagedKVCacheManager m(p, 16, 4, 64);
      const auto ids = m.claim(2);
      const KVCacheBatch batch = m.fetch(ids, U32{7, 5});
      const auto col = batch.paged<Int8>();
      for (std::uint32_t l = 0; l < 2; ++l) {
        for (const auto& view : {col.get_key_cache(l), col.get_value_cache(l)}) {
          ASSERT_GE(view.rows_per_block() * 16, view.desc().block_stride);
          for (std::uint32_t b = 0; b < 2; ++b)
            for (std::uint32_t t = 0; t < (b == 0 ? 7u : 5u); ++t)
              for (std::uint32_t h = 0; h < 2; ++h)
                for (std::uint32_t d = 0; d < 8; ++d)
                  ASSERT_EQ(view.matrix_ptr(view.row_idx(b, t), view.col_idx(h) + d),
                            view.ptr(b, h, t, d))
                      << "page " << page << " entry " << b << " token " << t;
        }
      }
    }
  }
}

TEST(Int8Pages, ScalesComeBackWithPrefixReuse) {
  std::mt19937 rng(6);
  PagedKVCacheManager m(int8_params(true), 16, 4, 64);
  const U32 prompt{1, 2, 3, 4, 5, 6, 7, 8, 9};
  const auto a = m.claim(1);
  m.match_prefix(a[0], prompt);
  write(m.fetch(a, U32{9}), 9, rng);
  m.step(a, U32{9}, prompt);
  const std::vector<float> before = read_all(m.fetch(a), 8);
  m.release(a[0]);
  const auto b = m.claim(1);
  ASSERT_EQ(m.match_prefix(b[0], prompt), 8u);
  EXPECT_EQ(read_all(m.fetch(b, U32{1}), 8), before);
}

}  // namespace
}  // namespace kvcache
