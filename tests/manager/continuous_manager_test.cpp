// ContinuousBatchingKVCacheManager: lifecycle, batch fields, multistep, sizes.
#include <gtest/gtest.h>

#include <set>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::U32;

constexpr std::uint32_t kMaxBatch = 4;
constexpr std::uint32_t kMaxSeq = 64;

class ContinuousManagerTest : public ::testing::Test {
 protected:
  KVCacheParams params = kvtest::continuous_params(2, 2, 8);
  ContinuousBatchingKVCacheManager mgr{params, kMaxBatch, kMaxSeq};
};

TEST_F(ContinuousManagerTest, FreshManager) {
  EXPECT_EQ(mgr.params(), params);
  EXPECT_EQ(mgr.max_batch_size(), kMaxBatch);
  EXPECT_EQ(mgr.max_seq_len(), kMaxSeq);
  EXPECT_EQ(mgr.total_blocks(), kMaxBatch);
  EXPECT_EQ(mgr.free_blocks(), kMaxBatch);
  EXPECT_EQ(mgr.used_blocks(), 0u);
  EXPECT_EQ(mgr.num_active_sequences(), 0u);
  mgr.check_invariants();
  const auto snap = mgr.snapshot();
  EXPECT_TRUE(snap.sequences.empty());
  EXPECT_EQ(snap.free_blocks.size(), kMaxBatch);
  EXPECT_TRUE(std::is_sorted(snap.free_blocks.begin(), snap.free_blocks.end()));
}

