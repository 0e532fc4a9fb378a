// TierTicket::State: what a tier's I/O threads fill and a ticket reads.
//
// A tier makes one State per store() / load() call with one result per page
// (pending), hands the caller TierTicket(state), and its workers call
// finish_load / finish_store for each page, in any order, from any thread.
// done() turns true when the last page is finished (an atomic read, no lock);
// wait() blocks until then. Each result is written under the mutex before the
// count drops (release), so a reader that saw done() (acquire) sees them all.
// A tier that queues the work lazily (TierWorkers::Wake::lazy) sets a nudge
// before it hands the ticket out: wait() calls it before blocking, so a
// waiter never waits out a worker's nap.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kvcache/tier.h"

namespace kvcache {

struct TierTicket::State {
  // A load ticket (loads > 0) or a store ticket; n pages.
  static std::shared_ptr<State> for_loads(std::size_t n) {
    auto s = std::make_shared<State>();
    s->loads_.assign(n, LoadResult::pending);
    s->remaining_.store(n, std::memory_order_relaxed);
    return s;
  }
  static std::shared_ptr<State> for_stores(std::size_t n) {
    auto s = std::make_shared<State>();
    s->stores_.assign(n, StoreResult::pending);
    s->remaining_.store(n, std::memory_order_relaxed);
    return s;
  }

  // Before the ticket is handed out (not thread-safe against wait()).
  void set_nudge(std::function<void()> nudge) { nudge_ = std::move(nudge); }

  void finish_load(std::size_t i, LoadResult r) { finish(loads_[i], r); }
  void finish_store(std::size_t i, StoreResult r) { finish(stores_[i], r); }

  bool done() const { return remaining_.load(std::memory_order_acquire) == 0; }
  void wait() const {
    if (done()) return;
    if (nudge_) nudge_();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done(); });
  }
  std::span<const LoadResult> load_results() const {
    wait();
    return loads_;
  }
  std::span<const StoreResult> store_results() const {
    wait();
    return stores_;
  }

 private:
  template <class R>
  void finish(R& slot, R r) {
    std::lock_guard lock(mu_);
    if (slot != R::pending) return;  // a page finishes once
    slot = r;
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) cv_.notify_all();
  }

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<LoadResult> loads_;
  std::vector<StoreResult> stores_;
  std::atomic<std::size_t> remaining_{0};
  std::function<void()> nudge_;
};

}  // namespace kvcache
