// ThreadPool construction when the system refuses a thread part-way (issue
// 40, item 4): it must throw OutOfMemory (C: KVC_OUT_OF_MEMORY) after
// stopping the workers it started, never hang or terminate. Each case runs in
// a death-test child so that the failure it guards against (std::terminate,
// or workers waiting on a destroyed condition variable) cannot take the
// suite down; alarm() turns a hang into a failure.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "kernels/cpu/thread_pool_start.h"
#include "kvcache/c_api.h"
#include "kvcache/error.h"
#include "kvcache/thread_pool.h"

namespace kvcache {
namespace {

constexpr unsigned kHangSeconds = 30;

// Threads of this process now (/proc/self/status).
int threads_now() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// Exits 0 if constructing a pool of n threads throws OutOfMemory naming the
// refused worker (`refused`, or any when 0) and leaves no thread behind, 1-3
// otherwise.
[[noreturn]] void expect_refused_cleanly(std::size_t n, std::size_t refused = 0) {
  const int before = threads_now();
  try {
    ThreadPool pool(n);
    std::fprintf(stderr, "a pool of %zu threads was built\n", n);
    std::_Exit(1);
  } catch (const OutOfMemory& e) {
    const std::string want =
        refused == 0 ? "refused worker " : "refused worker " + std::to_string(refused) + " (";
    if (std::string(e.what()).find(want) == std::string::npos) {
      std::fprintf(stderr, "message: %s\n", e.what());
      std::_Exit(2);
    }
  }
  std::_Exit(threads_now() == before ? 0 : 3);
}

class ThreadPoolFailure : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(ThreadPoolFailure, RefusedThreadGivesOutOfMemoryAndStopsTheOthers) {
  for (const std::size_t refused : {1u, 2u, 7u}) {
    EXPECT_EXIT(
        {
          alarm(kHangSeconds);
          detail::fail_pool_thread_start_at(refused);
          expect_refused_cleanly(8, refused);
        },
        ::testing::ExitedWithCode(0), "")
        << "worker " << refused << " refused";
  }
}

TEST_F(ThreadPoolFailure, PoolStillWorksAfterARefusal) {
  EXPECT_EXIT(
      {
        alarm(kHangSeconds);
        detail::fail_pool_thread_start_at(3);
        try {
          ThreadPool failed(4);
          std::_Exit(1);
        } catch (const OutOfMemory&) {
        }
        detail::fail_pool_thread_start_at(0);
        ThreadPool pool(4);
        std::atomic<int> ran{0};
        pool.parallel_for(100, [&](std::size_t) { ran.fetch_add(1); });
        std::_Exit(ran.load() == 100 ? 0 : 4);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(ThreadPoolFailure, CInterfaceReturnsOutOfMemory) {
  EXPECT_EXIT(
      {
        alarm(kHangSeconds);
        detail::fail_pool_thread_start_at(5);
        kvc_thread_pool* pool = nullptr;
        kvc_error err{};
        const kvc_status s = kvc_thread_pool_create(16, &pool, &err);
        const bool named = std::string(err.message).find("refused worker 5") != std::string::npos;
        std::_Exit(s == KVC_OUT_OF_MEMORY && err.status == KVC_OUT_OF_MEMORY && pool == nullptr &&
                           named
                       ? 0
                       : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// The real thing: an address-space limit that leaves room for a few 8 MiB
// thread stacks, then a pool of 1024. Sanitizers reserve terabytes of
// address space up front, so the limit cannot be set under them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Bytes of address space this process maps now (/proc/self/statm, field 1).
long long mapped_bytes() {
  std::ifstream in("/proc/self/statm");
  long long pages = 0;
  in >> pages;
  return pages * sysconf(_SC_PAGESIZE);
}

// In the child: an address-space limit of what is mapped now plus 64 MiB.
[[noreturn]] void refused_under_address_limit() {
  alarm(kHangSeconds);
  const auto limit = static_cast<rlim_t>(mapped_bytes() + (64LL << 20));
  rlimit r{};
  r.rlim_cur = limit;
  r.rlim_max = limit;
  if (setrlimit(RLIMIT_AS, &r) != 0) std::_Exit(5);
  expect_refused_cleanly(1024);
}

TEST_F(ThreadPoolFailure, AddressSpaceLimitRefusesThreadsCleanly) {
  if (kSanitized) GTEST_SKIP() << "RLIMIT_AS cannot be set under a sanitizer";
  EXPECT_EXIT(refused_under_address_limit(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kvcache
