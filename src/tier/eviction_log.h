// EvictionLog: the keys of the pages a tier evicted for room, kept until
// Tier::take_evicted hands them over (kvcache/tier.h).
//
// A ring of Tier::kEvictionReports keys allocated at construction, so
// record() never allocates: a tier records under its own lock, on its worker
// threads. When the ring is full the oldest key gives way (counted in
// lost()). take() appends the keys, oldest first, and empties the ring; with
// nothing recorded it returns after one atomic load, without locking.
// Thread-safe: its own mutex, a leaf (nothing is called under it), so a tier
// may record while holding its lock and a manager may take while holding its.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "kvcache/tier.h"

namespace kvcache::tier {

class EvictionLog {
 public:
  EvictionLog() : ring_(Tier::kEvictionReports) {}

  void record(const PageKey& key) noexcept {
    std::lock_guard lock(mu_);
    const std::size_t n = size_.load(std::memory_order_relaxed);
    if (n == ring_.size()) {
      head_ = (head_ + 1) % ring_.size();  // the oldest gives way
      ++lost_;
    } else {
      size_.store(n + 1, std::memory_order_release);
    }
    ring_[(head_ + (n == ring_.size() ? n - 1 : n)) % ring_.size()] = key;
  }

  // Appends at most Tier::kEvictionReports keys to out.
  void take(std::vector<PageKey>& out) {
    if (size_.load(std::memory_order_acquire) == 0) return;
    std::lock_guard lock(mu_);
    const std::size_t n = size_.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < n; ++i) out.push_back(ring_[(head_ + i) % ring_.size()]);
    head_ = 0;
    size_.store(0, std::memory_order_release);
  }

  std::uint64_t lost() const {
    std::lock_guard lock(mu_);
    return lost_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<PageKey> ring_;
  std::size_t head_ = 0;              // under mu_
  std::atomic<std::size_t> size_{0};  // written under mu_
  std::uint64_t lost_ = 0;            // under mu_
};

}  // namespace kvcache::tier
