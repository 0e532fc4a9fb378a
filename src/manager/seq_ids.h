// Sequence-id bookkeeping shared by the managers (SeqIdPolicy, manager.h).
//
// never_reuse hands out 0, 1, 2, ... and forgets released ids. lowest_free
// keeps the released ids below the high-water mark in a min-heap and hands
// out the smallest first, so every id in use is below the peak number of
// sequences in use at once (hence below max_batch_size). take() and
// release() are O(log n) and allocate nothing once reserve() made room.
// Not thread-safe: the owning manager locks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvcache/error.h"
#include "kvcache/manager.h"

namespace kvcache::manager {

class SeqIdAllocator {
 public:
  explicit SeqIdAllocator(SeqIdPolicy policy) : policy_(policy) {}

  // Room for n more take() calls and for releasing every id ever taken
  // without allocating. Throws std::bad_alloc (nothing changed).
  void reserve(std::uint32_t n) {
    if (policy_ == SeqIdPolicy::lowest_free) free_.reserve(next_ + n);
  }

  // The next id under the policy. Precondition: reserve() covered this call.
  SeqId take() noexcept {
    if (free_.empty()) return next_++;
    std::pop_heap(free_.begin(), free_.end(), std::greater<>{});
    const SeqId id = free_.back();
    free_.pop_back();
    return id;
  }

  // Gives back an id in use (lowest_free: it will be handed out again).
  void release(SeqId id) noexcept {
    if (policy_ != SeqIdPolicy::lowest_free) return;
    free_.push_back(id);  // capacity reserved when the id was taken
    std::push_heap(free_.begin(), free_.end(), std::greater<>{});
  }

  // Undoes the take() calls that returned `ids` since next_id() was `mark`
  // (all or nothing claims).
  void rollback(std::span<const SeqId> ids, SeqId mark) noexcept {
    for (SeqId id : ids) {
      if (id < mark) release(id);
    }
    next_ = mark;
  }

  // One past the highest id ever handed out (the high-water mark).
  SeqId next_id() const { return next_; }

  // Audits the ids against the manager's sequence map: every id in use is
  // below next_id(); with lowest_free the free ids and the ids in use are
  // exactly [0, next_id()), and next_id() <= max_batch_size. Throws Error.
  template <class SequenceMap>
  void check(const SequenceMap& seqs, std::uint32_t max_batch_size) const {
    for (const auto& entry : seqs) {
      if (entry.first >= next_) {
        throw Error("seq " + std::to_string(entry.first) + " is not below next id " +
                    std::to_string(next_));
      }
    }
    if (policy_ != SeqIdPolicy::lowest_free) return;
    if (next_ > max_batch_size) {
      throw Error("next id " + std::to_string(next_) + " passed max_batch_size " +
                  std::to_string(max_batch_size) + " under lowest_free ids");
    }
    std::vector<SeqId> sorted = free_;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      if (sorted[i] >= next_ || (i > 0 && sorted[i] == sorted[i - 1]) || seqs.count(sorted[i])) {
        throw Error("free seq id " + std::to_string(sorted[i]) +
                    " is in use, listed twice or not below next id");
      }
    }
    if (sorted.size() + seqs.size() != next_) {
      throw Error(std::to_string(sorted.size()) + " free and " + std::to_string(seqs.size()) +
                  " used seq ids do not cover [0, " + std::to_string(next_) + ")");
    }
  }

 private:
  SeqIdPolicy policy_;
  SeqId next_ = 0;
  std::vector<SeqId> free_;  // lowest_free: min-heap of released ids below next_
};

}  // namespace kvcache::manager
