#include "tier/workers.h"

#include <algorithm>
#include <string>

#include "kvcache/error.h"

namespace kvcache::tier {

namespace {
void run_guarded(const std::function<void()>& job) noexcept {
  try {
    job();
  } catch (...) {  // a job reports its own failures; nothing may escape a worker
  }
}
}  // namespace

TierWorkers::TierWorkers(std::size_t threads) {
  threads_.reserve(threads);
  try {
    for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  } catch (const std::system_error& e) {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
    throw OutOfMemory("tier could not start I/O thread " + std::to_string(threads_.size()) +
                      " of " + std::to_string(threads) + ": " + e.what());
  }
}

TierWorkers::~TierWorkers() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void TierWorkers::post(std::function<void()> job) {
  if (threads_.empty()) {
    run_guarded(job);
    return;
  }
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void TierWorkers::post_range(std::size_t n,
                             const std::function<void(std::size_t, std::size_t)>& job) {
  if (n == 0) return;
  if (threads_.empty()) {
    run_guarded([&] { job(0, n); });
    return;
  }
  const std::size_t parts = std::min(n, threads_.size());
  {
    std::lock_guard lock(mu_);
    for (std::size_t p = 0; p < parts; ++p) {
      const std::size_t begin = n * p / parts, end = n * (p + 1) / parts;
      jobs_.push_back([job, begin, end] { job(begin, end); });
    }
  }
  cv_.notify_one();  // that thread wakes the next if jobs are left (run)
}

void TierWorkers::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and nothing left
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    const bool more = !jobs_.empty();
    lock.unlock();
    if (more) cv_.notify_one();  // post_range woke one thread: pass the rest on
    run_guarded(job);
    lock.lock();
  }
}

}  // namespace kvcache::tier
