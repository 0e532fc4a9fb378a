// PagedKVCacheManager: lifecycle, page tables, multistep, sizes, page reuse.
#include <gtest/gtest.h>

#include <set>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::U32;

constexpr std::uint32_t kPage = 4;
constexpr std::uint32_t kPages = 16;
constexpr std::uint32_t kMaxBatch = 4;
constexpr std::uint32_t kMaxSeq = 64;

std::uint32_t ceil_div(std::uint32_t a, std::uint32_t b) { return (a + b - 1) / b; }

// Row b of the page table: the valid pages, checking the layout contract
// (valid ids first, then only the sentinel).
U32 page_row(const KVCacheBatch& batch, std::uint32_t b) {
  const std::uint32_t stride = batch.lookup_stride();
  U32 pages;
  bool sentinel_seen = false;
  for (std::uint32_t j = 0; j < stride; ++j) {
    const std::uint32_t id = batch.lookup_table()[std::size_t{b} * stride + j];
    EXPECT_LE(id, batch.num_blocks());
    if (id == batch.num_blocks()) {
      sentinel_seen = true;
    } else {
      EXPECT_FALSE(sentinel_seen) << "page after the sentinel in row " << b;
      pages.push_back(id);
    }
  }
  return pages;
}

// Every row holds exactly the pages for its reserved length.
void expect_table_matches_reservation(const KVCacheBatch& batch, std::uint32_t page_size) {
  EXPECT_EQ(batch.lookup_table().size(), std::size_t{batch.batch_size()} * batch.lookup_stride());
  std::vector<std::uint32_t> all;
  for (std::uint32_t b = 0; b < batch.batch_size(); ++b) {
    const U32 row = page_row(batch, b);
    EXPECT_EQ(row.size(), ceil_div(batch.reserved_lengths()[b], page_size)) << "row " << b;
    EXPECT_GE(batch.lookup_stride(), row.size());
    all.insert(all.end(), row.begin(), row.end());
  }
  EXPECT_TRUE(kvtest::all_distinct(all)) << "two sequences share a page";
}

class PagedManagerTest : public ::testing::Test {
 protected:
  KVCacheParams params = kvtest::paged_params(2, 2, 8, kPage);
  PagedKVCacheManager mgr{params, kPages, kMaxBatch, kMaxSeq};
};

TEST_F(PagedManagerTest, FreshManager) {
  EXPECT_EQ(mgr.page_size(), kPage);
  EXPECT_EQ(mgr.total_blocks(), kPages);
  EXPECT_EQ(mgr.free_blocks(), kPages);
  EXPECT_EQ(mgr.used_blocks(), 0u);
  EXPECT_EQ(mgr.max_batch_size(), kMaxBatch);
  EXPECT_EQ(mgr.max_seq_len(), kMaxSeq);
  const auto snap = mgr.snapshot();
  EXPECT_EQ(snap.free_blocks.size(), kPages);
  EXPECT_EQ(snap.ref_counts, U32(kPages, 0));
  mgr.check_invariants();
}