TEST_F(ContinuousManagerTest, LifecycleClaimFetchStepRelease) {
  const Ids ids = mgr.claim(2);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_NE(ids[0], ids[1]);
  for (auto id : ids) {
    EXPECT_TRUE(mgr.contains(id));
    EXPECT_EQ(mgr.cache_length(id), 0u);
  }
  EXPECT_EQ(mgr.num_active_sequences(), 2u);
  EXPECT_EQ(mgr.free_blocks(), kMaxBatch - 2);
  EXPECT_EQ(mgr.used_blocks(), 2u);
  mgr.check_invariants();

  // Context encoding: 5 and 3 new tokens.
  KVCacheBatch b1 = mgr.fetch(ids, U32{5, 3});
  mgr.check_invariants();
  ASSERT_EQ(b1.batch_size(), 2u);
  EXPECT_EQ(std::vector<SeqId>(b1.seq_ids().begin(), b1.seq_ids().end()), ids);
  EXPECT_EQ(U32(b1.cache_lengths().begin(), b1.cache_lengths().end()), (U32{0, 0}));
  // The whole slot is reserved, whatever the new-token counts.
  EXPECT_EQ(U32(b1.reserved_lengths().begin(), b1.reserved_lengths().end()),
            (U32{kMaxSeq, kMaxSeq}));
  EXPECT_EQ(b1.max_seq_length(), 5u);
  EXPECT_EQ(b1.max_cache_length(), 0u);  // MAX: the history maximum
  EXPECT_EQ(b1.max_full_context_length(), 5u);
  EXPECT_TRUE(b1.is_cache_empty());
  EXPECT_EQ(b1.strategy(), CacheStrategy::continuous);
  EXPECT_EQ(b1.params(), params);
  EXPECT_EQ(b1.num_blocks(), kMaxBatch);
  EXPECT_EQ(b1.page_size(), kMaxSeq);
  EXPECT_EQ(b1.lookup_stride(), 1u);
  ASSERT_EQ(b1.lookup_table().size(), 2u);
  const U32 slots(b1.lookup_table().begin(), b1.lookup_table().end());
  EXPECT_NE(slots[0], slots[1]);
  for (auto s : slots) EXPECT_LT(s, kMaxBatch);
  // The manager's snapshot agrees: slot = {lookup entry}, reserved lengths.
  {
    const auto snap = mgr.snapshot();
    ASSERT_EQ(snap.sequences.size(), 2u);
    for (const auto& s : snap.sequences) {
      const std::size_t b = s.id == ids[0] ? 0 : 1;
      ASSERT_EQ(s.id, ids[b]);
      EXPECT_EQ(s.blocks, U32{slots[b]});
      EXPECT_EQ(s.cache_length, 0u);
      EXPECT_EQ(s.reserved_length, kMaxSeq);
    }
    for (auto s : slots) {
      EXPECT_EQ(std::count(snap.free_blocks.begin(), snap.free_blocks.end(), s), 0);
      EXPECT_EQ(snap.ref_counts.at(s), 1u);
    }
  }
  // The typed view mirrors the batch.
  auto coll = b1.continuous<float>();
  EXPECT_EQ(coll.batch_size(), 2u);
  EXPECT_EQ(coll.num_layers(), 2u);
  EXPECT_EQ(coll.max_seq_len(), kMaxSeq);
  EXPECT_EQ(coll.max_seq_length(), 5u);
  EXPECT_EQ(coll.max_cache_length(), 0u);
  auto k0 = coll.get_key_cache(0);
  EXPECT_TRUE(k0.empty_cache());
  EXPECT_EQ(k0.max_prompt_length(), 5u);
  EXPECT_EQ(k0.max_context_length(), 0u);
  EXPECT_EQ(k0.max_full_context_length(), 5u);
  EXPECT_EQ(k0.page_size(), kMaxSeq);
  EXPECT_EQ(k0.max_tile_size(), kMaxSeq);
  EXPECT_EQ(k0.block_id(0, 0), slots[0]);
  EXPECT_EQ(k0.block_id(1, 0), slots[1]);

  mgr.step(ids, U32{5, 3});
  mgr.check_invariants();
  EXPECT_EQ(mgr.cache_length(ids[0]), 5u);
  EXPECT_EQ(mgr.cache_length(ids[1]), 3u);

  // Decode: one token each.
  KVCacheBatch b2 = mgr.fetch(ids, U32{1, 1});
  EXPECT_EQ(U32(b2.cache_lengths().begin(), b2.cache_lengths().end()), (U32{5, 3}));
  EXPECT_EQ(b2.max_seq_length(), 1u);
  EXPECT_EQ(b2.max_cache_length(), 5u);
  EXPECT_EQ(b2.max_full_context_length(), 6u);
  EXPECT_FALSE(b2.is_cache_empty());
  EXPECT_FALSE(b2.continuous<float>().get_value_cache(1).empty_cache());
  EXPECT_EQ(U32(b2.lookup_table().begin(), b2.lookup_table().end()), slots);  // slots are stable
  mgr.step(ids, U32{1, 1});
  EXPECT_EQ(mgr.cache_length(ids[0]), 6u);
  EXPECT_EQ(mgr.cache_length(ids[1]), 4u);
  mgr.check_invariants();

  // Order in the batch follows the caller's order.
  const Ids rev{ids[1], ids[0]};
  KVCacheBatch b3 = mgr.fetch(rev, U32{2, 1});
  EXPECT_EQ(U32(b3.cache_lengths().begin(), b3.cache_lengths().end()), (U32{4, 6}));
  EXPECT_EQ(U32(b3.lookup_table().begin(), b3.lookup_table().end()), (U32{slots[1], slots[0]}));
  EXPECT_EQ(b3.max_seq_length(), 2u);
  EXPECT_EQ(b3.max_cache_length(), 6u);
  mgr.step(rev, U32{2, 0});  // fewer than fetched is fine
  EXPECT_EQ(mgr.cache_length(ids[1]), 6u);
  EXPECT_EQ(mgr.cache_length(ids[0]), 6u);

  mgr.release(ids[0]);
  mgr.check_invariants();
  EXPECT_FALSE(mgr.contains(ids[0]));
  EXPECT_TRUE(mgr.contains(ids[1]));
  EXPECT_EQ(mgr.num_active_sequences(), 1u);
  EXPECT_EQ(mgr.free_blocks(), kMaxBatch - 1);
  EXPECT_THROW(mgr.cache_length(ids[0]), UnknownSequence);
  mgr.release(ids[1]);
  EXPECT_EQ(mgr.free_blocks(), kMaxBatch);
  EXPECT_EQ(mgr.num_active_sequences(), 0u);
  mgr.check_invariants();
}

