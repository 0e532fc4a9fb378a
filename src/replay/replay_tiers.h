// replay/replay_tiers.h — the tiers of a replay (internal to kvcache_replay):
// checks ReplayTiers, opens the host and disk tiers for the replay's cache
// and makes the manager's TierConfig (kvcache/replay/trace_replay.h says what
// a replay does with them).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvcache/params.h"
#include "kvcache/prefix_cache.h"
#include "kvcache/replay/trace_replay.h"

namespace kvcache::replay {

struct ReplayTierSet {
  TierConfig config;                          // for PrefixCacheConfig::tiers
  std::vector<std::uint64_t> pages_at_start;  // per tier of config.tiers
};

// Throws InvalidArgument naming the value: a capacity below one page or past
// kMaxReplayPages pages, a disk capacity without a disk directory.
void check_tiers(const ReplayTiers& tiers, std::uint32_t page_size);

// Opens the tiers `tiers` asks for (none: an empty set). Host and disk: the
// host tier writes through to the disk, config.tiers = {host, disk}.
// staging_pages: TierConfig::staging_pages. Throws InvalidArgument from the
// disk tier (a directory that cannot be made or is locked).
ReplayTierSet open_tiers(const KVCacheParams& params, const ReplayTiers& tiers,
                         std::uint32_t staging_pages);

}  // namespace kvcache::replay