TEST_F(PagedManagerTest, LifecycleAndPageTables) {
  const Ids ids = mgr.claim(2);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_EQ(mgr.free_blocks(), kPages);  // claim allocates no pages
  EXPECT_EQ(mgr.num_active_sequences(), 2u);

  KVCacheBatch b1 = mgr.fetch(ids, U32{5, 3});
  mgr.check_invariants();
  EXPECT_EQ(b1.strategy(), CacheStrategy::paged);
  EXPECT_EQ(b1.num_blocks(), kPages);
  EXPECT_EQ(b1.page_size(), kPage);
  EXPECT_EQ(U32(b1.cache_lengths().begin(), b1.cache_lengths().end()), (U32{0, 0}));
  EXPECT_EQ(U32(b1.reserved_lengths().begin(), b1.reserved_lengths().end()), (U32{5, 3}));
  EXPECT_EQ(b1.max_seq_length(), 5u);
  EXPECT_EQ(b1.max_cache_length(), 0u);  // MAX: the history maximum
  EXPECT_EQ(b1.max_full_context_length(), 5u);
  EXPECT_TRUE(b1.is_cache_empty());
  expect_table_matches_reservation(b1, kPage);
  const U32 a_pages = page_row(b1, 0), b_pages = page_row(b1, 1);
  ASSERT_EQ(a_pages.size(), 2u);
  ASSERT_EQ(b_pages.size(), 1u);
  EXPECT_EQ(mgr.free_blocks(), kPages - 3);
  EXPECT_EQ(mgr.used_blocks(), 3u);
  {
    const auto snap = mgr.snapshot();
    ASSERT_EQ(snap.sequences.size(), 2u);
    EXPECT_EQ(snap.sequences[0].id, std::min(ids[0], ids[1]));
    for (const auto& s : snap.sequences) {
      EXPECT_EQ(s.blocks, s.id == ids[0] ? a_pages : b_pages);
      EXPECT_EQ(s.reserved_length, s.id == ids[0] ? 5u : 3u);
    }
    EXPECT_EQ(snap.free_blocks.size(), kPages - 3);
    for (auto p : a_pages) EXPECT_EQ(snap.ref_counts.at(p), 1u);
    for (auto p : b_pages) EXPECT_EQ(snap.ref_counts.at(p), 1u);
  }
  // Collection view: sentinel, page size, block ids.
  auto coll = b1.paged<float>();
  EXPECT_EQ(coll.page_size(), kPage);
  EXPECT_EQ(coll.num_pages(), kPages);
  EXPECT_EQ(coll.sentinel(), kPages);
  auto v1 = coll.get_value_cache(1);
  EXPECT_EQ(v1.block_id(0, 1), a_pages[1]);
  EXPECT_EQ(v1.block_id(1, 0), b_pages[0]);
  EXPECT_EQ(v1.page_size(), kPage);
  EXPECT_EQ(v1.max_tile_size(), kPage);

  mgr.step(ids, U32{5, 3});
  EXPECT_EQ(mgr.cache_length(ids[0]), 5u);
  EXPECT_EQ(mgr.cache_length(ids[1]), 3u);
  mgr.check_invariants();

  // Decode step 1: a -> 6 (2 pages), b -> 4 (1 page): nothing new.
  KVCacheBatch b2 = mgr.fetch(ids, U32{1, 1});
  EXPECT_EQ(U32(b2.cache_lengths().begin(), b2.cache_lengths().end()), (U32{5, 3}));
  EXPECT_EQ(b2.max_seq_length(), 1u);
  EXPECT_EQ(b2.max_cache_length(), 5u);
  EXPECT_FALSE(b2.is_cache_empty());
  EXPECT_EQ(page_row(b2, 0), a_pages);
  EXPECT_EQ(page_row(b2, 1), b_pages);
  EXPECT_EQ(mgr.free_blocks(), kPages - 3);
  mgr.step(ids, U32{1, 1});

  // Decode step 2: b crosses into its second page; earlier pages stay put.
  KVCacheBatch b3 = mgr.fetch(ids, U32{1, 1});
  expect_table_matches_reservation(b3, kPage);
  EXPECT_EQ(page_row(b3, 0), a_pages);
  const U32 b_pages2 = page_row(b3, 1);
  ASSERT_EQ(b_pages2.size(), 2u);
  EXPECT_EQ(b_pages2[0], b_pages[0]);
  EXPECT_EQ(mgr.free_blocks(), kPages - 4);
  mgr.step(ids, U32{1, 1});
  EXPECT_EQ(mgr.cache_length(ids[0]), 7u);
  EXPECT_EQ(mgr.cache_length(ids[1]), 5u);
  mgr.check_invariants();

  mgr.release(ids[0]);
  EXPECT_EQ(mgr.free_blocks(), kPages - 2);
  EXPECT_FALSE(mgr.contains(ids[0]));
  mgr.check_invariants();
  mgr.release(ids[1]);
  EXPECT_EQ(mgr.free_blocks(), kPages);
  EXPECT_EQ(mgr.num_active_sequences(), 0u);
  EXPECT_EQ(mgr.snapshot().ref_counts, U32(kPages, 0));
  mgr.check_invariants();
}

TEST_F(PagedManagerTest, MixedBatchAndExactPageBoundaries) {
  const Ids ids = mgr.claim(3);
  mgr.fetch(Ids{ids[0]}, U32{8});  // exactly two pages
  EXPECT_EQ(mgr.free_blocks(), kPages - 2);
  mgr.step(Ids{ids[0]}, U32{8});
  KVCacheBatch b = mgr.fetch(ids, U32{1, 4, 9});
  EXPECT_EQ(U32(b.cache_lengths().begin(), b.cache_lengths().end()), (U32{8, 0, 0}));
  EXPECT_EQ(b.max_seq_length(), 9u);
  EXPECT_EQ(b.max_cache_length(), 8u);
  EXPECT_EQ(b.max_full_context_length(), 9u);
  EXPECT_FALSE(b.is_cache_empty());
  expect_table_matches_reservation(b, kPage);
  EXPECT_EQ(page_row(b, 0).size(), 3u);  // 9 tokens
  EXPECT_EQ(page_row(b, 1).size(), 1u);  // 4 tokens
  EXPECT_EQ(page_row(b, 2).size(), 3u);  // 9 tokens
  EXPECT_EQ(mgr.free_blocks(), kPages - 7);
  mgr.check_invariants();
}

