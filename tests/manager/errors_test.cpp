// Error paths of both managers: right type, message names the value, and the
// strong guarantee (snapshot, K/V bytes and an out-batch all unchanged).
#include <gtest/gtest.h>

#include <random>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::str;
using kvtest::U32;

constexpr std::uint32_t kPage = 4;
constexpr std::uint32_t kPages = 12;
constexpr std::uint32_t kMaxBatch = 4;
constexpr std::uint32_t kMaxSeq = 24;

// A manager with two live sequences whose K/V hold random data, a batch to
// reach the memory, and a checker for "nothing changed".
class ErrorsTest : public ::testing::TestWithParam<CacheStrategy> {
 protected:
  void SetUp() override {
    if (GetParam() == CacheStrategy::paged) {
      params = kvtest::paged_params(2, 2, 4, kPage);
      mgr = std::make_unique<PagedKVCacheManager>(params, kPages, kMaxBatch, kMaxSeq);
    } else {
      params = kvtest::continuous_params(2, 2, 4);
      mgr = std::make_unique<ContinuousBatchingKVCacheManager>(params, kMaxBatch, kMaxSeq);
    }
    live = mgr->claim(2);
    // a: 6 tokens committed (2 pages), b: 3 tokens (1 page); reserve one more each.
    KVCacheBatch first = mgr->fetch(live, U32{6, 3});
    fill_random(first, U32{6, 3});
    mgr->step(live, U32{6, 3});
    batch = mgr->fetch(live, U32{1, 1});
    fill_random(batch, U32{7, 4});
    mgr->check_invariants();
  }

  void fill_random(const KVCacheBatch& b, const U32& upto) {
    std::mt19937_64 rng(1234);
    auto fill = [&](const auto& coll) {
      for (std::uint32_t l = 0; l < params.num_layers; ++l)
        for (int kv = 0; kv < 2; ++kv) {
          const auto c = kv ? coll.get_value_cache(l) : coll.get_key_cache(l);
          for (std::uint32_t e = 0; e < b.batch_size(); ++e)
            for (std::uint32_t t = 0; t < upto[e]; ++t)
              for (std::uint32_t h = 0; h < c.n_kv_heads(); ++h)
                for (std::uint32_t d = 0; d < c.head_dim(); ++d)
                  *c.ptr(e, h, t, d) = kvtest::nonzero(rng);
        }
    };
    if (b.strategy() == CacheStrategy::paged)
      fill(b.paged<float>());
    else
      fill(b.continuous<float>());
  }

  // Runs a call that must throw E with the needles in its message; checks the
  // manager snapshot, the invariants and the K/V bytes are unchanged.
  template <class E, class F>
  void expect_rejected(F&& f, std::initializer_list<std::string> needles, int line) {
    const ManagerSnapshot before = mgr->snapshot();
    const auto bytes_before = kvtest::copy_buffers(*mgr, batch);
    const std::uint32_t free_before = mgr->free_blocks();
    const std::uint32_t active_before = mgr->num_active_sequences();
    kvtest::expect_throw<E>(f, needles, "call", line);
    EXPECT_EQ(mgr->snapshot(), before) << "line " << line << ": state changed by a failed call";
    EXPECT_EQ(mgr->free_blocks(), free_before) << "line " << line;
    EXPECT_EQ(mgr->num_active_sequences(), active_before) << "line " << line;
    EXPECT_TRUE(kvtest::copy_buffers(*mgr, batch) == bytes_before)
        << "line " << line << ": K/V memory changed by a failed call";
    EXPECT_NO_THROW(mgr->check_invariants()) << "line " << line;
  }

  bool paged() const { return GetParam() == CacheStrategy::paged; }

  KVCacheParams params;
  std::unique_ptr<KVCacheManager> mgr;
  Ids live;
  KVCacheBatch batch;
};

#define REJECT(ExType, stmt, ...) \
  expect_rejected<ExType>([&] { (void)(stmt); }, {__VA_ARGS__}, __LINE__)