TEST_F(ContinuousManagerTest, MixedBatchFields) {
  const Ids ids = mgr.claim(3);
  mgr.fetch(Ids{ids[0]}, U32{10});
  mgr.step(Ids{ids[0]}, U32{10});
  // Entry 0 decodes with history; entries 1, 2 are fresh prompts.
  KVCacheBatch b = mgr.fetch(ids, U32{1, 7, 2});
  EXPECT_EQ(U32(b.cache_lengths().begin(), b.cache_lengths().end()), (U32{10, 0, 0}));
  EXPECT_EQ(b.max_seq_length(), 7u);
  EXPECT_EQ(b.max_cache_length(), 10u);
  EXPECT_EQ(b.max_full_context_length(), 11u);
  EXPECT_FALSE(b.is_cache_empty());
  EXPECT_EQ(U32(b.reserved_lengths().begin(), b.reserved_lengths().end()), U32(3, kMaxSeq));
  mgr.check_invariants();
}

TEST_F(ContinuousManagerTest, MultistepIncrementCacheLengths) {
  const Ids ids = mgr.claim(2);
  KVCacheBatch b = mgr.fetch(ids, U32{5, 3}, /*num_steps=*/3);
  EXPECT_EQ(U32(b.reserved_lengths().begin(), b.reserved_lengths().end()), (U32{kMaxSeq, kMaxSeq}));
  EXPECT_EQ(mgr.snapshot().sequences.at(0).reserved_length, kMaxSeq);
  const auto snap_before = mgr.snapshot();

  // Step 1 processed the prompts (row offsets 0,5,8).
  mgr.increment_cache_lengths(b, U32{0, 5, 8});
  EXPECT_EQ(U32(b.cache_lengths().begin(), b.cache_lengths().end()), (U32{5, 3}));
  EXPECT_EQ(b.max_seq_length(), 1u);
  EXPECT_EQ(b.max_cache_length(), 5u);  // 0 + the first step's max_seq_length 5
  EXPECT_EQ(b.max_full_context_length(), 6u);
  EXPECT_FALSE(b.is_cache_empty());
  EXPECT_EQ(b.continuous<float>().get_key_cache(0).cache_length(0), 5u);
  // Malformed offsets (each within the reservation otherwise): InvalidArgument,
  // batch unchanged.
  EXPECT_THROW(b.increment_cache_lengths(U32{0, 1}), InvalidArgument);
  EXPECT_THROW(b.increment_cache_lengths(U32{0, 1, 2, 3}), InvalidArgument);
  EXPECT_THROW(b.increment_cache_lengths(U32{1, 1, 2}), InvalidArgument);
  EXPECT_THROW(b.increment_cache_lengths(U32{0, 1, 0}), InvalidArgument);
  EXPECT_EQ(U32(b.cache_lengths().begin(), b.cache_lengths().end()), (U32{5, 3}));
  EXPECT_EQ(b.max_cache_length(), 5u);
  // Step 2 processed one token each.
  b.increment_cache_lengths(U32{0, 1, 2});
  EXPECT_EQ(U32(b.cache_lengths().begin(), b.cache_lengths().end()), (U32{6, 4}));
  EXPECT_EQ(b.max_seq_length(), 1u);
  EXPECT_EQ(b.max_cache_length(), 6u);  // then + 1 a step);
  // The manager itself did not move.
  EXPECT_EQ(mgr.snapshot(), snap_before);
  EXPECT_EQ(mgr.cache_length(ids[0]), 0u);

  // A step past the slot (6 + 58 + 1 > 64) throws, batch unchanged.
  const U32 lens_before(b.cache_lengths().begin(), b.cache_lengths().end());
  KV_EXPECT_THROW(b.increment_cache_lengths(U32{0, kMaxSeq - 6, kMaxSeq - 5}), CapacityExceeded,
                  kvtest::str(kMaxSeq + 1), kvtest::str(kMaxSeq));
  EXPECT_EQ(U32(b.cache_lengths().begin(), b.cache_lengths().end()), lens_before);
  EXPECT_EQ(b.max_cache_length(), 6u);
  EXPECT_EQ(b.max_seq_length(), 1u);
  EXPECT_THROW(b.increment_cache_lengths(U32{0, 1}), InvalidArgument);
  EXPECT_EQ(U32(b.cache_lengths().begin(), b.cache_lengths().end()), lens_before);
  EXPECT_EQ(mgr.snapshot(), snap_before);

  // Commit all three steps: 5+2 and 3+2.
  mgr.step(ids, U32{7, 5});
  EXPECT_EQ(mgr.cache_length(ids[0]), 7u);
  EXPECT_EQ(mgr.cache_length(ids[1]), 5u);
  mgr.check_invariants();
}