TEST_F(PagedManagerTest, MultistepReservesAndIncrements) {
  const Ids ids = mgr.claim(2);
  // 5 + 2 extra steps = 7 tokens (2 pages); 4 + 2 = 6 (2 pages).
  KVCacheBatch b = mgr.fetch(ids, U32{5, 4}, 3);
  EXPECT_EQ(U32(b.reserved_lengths().begin(), b.reserved_lengths().end()), (U32{7, 6}));
  expect_table_matches_reservation(b, kPage);
  EXPECT_EQ(mgr.free_blocks(), kPages - 4);
  const auto snap = mgr.snapshot();

  b.increment_cache_lengths(U32{0, 5, 9});
  EXPECT_EQ(U32(b.cache_lengths().begin(), b.cache_lengths().end()), (U32{5, 4}));
  EXPECT_EQ(b.max_seq_length(), 1u);
  EXPECT_EQ(b.max_cache_length(), 5u);
  EXPECT_FALSE(b.is_cache_empty());
  const U32 table_before(b.lookup_table().begin(), b.lookup_table().end());
  mgr.increment_cache_lengths(b, U32{0, 1, 2});
  EXPECT_EQ(U32(b.cache_lengths().begin(), b.cache_lengths().end()), (U32{6, 5}));
  EXPECT_EQ(b.max_cache_length(), 6u);
  EXPECT_EQ(U32(b.lookup_table().begin(), b.lookup_table().end()), table_before);  // no allocation
  EXPECT_EQ(mgr.snapshot(), snap);
  EXPECT_EQ(mgr.free_blocks(), kPages - 4);
  // The views see the advanced lengths.
  EXPECT_EQ(b.paged<float>().get_key_cache(1).cache_length(1), 5u);

  KV_EXPECT_THROW(b.increment_cache_lengths(U32{0, 1, 2}), CapacityExceeded);
  EXPECT_EQ(U32(b.cache_lengths().begin(), b.cache_lengths().end()), (U32{6, 5}));
  EXPECT_EQ(b.max_cache_length(), 6u);

  KV_EXPECT_THROW(mgr.step(ids, U32{8, 6}), CapacityExceeded, kvtest::str(ids[0]));
  EXPECT_EQ(mgr.snapshot(), snap);
  mgr.step(ids, U32{7, 6});
  EXPECT_EQ(mgr.cache_length(ids[0]), 7u);
  EXPECT_EQ(mgr.cache_length(ids[1]), 6u);
  mgr.check_invariants();
}

TEST_F(PagedManagerTest, PagesReusedAfterReleaseIdsNeverReused) {
  std::set<SeqId> seen;
  std::set<std::uint32_t> pages_seen;
  for (int round = 0; round < 6; ++round) {
    const Ids ids = mgr.claim(2);
    for (auto id : ids) EXPECT_TRUE(seen.insert(id).second) << "seq id " << id << " reused";
    // Use the whole pool: 8 pages each.
    KVCacheBatch b = mgr.fetch(ids, U32{8 * kPage, 8 * kPage});
    EXPECT_EQ(mgr.free_blocks(), 0u);
    for (std::uint32_t r = 0; r < 2; ++r)
      for (auto p : page_row(b, r)) pages_seen.insert(p);
    EXPECT_THROW(mgr.fetch(Ids{mgr.claim(1)[0]}, U32{1}), OutOfPages);
    mgr.release(ids[0]);
    mgr.release(ids[1]);
    EXPECT_EQ(mgr.free_blocks(), kPages);
    // The extra claimed sequence (no pages) is still active; release it.
    const auto snap = mgr.snapshot();
    ASSERT_EQ(snap.sequences.size(), 1u);
    EXPECT_TRUE(snap.sequences[0].blocks.empty());
    seen.insert(snap.sequences[0].id);
    mgr.release(snap.sequences[0].id);
    mgr.check_invariants();
  }
  EXPECT_EQ(pages_seen.size(), kPages);
  EXPECT_EQ(*pages_seen.rbegin(), kPages - 1);
}

