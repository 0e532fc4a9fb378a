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

TierWorkers::TierWorkers(std::size_t threads, std::chrono::microseconds linger)
    : q_(std::make_shared<Queue>()), linger_(std::max(linger, std::chrono::microseconds{0})) {
  threads_.reserve(threads);
  try {
    for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  } catch (const std::system_error& e) {
    {
      std::lock_guard lock(q_->mu);
      q_->stopping = true;
    }
    q_->cv.notify_all();
    for (std::thread& t : threads_) t.join();
    throw OutOfMemory("tier could not start I/O thread " + std::to_string(threads_.size()) +
                      " of " + std::to_string(threads) + ": " + e.what());
  }
}

TierWorkers::~TierWorkers() {
  {
    std::lock_guard lock(q_->mu);
    q_->stopping = true;
  }
  q_->cv.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::function<void()> TierWorkers::nudger() const {
  return [q = q_] { q->cv.notify_all(); };
}

void TierWorkers::post(std::function<void()> job, Wake wake) {
  if (threads_.empty()) {
    run_guarded(job);
    return;
  }
  bool wake_one = true;
  {
    std::lock_guard lock(q_->mu);
    q_->jobs.push_back(std::move(job));
    wake_one = wake == Wake::now || q_->napping == 0;  // else a napper takes it
  }
  if (wake_one) q_->cv.notify_one();
}

void TierWorkers::post_range(std::size_t n,
                             const std::function<void(std::size_t, std::size_t)>& job, Wake wake) {
  if (n == 0) return;
  if (threads_.empty()) {
    run_guarded([&] { job(0, n); });
    return;
  }
  const std::size_t parts = std::min(n, threads_.size());
  bool wake_one = true;
  {
    std::lock_guard lock(q_->mu);
    for (std::size_t p = 0; p < parts; ++p) {
      const std::size_t begin = n * p / parts, end = n * (p + 1) / parts;
      q_->jobs.push_back([job, begin, end] { job(begin, end); });
    }
    wake_one = wake == Wake::now || q_->napping == 0;  // else a napper takes it
  }
  if (wake_one) q_->cv.notify_one();  // that thread wakes the next if jobs are left (run)
}

void TierWorkers::run() {
  Queue& q = *q_;
  const auto ready = [&] { return q.stopping || !q.jobs.empty(); };
  std::unique_lock lock(q.mu);
  for (;;) {
    if (!ready() && linger_.count() > 0) {
      ++q.napping;
      q.cv.wait_for(lock, linger_, ready);
      --q.napping;
    }
    q.cv.wait(lock, ready);
    if (q.jobs.empty()) return;  // stopping, and nothing left
    std::function<void()> job = std::move(q.jobs.front());
    q.jobs.pop_front();
    const bool more = !q.jobs.empty();
    lock.unlock();
    if (more) q.cv.notify_one();  // post_range woke one thread: pass the rest on
    run_guarded(job);
    lock.lock();
  }
}

}  // namespace kvcache::tier