TEST_F(ContinuousManagerTest, StepCommitsAtMostTheSlot) {
  const Ids ids = mgr.claim(1);
  mgr.fetch(ids, U32{4}, 2);  // reserves the whole slot
  const auto snap = mgr.snapshot();
  KV_EXPECT_THROW(mgr.step(ids, U32{kMaxSeq + 1}), CapacityExceeded, kvtest::str(ids[0]),
                  kvtest::str(kMaxSeq));
  EXPECT_EQ(mgr.snapshot(), snap);
  mgr.step(ids, U32{9});  // more than the 5 fetched: it fits the slot
  EXPECT_EQ(mgr.cache_length(ids[0]), 9u);
  mgr.step(ids, U32{kMaxSeq - 9});
  EXPECT_EQ(mgr.cache_length(ids[0]), kMaxSeq);
  EXPECT_THROW(mgr.step(ids, U32{1}), CapacityExceeded);
  EXPECT_EQ(mgr.cache_length(ids[0]), kMaxSeq);
  mgr.check_invariants();
}

TEST_F(ContinuousManagerTest, FillToMaxSeqLen) {
  const Ids ids = mgr.claim(1);
  mgr.fetch(ids, U32{kMaxSeq - 1});
  mgr.step(ids, U32{kMaxSeq - 1});
  KVCacheBatch b = mgr.fetch(ids, U32{1});
  EXPECT_EQ(b.max_cache_length(), kMaxSeq - 1);
  EXPECT_EQ(b.max_full_context_length(), kMaxSeq);
  mgr.step(ids, U32{1});
  EXPECT_EQ(mgr.cache_length(ids[0]), kMaxSeq);
  EXPECT_THROW(mgr.fetch(ids, U32{1}), CapacityExceeded);
  mgr.check_invariants();
}

TEST_F(ContinuousManagerTest, SlotsReusedIdsNot) {
  std::set<SeqId> seen;
  std::set<std::uint32_t> slots_seen;
  for (int round = 0; round < 5; ++round) {
    const Ids ids = mgr.claim(kMaxBatch);
    EXPECT_EQ(mgr.free_blocks(), 0u);
    EXPECT_THROW(mgr.claim(1), CapacityExceeded);
    for (auto id : ids) EXPECT_TRUE(seen.insert(id).second) << "seq id " << id << " reused";
    KVCacheBatch b = mgr.fetch(ids, U32(kMaxBatch, 1));
    for (auto s : b.lookup_table()) slots_seen.insert(s);
    for (auto id : ids) mgr.release(id);
    mgr.check_invariants();
    EXPECT_EQ(mgr.free_blocks(), kMaxBatch);
  }
  EXPECT_EQ(slots_seen.size(), kMaxBatch);  // the same slots came back
  EXPECT_EQ(*slots_seen.rbegin(), kMaxBatch - 1);
  EXPECT_GT(mgr.snapshot().next_seq_id, *seen.rbegin());
}

