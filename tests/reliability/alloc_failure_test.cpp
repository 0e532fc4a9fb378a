// The strong guarantee under injected allocation failure: for every public
// manager entry, fail the 1st, 2nd, ... allocation it makes; after each
// failure the manager's snapshot and every sequence's K/V bytes must equal
// what they were before the call, and the manager must keep working.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "kvcache/kvcache.h"
#include "reliability/alloc_hook.h"

namespace kvcache {
namespace {

KVCacheParams params_for(CacheStrategy strategy) {
  KVCacheParams p;
  p.dtype = DType::f32;
  p.num_layers = 2;
  p.n_kv_heads = 2;
  p.head_dim = 4;
  p.cache_strategy = strategy;
  p.page_size = strategy == CacheStrategy::paged ? 4 : 0;
  return p;
}

std::unique_ptr<KVCacheManager> make_manager(CacheStrategy strategy, SeqIdPolicy ids) {
  const KVCacheParams p = params_for(strategy);
  if (strategy == CacheStrategy::paged) {
    return std::make_unique<PagedKVCacheManager>(p, 64, 8, 64, ids);
  }
  return std::make_unique<ContinuousBatchingKVCacheManager>(p, 8, 64, ids);
}

// Whole block memory of the manager, read through a 1-entry batch per sequence.
std::vector<float> cache_bytes(KVCacheManager& m, const KVCacheBatch& any_batch) {
  const std::size_t bytes = m.params().cache_strategy == CacheStrategy::paged
                                ? PagedKVCacheManager::estimated_memory_size(m.params(), m.total_blocks())
                                : ContinuousBatchingKVCacheManager::estimated_memory_size(
                                      m.params(), m.total_blocks(), m.max_seq_len());
  std::vector<float> out(bytes / sizeof(float));
  std::memcpy(out.data(), any_batch.blocks(), bytes);
  return out;
}

// Three sequences with random K/V written for their committed tokens; with
// lowest_free ids, the second is then released (its id is free for reuse).
struct Fixture {
  Fixture(CacheStrategy s, SeqIdPolicy policy) : m(make_manager(s, policy)) {
    ids = m->claim(3);
    const std::vector<std::uint32_t> lens{5, 9, 3};
    batch = m->fetch(ids, lens);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    float* blocks = static_cast<float*>(batch.blocks());
    const std::size_t n = cache_bytes(*m, batch).size();
    for (std::size_t i = 0; i < n; ++i) blocks[i] = u(rng);
    m->step(ids, lens);
    small = m->fetch(std::span(ids).first(1), std::vector<std::uint32_t>{1});
    if (policy == SeqIdPolicy::lowest_free) m->release(ids[1]);
  }
  std::unique_ptr<KVCacheManager> m;
  std::vector<SeqId> ids;
  KVCacheBatch batch;
  KVCacheBatch small;  // a one-entry batch for fetch_into to reuse
};

using Operation = std::function<void(Fixture&)>;

// Runs `op` with the k-th allocation failing for k = 1, 2, ... until it
// succeeds without the failure firing. Returns how many failures were injected.
int run_with_failures(CacheStrategy strategy, const Operation& op,
                      SeqIdPolicy policy = SeqIdPolicy::never_reuse) {
  for (int k = 1; k < 200; ++k) {
    Fixture f(strategy, policy);
    const ManagerSnapshot before = f.m->snapshot();
    const std::vector<float> bytes_before = cache_bytes(*f.m, f.batch);
    testing::fail_nth_allocation(static_cast<std::size_t>(k));
    try {
      op(f);
    } catch (const std::bad_alloc&) {
      EXPECT_TRUE(testing::disarm_allocation_failure());
      EXPECT_EQ(f.m->snapshot(), before) << "allocation " << k << " failed and changed state";
      EXPECT_EQ(cache_bytes(*f.m, f.batch), bytes_before) << "allocation " << k;
      f.m->check_invariants();
      op(f);  // the same call works once memory is back
      f.m->check_invariants();
      continue;
    }
    const bool fired = testing::disarm_allocation_failure();
    EXPECT_FALSE(fired) << "allocation " << k << " failed but the call did not throw";
    f.m->check_invariants();
    return k - 1;
  }
  ADD_FAILURE() << "operation never completed";
  return -1;
}

class AllocFailure : public ::testing::TestWithParam<CacheStrategy> {};

TEST_P(AllocFailure, Claim) {
  const int injected = run_with_failures(GetParam(), [](Fixture& f) { f.m->claim(4); });
  EXPECT_GT(injected, 0);  // claim does allocate (ids, map nodes): failures were exercised
}

TEST_P(AllocFailure, ClaimLowestFreeIds) {
  // Id 1 comes from the free ids, 3 4 5 from the high-water mark; a failed
  // claim must put id 1 back (the retry after each failure sees the same ids).
  const int injected = run_with_failures(
      GetParam(),
      [](Fixture& f) {
        EXPECT_EQ(f.m->claim(4), (std::vector<SeqId>{1, 3, 4, 5}));
      },
      SeqIdPolicy::lowest_free);
  EXPECT_GT(injected, 0);
}

TEST_P(AllocFailure, FetchNewBatch) {
  const int injected = run_with_failures(GetParam(), [](Fixture& f) {
    const std::vector<std::uint32_t> n{7, 1, 13};
    KVCacheBatch b = f.m->fetch(f.ids, n, 2);
    EXPECT_EQ(b.batch_size(), 3u);
  });
  EXPECT_GT(injected, 0);
}

TEST_P(AllocFailure, FetchIntoKeepsOutOnFailure) {
  run_with_failures(GetParam(), [](Fixture& f) {
    KVCacheBatch& out = f.small;
    const std::vector<std::uint32_t> lengths_before(out.cache_lengths().begin(),
                                                    out.cache_lengths().end());
    const std::vector<std::uint32_t> n{4, 4, 4};
    try {
      f.m->fetch_into(out, f.ids, n);
    } catch (const std::bad_alloc&) {
      EXPECT_EQ(std::vector<std::uint32_t>(out.cache_lengths().begin(), out.cache_lengths().end()),
                lengths_before);
      EXPECT_EQ(out.batch_size(), 1u);
      throw;
    }
    EXPECT_EQ(out.batch_size(), 3u);
  });
}

TEST_P(AllocFailure, StepAndReleaseAllocateNothing) {
  const std::vector<std::uint32_t> zeros{0, 0, 0};
  const int injected = run_with_failures(GetParam(), [&](Fixture& f) {
    f.m->step(f.ids, zeros);
    f.m->release(f.ids[1]);
  });
  EXPECT_EQ(injected, 0);
}

INSTANTIATE_TEST_SUITE_P(Managers, AllocFailure,
                         ::testing::Values(CacheStrategy::continuous, CacheStrategy::paged),
                         [](const auto& info) { return std::string(strategy_name(info.param)); });

}  // namespace
}  // namespace kvcache