TEST_P(ErrorsTest, UnknownIds) {
  const SeqId never = 987654;
  REJECT(UnknownSequence, mgr->fetch(Ids{never}, U32{1}), str(never));
  REJECT(UnknownSequence, mgr->fetch(Ids{live[0], never}, U32{1, 1}), str(never));
  REJECT(UnknownSequence, mgr->step(Ids{never}, U32{0}), str(never));
  REJECT(UnknownSequence, mgr->step(Ids{live[1], never}, U32{1, 0}), str(never));
  REJECT(UnknownSequence, mgr->release(never), str(never));
  REJECT(UnknownSequence, mgr->cache_length(never), str(never));
  EXPECT_FALSE(mgr->contains(never));
}

TEST_P(ErrorsTest, ReleasedIdIsUnknown) {
  const Ids extra = mgr->claim(1);
  mgr->fetch(extra, U32{5});
  mgr->release(extra[0]);
  EXPECT_FALSE(mgr->contains(extra[0]));
  REJECT(UnknownSequence, mgr->release(extra[0]), str(extra[0]));  // release twice
  REJECT(UnknownSequence, mgr->fetch(extra, U32{1}), str(extra[0]));
  REJECT(UnknownSequence, mgr->step(extra, U32{0}), str(extra[0]));
  REJECT(UnknownSequence, mgr->cache_length(extra[0]), str(extra[0]));
  // Releasing one does not disturb the others.
  EXPECT_EQ(mgr->cache_length(live[0]), 6u);
  EXPECT_EQ(mgr->cache_length(live[1]), 3u);
}

TEST_P(ErrorsTest, MalformedBatches) {
  REJECT(InvalidArgument, mgr->fetch(Ids{live[0], live[0]}, U32{1, 1}), str(live[0]));
  REJECT(InvalidArgument, mgr->fetch(Ids{live[1], live[0], live[1]}, U32{1, 1, 1}), str(live[1]));
  REJECT(InvalidArgument, mgr->step(Ids{live[1], live[1]}, U32{0, 0}), str(live[1]));
  REJECT(InvalidArgument, mgr->fetch(live, U32{1}), "1", "2");
  REJECT(InvalidArgument, mgr->fetch(live, U32{1, 1, 1}), "3", "2");
  REJECT(InvalidArgument, mgr->step(live, U32{1}), "1", "2");
  REJECT(InvalidArgument, mgr->fetch(Ids{}, U32{}));
  REJECT(InvalidArgument, mgr->step(Ids{}, U32{}));
  REJECT(InvalidArgument, mgr->fetch(live, U32{1, 1}, 0), "num_steps");
  REJECT(InvalidArgument, mgr->claim(0), "0");
}

TEST_P(ErrorsTest, CapacityLimits) {
  // live[0] has 6 tokens; max_seq_len is 24.
  REJECT(CapacityExceeded, mgr->fetch(Ids{live[0]}, U32{kMaxSeq - 5}), str(kMaxSeq),
         str(kMaxSeq + 1));
  REJECT(CapacityExceeded, mgr->fetch(Ids{live[1], live[0]}, U32{1, kMaxSeq - 5}), str(live[0]));
  REJECT(CapacityExceeded, mgr->fetch(Ids{live[0]}, U32{2}, kMaxSeq), str(kMaxSeq));
  const Ids fresh = mgr->claim(1);
  REJECT(CapacityExceeded, mgr->fetch(fresh, U32{kMaxSeq + 1}), str(kMaxSeq + 1), str(kMaxSeq));
  // Claiming past max_batch_size (3 of 4 in use).
  REJECT(CapacityExceeded, mgr->claim(2), "2", str(kMaxBatch));
  REJECT(CapacityExceeded, mgr->claim(100), "100");
  EXPECT_EQ(mgr->claim(1).size(), 1u);
  REJECT(CapacityExceeded, mgr->claim(1), str(kMaxBatch));
}

