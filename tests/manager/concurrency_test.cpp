// Many threads driving one manager: each owns its sequences, writes a
// per-sequence pattern through views and verifies it; afterwards the manager
// is consistent and every block is free again.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::U32;

constexpr std::uint32_t kThreads = 6;
constexpr std::uint32_t kSeqsPerThread = 2;
constexpr std::uint32_t kMaxSeq = 48;
constexpr int kOpsPerThread = 2000;

struct Live {
  SeqId id;
  std::uint32_t length;
};

template <class Coll>
bool write_and_verify(const Coll& coll, std::uint32_t b, SeqId id, std::uint32_t from,
                      std::uint32_t to, const KVCacheParams& p) {
  for (std::uint32_t l = 0; l < p.num_layers; ++l)
    for (std::uint32_t kv = 0; kv < 2; ++kv) {
      const auto c = kv ? coll.get_value_cache(l) : coll.get_key_cache(l);
      for (std::uint32_t t = from; t < to; ++t)
        for (std::uint32_t h = 0; h < c.n_kv_heads(); ++h)
          for (std::uint32_t d = 0; d < c.head_dim(); ++d)
            *c.ptr(b, h, t, d) = kvtest::pattern_value(id, l, kv, h, t, d);
    }
  for (std::uint32_t l = 0; l < p.num_layers; ++l)
    for (std::uint32_t kv = 0; kv < 2; ++kv) {
      const auto c = kv ? coll.get_value_cache(l) : coll.get_key_cache(l);
      for (std::uint32_t t = 0; t < to; ++t)
        for (std::uint32_t h = 0; h < c.n_kv_heads(); ++h)
          for (std::uint32_t d = 0; d < c.head_dim(); ++d)
            if (*c.ptr(b, h, t, d) != kvtest::pattern_value(id, l, kv, h, t, d)) return false;
    }
  return true;
}

void run_concurrent(KVCacheManager& mgr) {
  std::atomic<int> failures{0};
  std::atomic<int> verified{0};
  auto worker = [&](std::uint32_t tid) {
    std::mt19937_64 rng(1000 + tid);
    std::vector<Live> mine;
    for (int op = 0; op < kOpsPerThread; ++op) {
      try {
        if (mine.size() < kSeqsPerThread) {
          for (SeqId id : mgr.claim(1)) mine.push_back({id, 0});
          continue;
        }
        const std::size_t i = rng() % mine.size();
        Live& s = mine[i];
        const std::uint32_t room = kMaxSeq - s.length;
        if (room == 0 || rng() % 16 == 0) {
          // Every fetch verified all tokens so far; now give it back.
          mgr.release(s.id);
          if (mgr.contains(s.id)) ++failures;
          mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
        // Sometimes batch both of this thread's sequences.
        const bool pair = mine.size() == 2 && rng() % 2 == 0;
        Ids ids{s.id};
        U32 news{1 + static_cast<std::uint32_t>(rng() % std::min(room, 6u))};
        if (pair) {
          Live& o = mine[1 - i];
          if (o.length < kMaxSeq) {
            ids.push_back(o.id);
            news.push_back(1);
          }
        }
        KVCacheBatch batch = mgr.fetch(ids, news);
        for (std::uint32_t b = 0; b < ids.size(); ++b) {
          Live& l = ids[b] == s.id ? s : mine[1 - i];
          if (batch.cache_lengths()[b] != l.length) ++failures;
          const bool ok = batch.strategy() == CacheStrategy::paged
                              ? write_and_verify(batch.paged<float>(), b, l.id, l.length,
                                                 l.length + news[b], mgr.params())
                              : write_and_verify(batch.continuous<float>(), b, l.id, l.length,
                                                 l.length + news[b], mgr.params());
          if (!ok) ++failures;
          ++verified;
        }
        mgr.step(ids, news);
        for (std::uint32_t b = 0; b < ids.size(); ++b) {
          Live& l = ids[b] == s.id ? s : mine[1 - i];
          l.length += news[b];
          if (mgr.cache_length(l.id) != l.length) ++failures;
        }
      } catch (const std::exception& e) {
        ++failures;
        ADD_FAILURE() << "thread " << tid << ": " << e.what();
        return;
      }
    }
    for (const Live& s : mine) mgr.release(s.id);
  };
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(verified.load(), kThreads * kOpsPerThread / 2);
  EXPECT_NO_THROW(mgr.check_invariants());
  EXPECT_EQ(mgr.free_blocks(), mgr.total_blocks());
  EXPECT_EQ(mgr.num_active_sequences(), 0u);
  const auto snap = mgr.snapshot();
  EXPECT_TRUE(snap.sequences.empty());
  EXPECT_EQ(snap.free_blocks.size(), mgr.total_blocks());
}

TEST(Concurrency, PagedManyThreads) {
  auto p = kvtest::paged_params(2, 2, 8, 4);
  // Enough pages that no thread ever runs out.
  PagedKVCacheManager mgr(p, kThreads * kSeqsPerThread * (kMaxSeq / 4), kThreads * kSeqsPerThread,
                          kMaxSeq);
  run_concurrent(mgr);
}

TEST(Concurrency, ContinuousManyThreads) {
  auto p = kvtest::continuous_params(2, 2, 8);
  ContinuousBatchingKVCacheManager mgr(p, kThreads * kSeqsPerThread, kMaxSeq);
  run_concurrent(mgr);
}

// Threads race for a pool that is too small: every fetch either succeeds
// whole or throws OutOfPages, and nothing leaks.
TEST(Concurrency, PagedContentionForScarcePages) {
  auto p = kvtest::paged_params(1, 1, 4, 2);
  PagedKVCacheManager mgr(p, 24, 16, 32);
  std::atomic<int> ok{0}, out_of_pages{0}, other{0};
  auto worker = [&](std::uint32_t tid) {
    std::mt19937_64 rng(tid);
    for (int i = 0; i < 400; ++i) {
      Ids ids;
      try {
        ids = mgr.claim(2);
      } catch (const CapacityExceeded&) {
        continue;
      }
      try {
        const U32 n{1 + static_cast<std::uint32_t>(rng() % 12),
                    1 + static_cast<std::uint32_t>(rng() % 12)};
        KVCacheBatch b = mgr.fetch(ids, n);
        mgr.step(ids, n);
        ++ok;
      } catch (const OutOfPages&) {
        ++out_of_pages;
        for (SeqId id : ids)
          if (mgr.cache_length(id) != 0) ++other;  // all or nothing
      } catch (const std::exception&) {
        ++other;
      }
      for (SeqId id : ids) mgr.release(id);
    }
  };
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 8; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(ok.load(), 0);
  EXPECT_NO_THROW(mgr.check_invariants());
  EXPECT_EQ(mgr.free_blocks(), mgr.total_blocks());
  EXPECT_EQ(mgr.num_active_sequences(), 0u);
}

}  // namespace
