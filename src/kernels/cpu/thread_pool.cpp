// ThreadPool: workers created once, woken per parallel_for through a
// generation counter (brief spin, then a condition variable), indices handed
// out with an atomic counter so uneven items balance dynamically.
//
// The caller does not wait for workers to wake up: once it has run out of
// indices it closes the call and waits only for the workers that had joined
// it (entered before the close). A worker asleep on the condition variable
// (after ~100 us idle) takes 20-90 us to wake on a 2-vCPU VM; the caller that
// waited for it paid that on every call after an idle gap, even when it had
// run every index itself.
#include "kvcache/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cpu/thread_pool_start.h"
#include "kvcache/error.h"

namespace kvcache {

namespace {
constexpr std::size_t kMaxThreads = 1024;
constexpr int kSpinIterations = 4000;

std::atomic<std::size_t> g_fail_start_at{0};  // fail_pool_thread_start_at

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

namespace detail {

std::thread start_pool_thread(std::size_t index, std::function<void()> fn) {
  if (index == g_fail_start_at.load(std::memory_order_relaxed)) {
    throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                            "thread start refused by fail_pool_thread_start_at");
  }
  return std::thread(std::move(fn));
}

void fail_pool_thread_start_at(std::size_t index) {
  g_fail_start_at.store(index, std::memory_order_relaxed);
}

}  // namespace detail

struct ThreadPool::Impl {
  // Starts n - 1 workers. When the system refuses one (std::system_error from
  // std::thread, or no memory for the vector), the workers already running
  // are stopped and joined before OutOfMemory is thrown: none is left
  // waiting on a condition variable that is about to be destroyed.
  explicit Impl(std::size_t n) : num_threads(n) {
    try {
      workers.reserve(n - 1);
      for (std::size_t i = 1; i < n; ++i)
        workers.push_back(detail::start_pool_thread(i, [this] { worker_loop(); }));
    } catch (const std::system_error& e) {
      fail(refused(n, e.what()));
    } catch (const std::bad_alloc&) {
      fail(refused(n, "out of memory"));
    }
  }

  ~Impl() { stop_workers(); }

  [[noreturn]] void fail(const std::string& message) {
    stop_workers();
    throw OutOfMemory(message);
  }

  // Names the worker that could not start (workers 1 .. size() are running).
  std::string refused(std::size_t n, const char* why) const {
    return "ThreadPool of " + std::to_string(n) + " threads: the system refused worker " +
           std::to_string(workers.size() + 1) + " (" + why + ")";
  }

  void stop_workers() {
    {
      std::lock_guard lock(mu);
      stop = true;
      generation.fetch_add(1, std::memory_order_release);
    }
    wake.notify_all();
    for (auto& w : workers) w.join();
    workers.clear();
  }

  // Runs indices until none are left; records the first exception.
  void drain() {
    for (;;) {
      const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= count) break;
      try {
        (*job)(i);
      } catch (...) {
        std::lock_guard lock(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  }

  void worker_loop() {
    std::uint64_t seen = 0;
    for (;;) {
      std::uint64_t g = generation.load(std::memory_order_acquire);
      for (int spin = 0; g == seen && spin < kSpinIterations; ++spin) {
        cpu_relax();
        g = generation.load(std::memory_order_acquire);
      }
      if (g == seen) {
        std::unique_lock lock(mu);
        wake.wait(lock, [&] { return generation.load(std::memory_order_acquire) != seen; });
        g = generation.load(std::memory_order_acquire);
      }
      seen = g;
      if (stop) return;
      // Join the call only while it is open: entering (seq_cst) before
      // looking at open_call, against the caller's close before it reads
      // `active`, means that either this worker sees the call closed or the
      // caller sees it active and waits for it.
      active.fetch_add(1, std::memory_order_seq_cst);
      if (open_call.load(std::memory_order_seq_cst) == seen) drain();
      if (active.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard lock(mu);
        done.notify_all();
      }
    }
  }

  void run(std::size_t n, const std::function<void(std::size_t)>& fn) {
    std::lock_guard call_lock(call_mu);  // one parallel_for at a time
    job = &fn;
    count = n;
    error = nullptr;
    next.store(0, std::memory_order_relaxed);
    const std::uint64_t call = generation.load(std::memory_order_relaxed) + 1;
    open_call.store(call, std::memory_order_seq_cst);
    {
      std::lock_guard lock(mu);
      generation.store(call, std::memory_order_release);
    }
    wake.notify_all();
    drain();
    // Every index is taken: close the call, then wait for the workers inside it.
    open_call.store(0, std::memory_order_seq_cst);
    for (int spin = 0; active.load(std::memory_order_seq_cst) != 0 && spin < kSpinIterations;
         ++spin) {
      cpu_relax();
    }
    if (active.load(std::memory_order_seq_cst) != 0) {
      std::unique_lock lock(mu);
      done.wait(lock, [&] { return active.load(std::memory_order_acquire) == 0; });
    }
    job = nullptr;
    if (error) std::rethrow_exception(std::exchange(error, nullptr));
  }

  const std::size_t num_threads;
  std::vector<std::thread> workers;
  std::mutex call_mu;
  std::mutex mu;
  std::condition_variable wake;
  std::condition_variable done;
  std::atomic<std::uint64_t> generation{0};
  std::atomic<std::size_t> next{0};
  // The generation of the call workers may still join (0: none), and the
  // workers inside a call.
  std::atomic<std::uint64_t> open_call{0};
  std::atomic<std::size_t> active{0};
  const std::function<void(std::size_t)>* job = nullptr;
  std::size_t count = 0;
  bool stop = false;
  std::mutex error_mu;
  std::exception_ptr error;
};

namespace {
std::size_t resolve_threads(std::size_t n) {
  if (n > kMaxThreads) {
    throw InvalidArgument("ThreadPool num_threads " + std::to_string(n) + " exceeds the limit " +
                          std::to_string(kMaxThreads));
  }
  if (n == 0) n = std::max<std::size_t>(1, std::thread::hardware_concurrency());
  return n;
}
}  // namespace

ThreadPool::ThreadPool(std::size_t num_threads)
    : impl_(std::make_unique<Impl>(resolve_threads(num_threads))) {}

ThreadPool::~ThreadPool() = default;

std::size_t ThreadPool::num_threads() const { return impl_->num_threads; }

void ThreadPool::parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) {
  if (n == 0) return;
  if (impl_->workers.empty() || n == 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  impl_->run(n, fn);
}

}  // namespace kvcache