TEST_P(ErrorsTest, StepBeyondReservation) {
  // The last fetch reserved 7 and 4 tokens (paged), the whole slot (continuous).
  const std::uint32_t room0 = paged() ? 7 : kMaxSeq, room1 = paged() ? 4 : kMaxSeq;
  REJECT(CapacityExceeded, mgr->step(live, U32{room0 - 5, 1}), str(live[0]), str(room0));
  REJECT(CapacityExceeded, mgr->step(live, U32{1, room1 - 2}), str(live[1]), str(room1));
  const Ids fresh = mgr->claim(1);  // never fetched: nothing reserved
  REJECT(CapacityExceeded, mgr->step(fresh, U32{1}), str(fresh[0]));
  mgr->step(live, U32{1, 1});
  EXPECT_EQ(mgr->cache_length(live[0]), 7u);
}

// Running out of pages exists only for the paged manager: this fixture is
// instantiated with it alone (below), rather than skipped for the other.
class PagedErrorsTest : public ErrorsTest {};

TEST_P(PagedErrorsTest, OutOfPagesAllOrNothing) {
  ASSERT_TRUE(paged());
  // Used: a 2 pages (7 tokens reserved), b 1 page (4 tokens): 9 of 12 pages free.
  ASSERT_EQ(mgr->free_blocks(), kPages - 3);
  const Ids fresh = mgr->claim(2);
  // fresh[0] needs 4 pages (fits alone), fresh[1] 6 more: 10 > 9 free.
  REJECT(OutOfPages, mgr->fetch(fresh, U32{16, 24}), "10", "9");
  // Live sequences growing too: a 6 -> 16 tokens (+2 pages), fresh[0] 24
  // tokens (+6), b 3 -> 9 tokens (+2): 10 > 9.
  REJECT(OutOfPages, mgr->fetch(Ids{live[0], fresh[0], live[1]}, U32{10, 24, 6}), "10", "9");
  // Exactly the free count succeeds.
  KVCacheBatch ok = mgr->fetch(fresh, U32{16, 20});
  EXPECT_EQ(mgr->free_blocks(), 0u);
  mgr->check_invariants();
  // b: 3 + 2 tokens needs a second page; none is free.
  REJECT(OutOfPages, mgr->fetch(Ids{live[1]}, U32{2}), "1", "0");
  // ... while growth inside b's existing page needs none.
  EXPECT_NO_THROW(mgr->fetch(Ids{live[1]}, U32{1}));
  mgr->release(fresh[1]);
  EXPECT_EQ(mgr->free_blocks(), 5u);
  EXPECT_NO_THROW(mgr->fetch(Ids{live[1]}, U32{2}));
  EXPECT_EQ(mgr->free_blocks(), 4u);
  mgr->check_invariants();
}

TEST_P(ErrorsTest, FetchIntoLeavesOutUnchangedOnThrow) {
  KVCacheBatch out;
  mgr->fetch_into(out, live, U32{1, 1});
  const auto seq_ids = std::vector<SeqId>(out.seq_ids().begin(), out.seq_ids().end());
  const U32 lens(out.cache_lengths().begin(), out.cache_lengths().end());
  const U32 table(out.lookup_table().begin(), out.lookup_table().end());
  const U32 reserved(out.reserved_lengths().begin(), out.reserved_lengths().end());
  const auto max_seq = out.max_seq_length(), max_cache = out.max_cache_length();
  REJECT(UnknownSequence, (mgr->fetch_into(out, Ids{live[0], 424242}, U32{1, 1}), 0), "424242");
  REJECT(CapacityExceeded, (mgr->fetch_into(out, Ids{live[0]}, U32{kMaxSeq}), 0));
  REJECT(InvalidArgument, (mgr->fetch_into(out, live, U32{1, 1}, 0), 0));
  EXPECT_EQ(std::vector<SeqId>(out.seq_ids().begin(), out.seq_ids().end()), seq_ids);
  EXPECT_EQ(U32(out.cache_lengths().begin(), out.cache_lengths().end()), lens);
  EXPECT_EQ(U32(out.lookup_table().begin(), out.lookup_table().end()), table);
  EXPECT_EQ(U32(out.reserved_lengths().begin(), out.reserved_lengths().end()), reserved);
  EXPECT_EQ(out.max_seq_length(), max_seq);
  EXPECT_EQ(out.max_cache_length(), max_cache);
}

