// TierLink's side of a pool kept apart from the manager's (TierConfig::
// pool_apart): the write-back slots that wait for the caller's bytes and the
// uploads of pages a load filled in the host pool (manager/tier_link.h).
#include <algorithm>
#include <string>

#include "kvcache/error.h"
#include "manager/tier_link.h"

namespace kvcache::manager {

std::uint64_t TierLink::apart_bytes(std::uint32_t num_pages, const TierConfig& config) {
  // A fresh flag and a place in the upload list per page.
  return config.pool_apart && !config.tiers.empty()
             ? std::uint64_t{num_pages} * (sizeof(std::uint8_t) + sizeof(std::uint32_t))
             : 0;
}

void TierLink::loaded(std::uint32_t page) noexcept {
  if (!pool_apart_ || fresh_[page] != 0) return;
  fresh_[page] = 1;
  uploads_.push_back(page);  // capacity: every page, each listed once
}

void TierLink::taken(std::uint32_t page) noexcept {
  if (!pool_apart_ || fresh_[page] == 0) return;
  fresh_[page] = 0;
  uploads_.erase(std::find(uploads_.begin(), uploads_.end(), page));
}

std::size_t TierLink::offload_bound(std::uint64_t evictions) const noexcept {
  if (!pool_apart_) return 0;
  return shards_ * static_cast<std::size_t>(std::min<std::uint64_t>(
                       slots_.size(), awaiting_.size() + evictions));  // an offload per device
}

std::uint64_t TierLink::hand_out(std::vector<BlockOffload>& offloads,
                                 std::vector<std::uint32_t>& loads) noexcept {
  offloads.clear();
  loads.clear();
  if (!pool_apart_) return 0;
  const std::uint64_t serial = ++serial_;
  const std::size_t pb = bytes_.front().page_bytes();
  for (std::uint32_t i : awaiting_) {
    slots_[i].serial = serial;
    for (std::uint32_t d = 0; d < shards_; ++d)  // capacity: offload_bound
      offloads.push_back({slots_[i].page, std::span(slots_[i].bytes).subspan(d * pb, pb), d});
    handed_.push_back(i);  // capacity: every slot
  }
  awaiting_.clear();
  for (std::uint32_t page : uploads_) {
    fresh_[page] = 0;       // the caller's pool holds it once it applies the batch
    loads.push_back(page);  // capacity: upload_bound
  }
  uploads_.clear();
  return serial;
}

std::size_t TierLink::complete(std::uint64_t serial) noexcept {
  if (!pool_apart_ || serial == 0) return 0;
  std::size_t n = 0;
  for (std::size_t k = 0; k < handed_.size();) {
    const std::uint32_t i = handed_[k];
    if (slots_[i].serial != serial) {
      ++k;
      continue;
    }
    staged_.push_back(i);  // capacity: every slot
    handed_.erase(handed_.begin() + static_cast<std::ptrdiff_t>(k));
    ++n;
  }
  flush();
  return n;
}

void TierLink::check_slots() const {
  std::vector<std::uint8_t> seen(slots_.size(), 0);
  auto mark = [&](std::uint32_t i, const char* where) {
    if (i >= slots_.size() || seen[i]++ != 0) {
      throw Error("tier staging slot " + std::to_string(i) + " is out of range or twice in use (" +
                  where + ")");
    }
  };
  for (std::uint32_t i : free_slots_) mark(i, "free");
  for (std::uint32_t i : staged_) mark(i, "staged");
  for (std::uint32_t i : awaiting_) mark(i, "awaiting a fetch");
  for (std::uint32_t i : handed_) mark(i, "awaiting complete_offloads");
  for (const StoreBatch& b : stores_)
    for (std::uint32_t i : b.slots) mark(i, "storing");
  const auto lost = std::count(seen.begin(), seen.end(), std::uint8_t{0});
  if (lost != 0) throw Error(std::to_string(lost) + " tier staging slots are in no state");
  const auto flagged = std::count(fresh_.begin(), fresh_.end(), std::uint8_t{1});
  if (static_cast<std::size_t>(flagged) != uploads_.size()) {
    throw Error(std::to_string(flagged) + " pages are host-fresh but " +
                std::to_string(uploads_.size()) + " uploads are pending");
  }
  for (std::uint32_t page : uploads_) {
    if (page >= fresh_.size() || fresh_[page] == 0) {
      throw Error("page " + std::to_string(page) + " has a pending upload but is not host-fresh");
    }
  }
}

}  // namespace kvcache::manager
