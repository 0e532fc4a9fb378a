// kvcache/thread_pool.h — a fixed set of worker threads for the kernels.
//
// Threads are created once, in the constructor, and joined in the destructor
// (RAII); kernels never create threads per call. `parallel_for(n, fn)` runs
// fn(i) for i in [0, n) across the workers plus the calling thread and
// returns when all are done; the first exception thrown by fn is rethrown in
// the caller after the others finished. One parallel_for at a time per pool
// (calls from several threads are serialised); do not call parallel_for from
// inside fn.
//
// Idle workers spin for about 100 us, then sleep until the next call. The
// caller runs indices too and never waits for a worker to wake: when it has
// taken every index it returns as soon as the workers that joined are done,
// so a call after an idle gap takes at most what the caller alone would
// (plus the wake-up signal), not the sleeping threads' wake-up latency.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

namespace kvcache {

class ThreadPool {
 public:
  // num_threads counts the calling thread: 1 means no workers (runs inline).
  // 0 means std::thread::hardware_concurrency(). Throws InvalidArgument past
  // 1024, and OutOfMemory when the system refuses a thread part-way (a
  // process or memory limit): the workers already started are stopped and
  // joined first, so a failed construction neither hangs nor leaks a thread.
  explicit ThreadPool(std::size_t num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t num_threads() const;
  void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache
