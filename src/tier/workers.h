// TierWorkers: a tier's own I/O threads, a FIFO of jobs.
//
// post() queues a job; one of the threads runs it. With 0 threads post()
// runs the job at once in the caller's thread (a synchronous tier). The
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