TEST_F(PagedManagerTest, FetchIntoShrinksAndGrows) {
  const Ids ids = mgr.claim(3);
  KVCacheBatch out;
  mgr.fetch_into(out, ids, U32{9, 1, 2});
  EXPECT_EQ(out.batch_size(), 3u);
  expect_table_matches_reservation(out, kPage);
  mgr.step(ids, U32{9, 1, 2});
  mgr.fetch_into(out, Ids{ids[2]}, U32{3});
  EXPECT_EQ(out.batch_size(), 1u);
  EXPECT_EQ(out.cache_lengths()[0], 2u);
  EXPECT_EQ(out.max_cache_length(), 2u);
  expect_table_matches_reservation(out, kPage);
  EXPECT_EQ(page_row(out, 0).size(), 2u);
  mgr.check_invariants();
}

TEST_F(PagedManagerTest, FillToMaxSeqLen) {
  PagedKVCacheManager m(params, 64, 2, 10);  // max_seq_len not a page multiple
  const Ids ids = m.claim(1);
  KVCacheBatch b = m.fetch(ids, U32{10});
  EXPECT_EQ(page_row(b, 0).size(), 3u);
  m.step(ids, U32{10});
  EXPECT_THROW(m.fetch(ids, U32{1}), CapacityExceeded);
  m.check_invariants();
}

TEST(PagedManagerSizes, BlockShapeMemoryAndPagesForMemory) {
  auto p = kvtest::paged_params(3, 4, 16, 8, DType::f16);
  PagedKVCacheManager m(p, 10, 4, 64);
  EXPECT_EQ(m.block_shape(10), (std::vector<std::size_t>{10, 2, 3, 8, 4, 16}));
  EXPECT_EQ(m.block_shape(1), (std::vector<std::size_t>{1, 2, 3, 8, 4, 16}));
  auto ph = p;
  ph.page_layout = PageLayout::hnd;  // heads before tokens; same bytes
  PagedKVCacheManager mh(ph, 10, 4, 64);
  EXPECT_EQ(mh.block_shape(10), (std::vector<std::size_t>{10, 2, 3, 4, 8, 16}));
  EXPECT_EQ(PagedKVCacheManager::estimated_memory_size(ph, 10),
            PagedKVCacheManager::estimated_memory_size(p, 10));
  const std::size_t page_bytes = std::size_t{2} * 3 * 8 * 4 * 16 * 2;
  EXPECT_EQ(PagedKVCacheManager::estimated_memory_size(p, 10), 10 * page_bytes);
  EXPECT_EQ(PagedKVCacheManager::estimated_memory_size(p, 10), 10 * 8 * p.bytes_per_token());
  EXPECT_EQ(PagedKVCacheManager::pages_for_memory(p, 10 * page_bytes), 10u);
  EXPECT_EQ(PagedKVCacheManager::pages_for_memory(p, 10 * page_bytes + page_bytes - 1), 10u);
  EXPECT_EQ(PagedKVCacheManager::pages_for_memory(p, page_bytes - 1), 0u);

  // Llama-3-8B bf16, page 16: 2 MiB per page.
  auto llama = kvtest::paged_params(32, 8, 128, 16, DType::bf16);
  EXPECT_EQ(PagedKVCacheManager::estimated_memory_size(llama, 100), 100u * 16 * 131072);
  EXPECT_EQ(PagedKVCacheManager::pages_for_memory(llama, std::size_t{1} << 30), 512u);

  // Two devices: shape per device, memory over devices.
  auto p2 = kvtest::make_params(CacheStrategy::paged, 2, 4, 8, 4, DType::bf16, 2);
  PagedKVCacheManager m2(p2, 6, 2, 16);
  EXPECT_EQ(m2.block_shape(6), (std::vector<std::size_t>{6, 2, 2, 4, 2, 8}));
  EXPECT_EQ(PagedKVCacheManager::estimated_memory_size(p2, 6), 6 * 4 * p2.bytes_per_token());
  const Ids ids = m2.claim(1);
  KVCacheBatch b = m2.fetch(ids, U32{5});
  EXPECT_NE(b.blocks(0), b.blocks(1));
  EXPECT_EQ(b.paged<BFloat16>(1).get_key_cache(1).n_kv_heads(), 2u);
  EXPECT_THROW(b.paged<BFloat16>(2), InvalidArgument);
}

}  // namespace
