// TierWorkers: a tier's own I/O threads, a FIFO of jobs.
//
// post() queues a job; one of the threads runs it. post_range(n, job) queues
// job(begin, end) over [0, n) cut into at most threads() contiguous ranges,
// under one lock, waking one thread, which wakes the next while jobs are left
// (a tier's store or load of n pages costs its caller one wake-up, not n). With 0 threads both run
// the work at once in the caller's thread (a synchronous tier). The
// destructor runs every job still queued (jobs may post more), then joins:
// a tier destroys its workers first, so every page it accepted finishes.
// Jobs must not throw (an exception escaping one is swallowed).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvcache::tier {

class TierWorkers {
 public:
  explicit TierWorkers(std::size_t threads);
  ~TierWorkers();
  TierWorkers(const TierWorkers&) = delete;
  TierWorkers& operator=(const TierWorkers&) = delete;

  void post(std::function<void()> job);
  void post_range(std::size_t n, const std::function<void(std::size_t, std::size_t)>& job);
  std::size_t threads() const { return threads_.size(); }

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvcache::tier
