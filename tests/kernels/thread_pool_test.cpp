#include "kvcache/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kvcache/error.h"

namespace kvcache {
namespace {

TEST(ThreadPool, RunsEveryIndexExactlyOnce) {
  for (std::size_t threads : {1u, 2u, 4u}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (std::size_t n : {0u, 1u, 3u, 1000u}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](std::size_t i) { hits[i].fetch_add(1); });
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
    }
  }
}

TEST(ThreadPool, ReusesItsThreadsAcrossManyCalls) {
  ThreadPool pool(2);
  std::atomic<long> sum{0};
  for (int call = 0; call < 2000; ++call) {
    pool.parallel_for(4, [&](std::size_t i) { sum.fetch_add(static_cast<long>(i)); });
  }
  EXPECT_EQ(sum.load(), 2000L * 6);
}

TEST(ThreadPool, RethrowsTheFirstExceptionAfterAllFinish) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(100,
                                 [&](std::size_t i) {
                                   ran.fetch_add(1);
                                   if (i % 10 == 3) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 100);
  // Still usable afterwards.
  std::atomic<int> again{0};
  pool.parallel_for(10, [&](std::size_t) { again.fetch_add(1); });
  EXPECT_EQ(again.load(), 10);
}

// Calls after idle gaps long enough for the workers to fall asleep: the
// caller may finish every index itself and return before a worker wakes, so
// a late worker must neither run an index of a call that has returned nor
// lose one. Each index counts its runs (exactly one), and no fn may see its
// call already returned.
TEST(ThreadPool, WorkersThatWakeLateNeverTouchAReturnedCall) {
  for (const std::size_t threads : {2u, 3u}) {
    ThreadPool pool(threads);
    for (int call = 0; call < 120; ++call) {
      const int gap_us = std::vector<int>{0, 20, 150, 1500}[call % 4];
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(gap_us);
      while (std::chrono::steady_clock::now() < until) {
      }
      const std::size_t n = 1 + static_cast<std::size_t>(call % 5);
      std::vector<std::atomic<int>> hits(n);
      std::atomic<bool> returned{false};
      std::atomic<int> after_return{0};
      pool.parallel_for(n, [&](std::size_t i) {
        if (returned.load()) after_return.fetch_add(1);
        hits[i].fetch_add(1);
      });
      returned.store(true);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "call " << call;
      ASSERT_EQ(after_return.load(), 0) << "call " << call;
    }
  }
}

TEST(ThreadPool, SizeLimits) {
  ThreadPool def(0);
  EXPECT_EQ(def.num_threads(), std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_THROW(ThreadPool(1025), InvalidArgument);
}

TEST(ThreadPool, ConcurrentCallersAreSerialised) {
  ThreadPool pool(2);
  std::atomic<long> total{0};
  auto caller = [&] {
    for (int i = 0; i < 200; ++i) pool.parallel_for(8, [&](std::size_t) { total.fetch_add(1); });
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2L * 200 * 8);
}

}  // namespace
}  // namespace kvcache
