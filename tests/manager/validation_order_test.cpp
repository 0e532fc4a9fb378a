// Malformed input is reported as InvalidArgument even when the same call
// would also break a capacity limit: ids and offsets are validated before
// any capacity check, for both managers.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kvcache/kvcache.h"

namespace kvcache {
namespace {

std::unique_ptr<KVCacheManager> make(CacheStrategy s) {
  KVCacheParams p;
  p.num_layers = 1;
  p.n_kv_heads = 1;
  p.head_dim = 4;
  p.cache_strategy = s;
  p.page_size = s == CacheStrategy::paged ? 4 : 0;
  if (s == CacheStrategy::paged) return std::make_unique<PagedKVCacheManager>(p, 8, 4, 16);
  return std::make_unique<ContinuousBatchingKVCacheManager>(p, 4, 16);
}

class ValidationOrder : public ::testing::TestWithParam<CacheStrategy> {};

TEST_P(ValidationOrder, DuplicateIdsBeatCapacity) {
  auto m = make(GetParam());
  const auto ids = m->claim(1);
  const std::vector<SeqId> twice{ids[0], ids[0]};
  const auto before = m->snapshot();
  EXPECT_THROW(m->fetch(twice, std::vector<std::uint32_t>{100, 100}), InvalidArgument);
  EXPECT_THROW(m->step(twice, std::vector<std::uint32_t>{100, 100}), InvalidArgument);
  EXPECT_EQ(m->snapshot(), before);
}

TEST_P(ValidationOrder, UnknownIdBeatsCapacityOfAnEarlierEntry) {
  auto m = make(GetParam());
  const auto ids = m->claim(1);
  const std::vector<SeqId> batch{ids[0], 4242};
  EXPECT_THROW(m->fetch(batch, std::vector<std::uint32_t>{100, 1}), UnknownSequence);
}

TEST_P(ValidationOrder, DecreasingOffsetsBeatReservation) {
  auto m = make(GetParam());
  const auto ids = m->claim(2);
  KVCacheBatch b = m->fetch(ids, std::vector<std::uint32_t>{1, 1});
  // Entry 0 would pass its reservation AND the offsets decrease: malformed wins.
  try {
    b.increment_cache_lengths(std::vector<std::uint32_t>{0, 5, 3});
    FAIL() << "accepted decreasing offsets";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("decreases at entry 2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(b.cache_lengths()[0], 0u);
}

INSTANTIATE_TEST_SUITE_P(Managers, ValidationOrder,
                         ::testing::Values(CacheStrategy::continuous, CacheStrategy::paged),
                         [](const auto& info) { return std::string(strategy_name(info.param)); });

}  // namespace
}  // namespace kvcache
