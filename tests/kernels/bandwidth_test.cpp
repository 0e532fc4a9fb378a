// kernels::paged_read reads exactly the K and V rows of tokens [0, tokens[b])
// of every entry, through the page table: rows it must read hold 1.0, every
// other element of the cache (other pages, the other layer, rows past the
// count) holds 1000.0, so the returned sum equals the number of elements
// read only if no wrong byte was touched and none was missed.
#include "kvcache/kernels/bandwidth.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kvcache/error.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/thread_pool.h"

namespace kvcache {
namespace {

using test::Entry;
using test::OwnedCache;

// Marks the rows [0, tokens[b]) of layer kLayer's K and V with 1.0; returns
// the number of elements marked.
std::size_t mark_rows(OwnedCache<float>& cache, const std::vector<std::uint32_t>& tokens,
                      std::uint32_t n_kv, std::uint32_t dim) {
  std::fill(cache.blocks.begin(), cache.blocks.end(), 1000.0f);
  std::size_t marked = 0;
  test::with_collection(cache, [&](const auto& col) {
    for (const auto& view : {col.get_key_cache(OwnedCache<float>::kLayer),
                             col.get_value_cache(OwnedCache<float>::kLayer)}) {
      const auto d = view.desc();
      for (std::uint32_t b = 0; b < d.batch_size; ++b) {
        for (std::uint32_t t = 0; t < tokens[b]; ++t) {
          const std::uint32_t block =
              d.lookup_table[std::size_t{b} * d.lookup_stride + t / d.page_size];
          float* row = view.blocks() + std::size_t{block} * d.block_stride +
                       std::size_t{t % d.page_size} * n_kv * dim;
          std::fill(row, row + std::size_t{n_kv} * dim, 1.0f);
          marked += std::size_t{n_kv} * dim;
        }
      }
    }
  });
  return marked;
}

float read(const OwnedCache<float>& cache, const std::vector<std::uint32_t>& tokens,
           ThreadPool* pool) {
  float sum = 0.0f;
  test::with_collection(cache, [&](const auto& col) {
    const auto k = col.get_key_cache(OwnedCache<float>::kLayer);
    const auto v = col.get_value_cache(OwnedCache<float>::kLayer);
    sum = kernels::paged_read(k.desc(), v.desc(), tokens, pool);
  });
  return sum;
}

TEST(PagedRead, ReadsExactlyTheRowsOfEachEntryThroughThePageTable) {
  std::mt19937 rng(17);
  const std::vector<Entry> entries{{40, 1}, {0, 7}, {129, 2}, {16, 0}};
  for (bool paged : {true, false}) {
    for (std::uint32_t page : {1u, 5u, 16u}) {
      if (!paged && page != 16) continue;
      SCOPED_TRACE(std::string(paged ? "paged" : "continuous") + " page " + std::to_string(page));
      OwnedCache<float> cache(entries, paged, page, 3, 24, rng);
      // Whole contexts, a partial last page, an empty entry.
      for (const std::vector<std::uint32_t>& tokens :
           {std::vector<std::uint32_t>{41, 7, 131, 16}, std::vector<std::uint32_t>{3, 0, 100, 9}}) {
        const std::size_t marked = mark_rows(cache, tokens, 3, 24);
        for (std::size_t threads : {1u, 2u, 3u}) {
          ThreadPool pool(threads);
          EXPECT_EQ(read(cache, tokens, &pool), static_cast<float>(marked))
              << "threads " << threads;
        }
        EXPECT_EQ(read(cache, tokens, nullptr), static_cast<float>(marked));
      }
    }
  }
}

TEST(PagedRead, BadArgumentsThrowInvalidArgument) {
  std::mt19937 rng(18);
  OwnedCache<float> cache({{10, 1}, {3, 2}}, true, 4, 2, 16, rng);
  // An entry's limit is its reserved room (11 and 5 here); one more is refused.
  ASSERT_EQ(cache.reserved, (std::vector<std::uint32_t>{11, 5}));
  EXPECT_THROW(read(cache, {1, 2, 3}, nullptr), InvalidArgument);  // 3 counts for 2 entries
  EXPECT_THROW(read(cache, {12, 1}, nullptr), InvalidArgument);
  EXPECT_THROW(read(cache, {11, 6}, nullptr), InvalidArgument);
  EXPECT_NO_THROW(read(cache, {11, 5}, nullptr));
  auto col = cache.paged_collection();
  const auto k = col.get_key_cache(1).desc();
  const auto v = col.get_value_cache(1).desc();
  const std::vector<std::uint32_t> tokens{2, 2};
  EXPECT_NO_THROW(kernels::paged_read(k, v, tokens, nullptr));
  CacheDesc v_f16 = v;  // K and V must agree on the element type
  v_f16.dtype = DType::f16;
  EXPECT_THROW(kernels::paged_read(k, v_f16, tokens, nullptr), InvalidArgument);
  CacheDesc k_strided = k;  // strides other than the geometry's
  k_strided.block_stride += 1;
  EXPECT_THROW(kernels::paged_read(k_strided, v, tokens, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace kvcache
