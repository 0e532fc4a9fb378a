// TierWorkers: a tier's own I/O threads, a FIFO of jobs.
//
// post() queues a job; one of the threads runs it. post_range(n, job) queues
// job(begin, end) over [0, n) cut into at most threads() contiguous ranges,
// under one lock, waking one thread, which wakes the next while jobs are left
// (a tier's store or load of n pages costs its caller one wake-up, not n).
// With 0 threads both run the work at once in the caller's thread (a
// synchronous tier). The destructor runs every job still queued (jobs may
// post more), then joins: a tier destroys its workers first, so every page
// it accepted finishes. Jobs must not throw (an exception escaping one is
// swallowed).
//
// Lingering: a thread that runs out of jobs first naps for `linger` (a timed
// wait) before it sleeps. A post with Wake::lazy (write-backs, which nobody
// waits for) wakes no thread while one naps: the napper takes the job when
// its nap ends, at most `linger` later, so a caller posting often pays no
// wake-up (on a VM a futex wake of another vCPU costs the caller microseconds).
// Wake::now (loads) always wakes one. nudger() gives what a waiter calls
// before it blocks on lazily posted work (TierTicket::State::set_nudge):
// it wakes every thread, and stays safe to call after the workers are gone.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvcache::tier {

class TierWorkers {
 public:
  enum class Wake { now, lazy };
  static constexpr std::chrono::microseconds kDefaultLinger{1000};

  explicit TierWorkers(std::size_t threads, std::chrono::microseconds linger = kDefaultLinger);
  ~TierWorkers();
  TierWorkers(const TierWorkers&) = delete;
  TierWorkers& operator=(const TierWorkers&) = delete;

  void post(std::function<void()> job, Wake wake = Wake::now);
  void post_range(std::size_t n, const std::function<void(std::size_t, std::size_t)>& job,
                  Wake wake = Wake::now);
  std::size_t threads() const { return threads_.size(); }
  // Wakes every thread; holds the queue's state alive, not the workers.
  std::function<void()> nudger() const;

 private:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> jobs;
    std::size_t napping = 0;  // threads in a timed wait
    bool stopping = false;
  };
  void run();

  std::shared_ptr<Queue> q_;
  std::chrono::microseconds linger_;
  std::vector<std::thread> threads_;
};

}  // namespace kvcache::tier
