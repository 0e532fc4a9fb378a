// The paged manager's per-page bookkeeping (issue 40, item 9): counted by
// estimated_bookkeeping_size for every policy (measured against what the
// constructor asks operator new for), the ghost bounded, and an allocation
// failure in it reported as OutOfMemory, never std::bad_alloc.
#include <gtest/gtest.h>

#include <new>

#include "kvcache/kvcache.h"
#include "reliability/alloc_hook.h"
#include "test_util.h"

namespace kvcache {
namespace {

KVCacheParams params(bool caching) {
  KVCacheParams p = kvtest::make_params(CacheStrategy::paged, 2, 2, 8, 16);
  p.enable_prefix_caching = caching;
  return p;
}

// The estimate covers what the constructor allocates per page: measured on
// two pool sizes, the per-page part of the allocation equals the estimate's
// (fixed costs such as the object itself cancel out).
TEST(Bookkeeping, EstimateMatchesWhatTheConstructorAllocates) {
  for (bool caching : {false, true}) {
    for (EvictionPolicyKind policy :
         {EvictionPolicyKind::lru, EvictionPolicyKind::s3fifo, EvictionPolicyKind::tiered,
          EvictionPolicyKind::interval, EvictionPolicyKind::adaptive}) {
      if (!caching && policy != EvictionPolicyKind::lru) continue;
      SCOPED_TRACE(std::string(caching ? "caching " : "no caching ") +
                   std::string(policy_name(policy)));
      PrefixCacheConfig config;
      config.policy = policy;
      config.ghost_factor = 2.0;
      auto measure = [&](std::uint32_t pages) {
        (void)testing::take_allocated_bytes();
        PagedKVCacheManager m(params(caching), pages, 4, 64, config);
        return testing::take_allocated_bytes();
      };
      // Powers of two so the hash index's power-of-two capacity scales exactly.
      const std::size_t small = measure(1024), large = measure(4096);
      const std::size_t est_small =
          PagedKVCacheManager::estimated_bookkeeping_size(params(caching), 1024, config);
      const std::size_t est_large =
          PagedKVCacheManager::estimated_bookkeeping_size(params(caching), 4096, config);
      EXPECT_EQ(large - small, est_large - est_small);
      EXPECT_GE(small + 4096, est_small);  // no more than a few fixed bytes uncounted
      EXPECT_LE(est_small, small);
    }
  }
}

TEST(Bookkeeping, PerPageFiguresAndTheGhostBound) {
  // No prefix caching: ref counts and the free list, 8 bytes a page.
  EXPECT_EQ(PagedKVCacheManager::estimated_bookkeeping_size(params(false), 1u << 20),
            std::size_t{8} << 20);
  // A ghost is ghost_factor x pages, but never more than 2^24 entries: a
  // huge pool's ghost costs no more than a 2^20-page pool's at factor 16.
  PrefixCacheConfig s3;
  s3.policy = EvictionPolicyKind::s3fifo;
  s3.ghost_factor = 64;
  const std::size_t big =
      PagedKVCacheManager::estimated_bookkeeping_size(params(true), 1u << 22, s3);
  s3.ghost_factor = 0;
  const std::size_t no_ghost =
      PagedKVCacheManager::estimated_bookkeeping_size(params(true), 1u << 22, s3);
  EXPECT_LE(big - no_ghost, (std::size_t{1} << 24) * (8 + 2 * 16));
}

// An allocation failure while building the bookkeeping is OutOfMemory,
// naming the pages and the bytes, whichever allocation fails.
TEST(Bookkeeping, AllocationFailureIsOutOfMemory) {
  for (std::size_t k = 1; k <= 12; ++k) {
    testing::fail_nth_allocation(k);
    try {
      PagedKVCacheManager m(params(true), 256, 4, 64);
      testing::disarm_allocation_failure();
    } catch (const OutOfMemory& e) {
      const bool fired = testing::disarm_allocation_failure();
      EXPECT_TRUE(fired);
      EXPECT_NE(std::string(e.what()).find("256 pages"), std::string::npos) << e.what();
    } catch (const std::bad_alloc&) {
      testing::disarm_allocation_failure();
      ADD_FAILURE() << "allocation " << k << " escaped as std::bad_alloc";
    }
  }
}

}  // namespace
}  // namespace kvcache
