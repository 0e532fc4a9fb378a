#include "replay/replay_tiers.h"

#include <string>

#include "kvcache/disk_tier.h"
#include "kvcache/error.h"
#include "kvcache/host_tier.h"
#include "kvcache/write_through_tier.h"

namespace kvcache::replay {

namespace {

std::string num(std::uint64_t v) { return std::to_string(v); }

void check_capacity(const char* what, std::uint64_t tokens, std::uint32_t page_size) {
  if (tokens < page_size) {
    throw InvalidArgument(std::string(what) + " capacity " + num(tokens) +
                          " tokens is less than one page of " + num(page_size));
  }
  if (tokens / page_size > kMaxReplayPages) {
    throw InvalidArgument(std::string(what) + " capacity " + num(tokens) + " tokens is " +
                          num(tokens / page_size) + " pages of " + num(page_size) +
                          ", more than the limit of " + num(kMaxReplayPages));
  }
}

}  // namespace

void check_tiers(const ReplayTiers& t, std::uint32_t page_size) {
  if (t.host_capacity_tokens > 0) check_capacity("host tier", t.host_capacity_tokens, page_size);
  if (t.disk_dir.empty() && t.disk_capacity_tokens > 0) {
    throw InvalidArgument("disk tier capacity " + num(t.disk_capacity_tokens) +
                          " tokens given without a disk directory");
  }
  if (t.disk_capacity_tokens > 0) check_capacity("disk tier", t.disk_capacity_tokens, page_size);
}

ReplayTierSet open_tiers(const KVCacheParams& params, const ReplayTiers& t,
                         std::uint32_t staging_pages) {
  ReplayTierSet set;
  if (!t.any()) return set;
  const TierFingerprint f = TierFingerprint::of(params, kReplayModelId);
  const std::uint64_t page_bytes = f.page_bytes();  // pages <= kMaxReplayPages: no overflow
  std::shared_ptr<Tier> host, disk;
  if (t.host_capacity_tokens > 0) {
    host = std::make_shared<HostTier>(f, t.host_capacity_tokens / params.page_size * page_bytes);
  }
  if (!t.disk_dir.empty()) {
    const std::uint64_t cap = t.disk_capacity_tokens == 0
                                  ? DiskTier::kUnlimited
                                  : t.disk_capacity_tokens / params.page_size * page_bytes;
    auto d = std::make_shared<DiskTier>(f, t.disk_dir, cap);
    set.pages_at_start.push_back(d->recovery().pages);
    disk = std::move(d);
  }
  if (host != nullptr) {
    set.pages_at_start.insert(set.pages_at_start.begin(), 0);
    set.config.tiers.push_back(disk == nullptr ? host
                                               : std::make_shared<WriteThroughTier>(host, disk));
  }
  if (disk != nullptr) set.config.tiers.push_back(disk);
  set.config.model_id = kReplayModelId;
  set.config.staging_pages = staging_pages;
  set.config.admission = t.admission;
  return set;
}

}  // namespace kvcache::replay
