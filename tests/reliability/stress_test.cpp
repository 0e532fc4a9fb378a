// Concurrency stress: more threads than cores hammer one manager with mixed
// operations — their own sequences (claim / fetch / write / step / verify /
// release) and deliberately bad calls on ids other threads own or released.
// Bounded by operation count, so it cannot hang; afterwards invariants hold,
// no block is leaked or doubled, and every sequence read back its own data.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "kvcache/kvcache.h"

namespace kvcache {
namespace {

constexpr std::uint32_t kThreads = 8, kOpsPerThread = 1500, kDim = 4;

float value(SeqId id, std::uint32_t pos, std::uint32_t kv) {
  return 1.0f + static_cast<float>((id * 1000 + pos) * 2 + kv);
}

template <class Coll>
void write_tokens(Coll coll, SeqId id, std::uint32_t from, std::uint32_t n) {
  auto k = coll.get_key_cache(0), v = coll.get_value_cache(0);
  for (std::uint32_t pos = from; pos < from + n; ++pos)
    for (std::uint32_t d = 0; d < kDim; ++d) {
      *k.ptr(0, 0, pos, d) = value(id, pos, 0);
      *v.ptr(0, 0, pos, d) = value(id, pos, 1);
    }
}

template <class Coll>
bool tokens_intact(Coll coll, SeqId id, std::uint32_t n) {
  auto k = coll.get_key_cache(0), v = coll.get_value_cache(0);
  for (std::uint32_t pos = 0; pos < n; ++pos)
    for (std::uint32_t d = 0; d < kDim; ++d)
      if (*k.ptr(0, 0, pos, d) != value(id, pos, 0) || *v.ptr(0, 0, pos, d) != value(id, pos, 1))
        return false;
  return true;
}

struct Counters {
  std::atomic<std::uint64_t> ops{0}, expected_errors{0}, corrupted{0}, out_of_room{0};
};

template <class Coll>
Coll view(const KVCacheBatch& b);
template <>
PagedKVCacheCollection<float> view(const KVCacheBatch& b) { return b.paged<float>(); }
template <>
ContinuousBatchingKVCacheCollection<float> view(const KVCacheBatch& b) { return b.continuous<float>(); }

template <class Coll>
void worker(KVCacheManager& m, std::uint32_t seed, std::vector<std::atomic<SeqId>>& published,
            Counters& c) {
  std::mt19937 rng(seed);
  std::vector<std::pair<SeqId, std::uint32_t>> mine;  // id, length
  for (std::uint32_t op = 0; op < kOpsPerThread; ++op, ++c.ops) {
    const std::uint32_t r = rng() % 10;
    try {
      if (r < 2 && mine.size() < 2) {
        const SeqId id = m.claim(1)[0];
        mine.emplace_back(id, 0);
        published[seed % published.size()] = id;
      } else if (r < 7 && !mine.empty()) {
        auto& [id, len] = mine[rng() % mine.size()];
        const std::uint32_t n = 1 + rng() % 9;
        const std::vector<SeqId> ids{id};
        KVCacheBatch b = m.fetch(ids, std::vector<std::uint32_t>{n});
        write_tokens(view<Coll>(b), id, len, n);
        m.step(ids, std::vector<std::uint32_t>{n});
        len += n;
      } else if (r < 9 && !mine.empty()) {
        const std::size_t i = rng() % mine.size();
        const auto [id, len] = mine[i];
        const std::vector<SeqId> ids{id};
        KVCacheBatch b = m.fetch(ids, std::vector<std::uint32_t>{0});
        if (!tokens_intact(view<Coll>(b), id, len)) ++c.corrupted;
        m.release(id);
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));
      } else {  // a bad call on somebody else's (possibly released) id: must fail cleanly
        const SeqId other = published[rng() % published.size()].load();
        const std::vector<SeqId> ids{other, other};
        try {
          m.fetch(ids, std::vector<std::uint32_t>{1, 1});
        } catch (const InvalidArgument&) {
          ++c.expected_errors;
        } catch (const UnknownSequence&) {
          ++c.expected_errors;
        }
      }
    } catch (const OutOfPages&) {
      ++c.out_of_room;
    } catch (const CapacityExceeded&) {
      ++c.out_of_room;
    }
    // Long sequences are retired so the pool keeps turning over.
    for (std::size_t i = 0; i < mine.size(); ++i) {
      if (mine[i].second > 200) {
        m.release(mine[i].first);
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
  }
  for (const auto& [id, len] : mine) m.release(id);
}

template <class Coll>
void stress(KVCacheManager& m) {
  Counters c;
  std::vector<std::atomic<SeqId>> published(kThreads);
  for (auto& p : published) p = 1'000'000;
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] { worker<Coll>(m, t + 1, published, c); });
  for (auto& t : threads) t.join();
  m.check_invariants();
  EXPECT_EQ(m.free_blocks(), m.total_blocks()) << "blocks leaked";
  EXPECT_EQ(m.num_active_sequences(), 0u);
  EXPECT_EQ(c.corrupted.load(), 0u);
  EXPECT_EQ(c.ops.load(), std::uint64_t{kThreads} * kOpsPerThread);
  EXPECT_GT(c.expected_errors.load(), 0u);  // the bad calls really ran
}

KVCacheParams params(CacheStrategy s) {
  KVCacheParams p;
  p.num_layers = 1;
  p.n_kv_heads = 1;
  p.head_dim = kDim;
  p.cache_strategy = s;
  p.page_size = s == CacheStrategy::paged ? 8 : 0;
  return p;
}

TEST(Stress, PagedManyThreads) {
  // Fewer pages than the threads could want at once: OutOfPages happens and must be clean.
  PagedKVCacheManager m(params(CacheStrategy::paged), 300, kThreads * 2, 256);
  stress<PagedKVCacheCollection<float>>(m);
}

TEST(Stress, ContinuousManyThreads) {
  ContinuousBatchingKVCacheManager m(params(CacheStrategy::continuous), kThreads * 2, 256);
  stress<ContinuousBatchingKVCacheCollection<float>>(m);
}

}  // namespace
}  // namespace kvcache
