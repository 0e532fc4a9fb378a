// SeqIdPolicy (manager.h) on both managers, and the continuous manager's
// whole-slot reservation (continuous_manager.h).
#include <gtest/gtest.h>

#include <memory>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::str;
using kvtest::U32;

constexpr std::uint32_t kMaxBatch = 4;
constexpr std::uint32_t kMaxSeq = 32;

std::unique_ptr<KVCacheManager> make(CacheStrategy strategy, SeqIdPolicy policy) {
  if (strategy == CacheStrategy::paged) {
    return std::make_unique<PagedKVCacheManager>(kvtest::paged_params(1, 1, 4, 4), 64, kMaxBatch,
                                                 kMaxSeq, policy);
  }
  return std::make_unique<ContinuousBatchingKVCacheManager>(kvtest::continuous_params(1, 1, 4),
                                                            kMaxBatch, kMaxSeq, policy);
}

class SeqIdPolicyTest : public ::testing::TestWithParam<CacheStrategy> {};

TEST_P(SeqIdPolicyTest, DefaultNeverReusesIds) {
  auto m = make(GetParam(), SeqIdPolicy::never_reuse);
  EXPECT_EQ(m->seq_id_policy(), SeqIdPolicy::never_reuse);
  EXPECT_EQ(m->claim(2), (Ids{0, 1}));
  m->release(0);
  EXPECT_EQ(m->claim(1), (Ids{2}));
  m->release(1);
  m->release(2);
  EXPECT_EQ(m->claim(kMaxBatch), (Ids{3, 4, 5, 6}));  // past max_batch_size: ids are not slots
  EXPECT_THROW(m->cache_length(0), UnknownSequence);  // the stale id stays unknown
  m->check_invariants();
}

TEST_P(SeqIdPolicyTest, LowestFreeReusesTheLowestReleasedIds) {
  auto m = make(GetParam(), SeqIdPolicy::lowest_free);
  EXPECT_EQ(m->seq_id_policy(), SeqIdPolicy::lowest_free);
  EXPECT_EQ(m->claim(3), (Ids{0, 1, 2}));
  m->release(1);
  m->check_invariants();
  EXPECT_EQ(m->claim(1), (Ids{1}));
  m->release(2);
  m->release(0);
  m->check_invariants();
  EXPECT_EQ(m->claim(3), (Ids{0, 2, 3}));  // ascending, the lowest first
  EXPECT_EQ(m->snapshot().next_seq_id, kMaxBatch);
  for (SeqId id : {0, 1, 2, 3}) m->release(id);
  for (int round = 0; round < 3; ++round) {  // ids stay in [0, max_batch_size)
    EXPECT_EQ(m->claim(kMaxBatch), (Ids{0, 1, 2, 3}));
    for (SeqId id : {3, 1, 0, 2}) m->release(id);
    m->check_invariants();
  }
  EXPECT_EQ(m->snapshot().next_seq_id, kMaxBatch);
}

TEST_P(SeqIdPolicyTest, LowestFreeFailedClaimChangesNothing) {
  auto m = make(GetParam(), SeqIdPolicy::lowest_free);
  m->claim(3);
  m->release(1);
  const ManagerSnapshot before = m->snapshot();
  KV_EXPECT_THROW(m->claim(3), CapacityExceeded, "3");
  EXPECT_EQ(m->snapshot(), before);
  EXPECT_EQ(m->claim(2), (Ids{1, 3}));  // the free list survived the failed claim
  m->check_invariants();
}

TEST_P(SeqIdPolicyTest, LowestFreeReleasedIdIsUnknownUntilClaimedAgain) {
  auto m = make(GetParam(), SeqIdPolicy::lowest_free);
  const Ids ids = m->claim(2);
  m->fetch(ids, U32{3, 3});
  m->step(ids, U32{3, 3});
  m->release(ids[0]);
  KV_EXPECT_THROW(m->fetch(Ids{ids[0]}, U32{1}), UnknownSequence, "0");
  KV_EXPECT_THROW(m->fetch(Ids{kMaxBatch}, U32{1}), UnknownSequence, str(kMaxBatch));
  EXPECT_EQ(m->claim(1), (Ids{ids[0]}));
  EXPECT_EQ(m->cache_length(ids[0]), 0u);  // a fresh sequence under the old id
  m->check_invariants();
}

