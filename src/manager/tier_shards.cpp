// TierLink over several devices (manager/tier_link.h): the tiers are levels x
// shards, level-major; each shard's tier holds its device's part of every
// page under its own key (kvcache/tier.h shard_key). Also the configuration's
// side of it: TierConfig::fingerprint and the checks of the tiers' order,
// names and fingerprints.
#include <algorithm>
#include <cstring>
#include <string>

#include "kvcache/error.h"
#include "manager/observability.h"
#include "manager/tier_link.h"

namespace kvcache {

TierFingerprint TierConfig::fingerprint(const KVCacheParams& params, std::uint32_t device) const {
  TierFingerprint f = TierFingerprint::of(params, model_id, cache_salt, device);
  if (shard_count == 0) {
    if (first_shard != 0) {
      throw InvalidArgument("tiers.first_shard is " + std::to_string(first_shard) +
                            " but tiers.shard_count is 0 (this manager is the whole group): "
                            "set shard_count to the group's devices");
    }
    return f;
  }
  if (first_shard >= shard_count || params.n_devices > shard_count - first_shard) {
    throw InvalidArgument("tiers: shards [" + std::to_string(first_shard) + ", " +
                          std::to_string(std::uint64_t{first_shard} + params.n_devices) +
                          ") of this manager's " + std::to_string(params.n_devices) +
                          " devices lie past tiers.shard_count " + std::to_string(shard_count));
  }
  f.device_index = first_shard + device;
  f.device_count = shard_count;
  return f;
}

namespace manager {

namespace {
std::string str(std::uint64_t v) { return std::to_string(v); }
}  // namespace

void TierLink::check_shards(const KVCacheParams& params, const TierConfig& config) {
  const std::uint32_t n = params.n_devices;
  const std::size_t count = config.tiers.size();
  if (count % n != 0) {
    throw InvalidArgument("tiers: " + str(count) + " given for " + str(n) +
                          " devices: give each level one tier per device, level-major "
                          "(tiers[level * n_devices + device])");
  }
  if (count / n > 8) {
    throw InvalidArgument("tiers: " + str(count / n) + " levels given, at most 8");
  }
  for (std::size_t i = 0; i < count; ++i)
    if (config.tiers[i] == nullptr) throw InvalidArgument("tiers[" + str(i) + "] is null");
  for (std::size_t i = 0; i < count; ++i) {
    const Tier& t = *config.tiers[i];
    const Tier& first = *config.tiers[i - i % n];
    std::string who = "tier '" + std::string(t.name()) + "'";
    if (n > 1)
      who += " (tiers[" + str(i) + "]: level " + str(i / n) + ", device " + str(i % n) + ")";
    if (t.name() != first.name()) {
      throw InvalidArgument(who + " is in the level of tier '" + std::string(first.name()) +
                            "': the tiers of a level share a name");
    }
    check_fingerprint(who, t.fingerprint(),
                      config.fingerprint(params, static_cast<std::uint32_t>(i % n)));
  }
}

bool TierLink::level_enabled(std::size_t level) const {
  for (std::uint32_t d = 0; d < shards_; ++d)
    if (!tier(level, d).enabled()) return false;
  return true;
}

std::vector<std::uint8_t> TierLink::level_contains(std::size_t level,
                                                   std::span<const PageKey> keys) {
  if (shards_ == 1 && masks_[0] == PageKey{}) {
    return tier(level, 0).contains(keys);  // one device of one: the chain keys are the tier's
  }
  std::vector<std::uint8_t> held(keys.size(), 1);
  std::vector<PageKey> shard_keys(keys.size());
  for (std::uint32_t d = 0; d < shards_; ++d) {
    for (std::size_t k = 0; k < keys.size(); ++k) shard_keys[k] = shard_key(keys[k], masks_[d]);
    const std::vector<std::uint8_t> h = tier(level, d).contains(shard_keys);
    for (std::size_t k = 0; k < keys.size(); ++k) held[k] &= k < h.size() && h[k] != 0;
  }
  return held;
}

void TierLink::pack_shards(std::uint32_t page, std::span<std::byte> out) const noexcept {
  const std::size_t pb = bytes_.front().page_bytes();
  for (std::uint32_t d = 0; d < shards_; ++d) bytes_[d].pack(page, out.subspan(d * pb, pb));
}

void TierLink::unpack_loaded(const LoadJob& job, std::size_t q) const noexcept {
  const std::size_t pb = bytes_.front().page_bytes();
  if (bytes_.front().packed_in_place()) return;  // loaded in place
  const std::span<const std::byte> staging(job.staging);
  for (std::uint32_t d = 0; d < shards_; ++d)
    bytes_[d].unpack(staging.subspan((q * shards_ + d) * pb, pb), job.pages[q]);
}

void TierLink::store_shards(StoreBatch& b, std::size_t n) {
  const std::size_t pb = bytes_.front().page_bytes();
  b.writes.reserve(n * shards_);
  b.tickets.reserve(shards_);
  for (std::uint32_t d = 0; d < shards_; ++d) {
    for (std::uint32_t i : b.slots) {
      const Slot& s = slots_[i];
      b.writes.push_back({shard_key(s.key, masks_[d]), s.tokens,
                          std::span<const std::byte>(s.bytes).subspan(d * pb, pb)});
    }
  }
  const std::span<const PageWrite> writes(b.writes);
  b.tickets.push_back(tier(0, 0).store(writes.first(n)));  // throws: nothing in flight
  for (std::uint32_t d = 1; d < shards_; ++d) {
    try {
      b.tickets.push_back(tier(0, d).store(writes.subspan(d * n, n)));  // capacity: shards_
    } catch (...) {
      log_after_commit(LogLevel::warn, [&] {
        return "paged manager: tier '" + names_[d] + "' (device " + str(d) +
               ") refused a write-back of " + str(n) + " pages";
      });
      return;  // the shards from d on fail their pages (count_stored)
    }
  }
}

void TierLink::count_dropped(std::size_t pages) noexcept {
  for (std::uint32_t d = 0; d < shards_; ++d) counters_[d].offload_dropped += pages;
}

void TierLink::count_stored(const StoreBatch& b, std::size_t k) noexcept {
  bool any_stored = false, all_held = true;
  for (std::uint32_t d = 0; d < shards_; ++d) {
    StoreResult r = StoreResult::failed;
    if (d < b.tickets.size()) {
      const auto results = b.tickets[d].store_results();
      if (k < results.size()) r = results[k];
    }
    if (r == StoreResult::stored) {
      ++counters_[d].pages_offloaded;
      any_stored = true;
    } else if (r != StoreResult::present) {
      ++counters_[d].offload_dropped;
      all_held = false;
    }
  }
  // The level holds the page now, and did not before: one event for it.
  if (any_stored && all_held) emit(PageEvent::Kind::stored, slots_[b.slots[k]], 0);
}

}  // namespace manager
}  // namespace kvcache