TEST_F(ContinuousManagerTest, FetchIntoReusesBatch) {
  const Ids ids = mgr.claim(2);
  KVCacheBatch out;
  mgr.fetch_into(out, ids, U32{3, 4});
  EXPECT_EQ(out.batch_size(), 2u);
  EXPECT_EQ(out.max_seq_length(), 4u);
  mgr.step(ids, U32{3, 4});
  mgr.fetch_into(out, Ids{ids[1]}, U32{1});
  EXPECT_EQ(out.batch_size(), 1u);
  EXPECT_EQ(out.seq_ids()[0], ids[1]);
  EXPECT_EQ(out.cache_lengths()[0], 4u);
  EXPECT_EQ(out.lookup_table().size(), 1u);
  EXPECT_EQ(out.max_cache_length(), 4u);
}

TEST(ContinuousManagerSizes, BlockShapeAndMemory) {
  auto p = kvtest::continuous_params(3, 4, 16, DType::bf16);
  ContinuousBatchingKVCacheManager m(p, 5, 32);
  EXPECT_EQ(m.block_shape(5), (std::vector<std::size_t>{5, 2, 3, 32, 4, 16}));
  EXPECT_EQ(m.block_shape(1), (std::vector<std::size_t>{1, 2, 3, 32, 4, 16}));
  auto ph = m.params();
  ph.page_layout = PageLayout::hnd;  // heads before tokens
  ContinuousBatchingKVCacheManager mh(ph, 2, 32);
  EXPECT_EQ(mh.block_shape(5), (std::vector<std::size_t>{5, 2, 3, 4, 32, 16}));
  EXPECT_EQ(ContinuousBatchingKVCacheManager::estimated_memory_size(p, 5, 32),
            std::size_t{5} * 32 * 2 * 3 * 4 * 16 * 2);
  EXPECT_EQ(ContinuousBatchingKVCacheManager::estimated_memory_size(p, 5, 32),
            5 * 32 * p.bytes_per_token());

  // Two devices: heads per device in the shape, total memory over devices.
  auto p2 = kvtest::make_params(CacheStrategy::continuous, 2, 4, 8, 0, DType::f16, 2);
  ContinuousBatchingKVCacheManager m2(p2, 3, 16);
  EXPECT_EQ(m2.block_shape(3), (std::vector<std::size_t>{3, 2, 2, 16, 2, 8}));
  EXPECT_EQ(ContinuousBatchingKVCacheManager::estimated_memory_size(p2, 3, 16),
            3 * 16 * p2.bytes_per_token());
  const Ids ids = m2.claim(1);
  KVCacheBatch b = m2.fetch(ids, U32{2});
  EXPECT_NE(b.blocks(0), b.blocks(1));
  EXPECT_EQ(b.continuous<Half>(1).get_key_cache(0).n_kv_heads(), 2u);
  EXPECT_THROW(b.continuous<Half>(2), InvalidArgument);
  EXPECT_THROW(b.blocks(2), InvalidArgument);
}

TEST(ContinuousManagerSizes, MemoryIsZeroInitialised) {
  auto p = kvtest::continuous_params(2, 2, 4);
  ContinuousBatchingKVCacheManager m(p, 2, 8);
  const Ids ids = m.claim(1);
  KVCacheBatch b = m.fetch(ids, U32{1});
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.blocks()) % 4096, 0u) << "not page-aligned";
  const auto bytes = kvtest::copy_buffers(m, b);
  ASSERT_EQ(bytes[0].size(), std::size_t{2} * 2 * 2 * 8 * 2 * 4 * 4);
  for (auto c : bytes[0]) ASSERT_EQ(c, 0);
}

}  // namespace
