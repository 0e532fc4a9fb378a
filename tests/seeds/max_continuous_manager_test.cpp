// Conformance with seed page 002: Mojo struct ContinuousBatchingKVCacheManager
// (seed 002_b83db26f9c550b21.txt, docs/seeds.md). Each test quotes the sentence it checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::U32;

constexpr std::uint32_t kMaxBatch = 4, kMaxSeq = 32;

ContinuousBatchingKVCacheManager make_manager() {
  return ContinuousBatchingKVCacheManager(
      kvtest::make_params(CacheStrategy::continuous, 2, 2, 8, 0, DType::bf16), kMaxBatch, kMaxSeq);
}

// "claim(mut self, batch_size: Int) -> List[Int]: Assign batch_size blocks
// for incoming requests. This returns a List of seq_ids, which can be passed
// to fetch to retrieve a KVCacheCollection containing those sequences."
TEST(SeedContinuousManager, ClaimAssignsBlocksAndReturnsIdsForFetch) {
  auto m = make_manager();
  const auto ids = m.claim(3);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(std::set<SeqId>(ids.begin(), ids.end()).size(), 3u);
  EXPECT_EQ(m.used_blocks(), 3u);  // one block (slot) each
  const KVCacheBatch batch = m.fetch(ids, U32{1, 1, 1});
  const auto coll = batch.continuous<BFloat16>();
  EXPECT_EQ(coll.batch_size(), 3u);
  std::set<std::uint32_t> slots(batch.lookup_table().begin(), batch.lookup_table().end());
  EXPECT_EQ(slots.size(), 3u);  // each sequence its own slot
}

// "fetch ... Retrieves the pre-assigned blocks for the given seq_ids. if any
// of the seq_ids are not valid (e.g. no assigned blocks) then and error is
// raised."
TEST(SeedContinuousManager, FetchRaisesForInvalidIds) {
  auto m = make_manager();
  const auto ids = m.claim(1);
  EXPECT_THROW(m.fetch(Ids{ids[0] + 100}, U32{1}), UnknownSequence);
  m.release(ids[0]);
  EXPECT_THROW(m.fetch(ids, U32{1}), UnknownSequence);
}

// "step ... Commits changes to the ContiguousKVCache blocks. ... We note the
// new tokens in the blocks and update the valid_length counter."
// A slot holds max_seq_len tokens, so a step of any length that fits commits.
TEST(SeedContinuousManager, StepUpdatesTheValidLength) {
  auto m = make_manager();
  const auto ids = m.claim(2);
  // fetch(seq_ids) and step(valid_lengths, inflight_cache), as the page has them:
  // a slot needs no token counts, it holds max_seq_len.
  const KVCacheBatch inflight = m.fetch(ids);
  m.step(U32{7, 3}, inflight);  // context encoding
  EXPECT_EQ(m.cache_length(ids[0]), 7u);
  EXPECT_EQ(m.cache_length(ids[1]), 3u);
  for (int t = 0; t < 4; ++t) {  // "foreach token generated: fetch, step"
    const KVCacheBatch b = m.fetch(ids, U32{1, 1});
    EXPECT_EQ(b.cache_lengths()[0], 7u + t);
    m.step(ids, U32{1, 1});
  }
  EXPECT_EQ(m.cache_length(ids[0]), 11u);
  EXPECT_THROW(m.step(ids, U32{kMaxSeq, 0}), CapacityExceeded);  // past the slot
  EXPECT_EQ(m.cache_length(ids[0]), 11u);
}

// "release(mut self, seq_id: Int): Marks seq_id as no longer necessary, their
// blocks are reintroduced to the pool."
TEST(SeedContinuousManager, ReleaseReturnsTheBlockToThePool) {
  auto m = make_manager();
  const auto ids = m.claim(kMaxBatch);
  EXPECT_EQ(m.free_blocks(), 0u);
  EXPECT_THROW(m.claim(1), CapacityExceeded);
  m.release(ids[2]);
  EXPECT_EQ(m.free_blocks(), 1u);
  const auto again = m.claim(1);
  EXPECT_EQ(m.fetch(again, U32{1}).cache_lengths()[0], 0u);  // a fresh length
  m.check_invariants();
}

// "TODO this is not currently threadsafe, make it so": every method may be
// called from many threads at once.
TEST(SeedContinuousManager, IsThreadSafe) {
  auto m = make_manager();
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        std::vector<SeqId> id;
        try {
          id = m.claim(1);
        } catch (const CapacityExceeded&) {
          continue;
        }
        m.fetch(id, U32{2});
        m.step(id, U32{2});
        EXPECT_EQ(m.cache_length(id[0]), 2u);
        m.release(id[0]);
        ++done;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GT(done.load(), 0);
  EXPECT_EQ(m.num_active_sequences(), 0u);
  m.check_invariants();
}

}  // namespace