TEST_P(SeqIdPolicyTest, RejectsAPolicyOutsideTheEnum) {
  KV_EXPECT_THROW(make(GetParam(), static_cast<SeqIdPolicy>(7)), InvalidArgument, "7");
}

INSTANTIATE_TEST_SUITE_P(Managers, SeqIdPolicyTest,
                         ::testing::Values(CacheStrategy::continuous, CacheStrategy::paged),
                         [](const auto& info) { return std::string(strategy_name(info.param)); });

TEST(PagedSeqIdPolicy, ForkTakesTheLowestFreeId) {
  PagedKVCacheManager m(kvtest::paged_params(1, 1, 4, 4), 64, kMaxBatch, kMaxSeq,
                        SeqIdPolicy::lowest_free);
  EXPECT_EQ(m.claim(3), (Ids{0, 1, 2}));
  m.fetch(Ids{2}, U32{5});
  m.step(Ids{2}, U32{5});
  m.release(0);
  EXPECT_EQ(m.fork(2), 0u);
  EXPECT_EQ(m.cache_length(0), 5u);
  EXPECT_EQ(m.fork(2), 3u);
  KV_EXPECT_THROW(m.fork(2), CapacityExceeded, str(kMaxBatch));
  m.check_invariants();
  PagedKVCacheManager never(kvtest::paged_params(1, 1, 4, 4), 64, kMaxBatch, kMaxSeq);
  never.claim(1);
  never.release(0);
  EXPECT_EQ(never.claim(1), (Ids{1}));
  EXPECT_EQ(never.fork(1), 2u);
}

// ---- the continuous slot ------------------------------------------------------

TEST(ContinuousSlot, FetchReservesTheWholeSlot) {
  ContinuousBatchingKVCacheManager m(kvtest::continuous_params(1, 1, 4), kMaxBatch, kMaxSeq);
  const Ids ids = m.claim(2);
  KVCacheBatch b = m.fetch(ids, U32{1, 1});
  EXPECT_EQ(U32(b.reserved_lengths().begin(), b.reserved_lengths().end()), (U32{kMaxSeq, kMaxSeq}));
  EXPECT_EQ(m.snapshot().sequences.at(0).reserved_length, kMaxSeq);
  m.step(ids, U32{7, kMaxSeq});  // any count that fits the slot, not only the 1 fetched
  EXPECT_EQ(m.cache_length(ids[0]), 7u);
  EXPECT_EQ(m.cache_length(ids[1]), kMaxSeq);
  const ManagerSnapshot before = m.snapshot();
  KV_EXPECT_THROW(m.step(Ids{ids[0]}, U32{kMaxSeq - 6}), CapacityExceeded, str(kMaxSeq));
  EXPECT_EQ(m.snapshot(), before);
  m.step(Ids{ids[0]}, U32{kMaxSeq - 7});
  EXPECT_EQ(m.cache_length(ids[0]), kMaxSeq);
  m.check_invariants();
}

TEST(ContinuousSlot, CountsStillBoundTheFetch) {
  ContinuousBatchingKVCacheManager m(kvtest::continuous_params(1, 1, 4), kMaxBatch, kMaxSeq);
  const Ids ids = m.claim(1);
  m.fetch(ids, U32{10});
  m.step(ids, U32{10});
  const ManagerSnapshot before = m.snapshot();
  KV_EXPECT_THROW(m.fetch(ids, U32{kMaxSeq - 9}), CapacityExceeded, str(kMaxSeq + 1), str(kMaxSeq));
  EXPECT_EQ(m.snapshot(), before);
  KVCacheBatch b = m.fetch(ids, U32{kMaxSeq - 10});
  EXPECT_EQ(b.reserved_lengths()[0], kMaxSeq);
}

TEST(ContinuousSlot, StepBeforeAnyFetchIsRefused) {
  ContinuousBatchingKVCacheManager m(kvtest::continuous_params(1, 1, 4), kMaxBatch, kMaxSeq);
  const Ids ids = m.claim(1);
  KV_EXPECT_THROW(m.step(ids, U32{1}), CapacityExceeded, "0");
  EXPECT_EQ(m.cache_length(ids[0]), 0u);
}

}  // namespace