TEST_P(ErrorsTest, OtherSequencesDataSurvivesManyFailures) {
  // A long run of failing calls interleaved with nothing else: memory intact.
  const auto bytes = kvtest::copy_buffers(*mgr, batch);
  const auto snap = mgr->snapshot();
  for (int i = 0; i < 50; ++i) {
    EXPECT_THROW(mgr->fetch(Ids{live[0], live[0]}, U32{1, 1}), InvalidArgument);
    EXPECT_THROW(mgr->fetch(live, U32{1, kMaxSeq}), CapacityExceeded);
    EXPECT_THROW(mgr->release(static_cast<SeqId>(1000 + i)), UnknownSequence);
    EXPECT_THROW(mgr->step(live, U32{kMaxSeq, kMaxSeq}), CapacityExceeded);
  }
  EXPECT_EQ(mgr->snapshot(), snap);
  EXPECT_TRUE(kvtest::copy_buffers(*mgr, batch) == bytes);
}

std::string StrategyParamName(const ::testing::TestParamInfo<CacheStrategy>& info) {
  return std::string(strategy_name(info.param));
}

INSTANTIATE_TEST_SUITE_P(BothManagers, ErrorsTest,
                         ::testing::Values(CacheStrategy::paged, CacheStrategy::continuous),
                         StrategyParamName);
INSTANTIATE_TEST_SUITE_P(PagedManager, PagedErrorsTest, ::testing::Values(CacheStrategy::paged),
                         StrategyParamName);

// ---- constructors ---------------------------------------------------------------

TEST(ManagerConstruction, BadArgumentsThrowInvalidArgument) {
  const auto cp = kvtest::continuous_params(2, 2, 4);
  const auto pp = kvtest::paged_params(2, 2, 4, 4);
  KV_EXPECT_THROW(ContinuousBatchingKVCacheManager(cp, 0, 16), InvalidArgument, "max_batch_size");
  KV_EXPECT_THROW(ContinuousBatchingKVCacheManager(cp, 4, 0), InvalidArgument, "max_seq_len");
  KV_EXPECT_THROW(PagedKVCacheManager(pp, 8, 0, 16), InvalidArgument, "max_batch_size");
  KV_EXPECT_THROW(PagedKVCacheManager(pp, 8, 4, 0), InvalidArgument, "max_seq_len");
  EXPECT_THROW(PagedKVCacheManager(pp, 0, 4, 16), InvalidArgument);
  // Wrong strategy for the manager.
  KV_EXPECT_THROW(ContinuousBatchingKVCacheManager(pp, 4, 16), InvalidArgument, "paged");
  KV_EXPECT_THROW(PagedKVCacheManager(cp, 8, 4, 16), InvalidArgument, "continuous");
  // Invalid params are refused by both.
  auto bad = cp;
  bad.num_layers = 0;
  KV_EXPECT_THROW(ContinuousBatchingKVCacheManager(bad, 4, 16), InvalidArgument, "num_layers");
  auto badp = pp;
  badp.page_size = 0;
  KV_EXPECT_THROW(PagedKVCacheManager(badp, 8, 4, 16), InvalidArgument, "page_size");
  auto badd = pp;
  badd.n_devices = 3;
  EXPECT_THROW(PagedKVCacheManager(badd, 8, 4, 16), InvalidArgument);
  auto prefix = cp;
  prefix.enable_prefix_caching = true;
  EXPECT_THROW(ContinuousBatchingKVCacheManager(prefix, 4, 16), InvalidArgument);
}

}  // namespace
