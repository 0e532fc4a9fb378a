// Offline Belady reference for `kvcache replay --policy belady`: a separate
// simulation of sequential replay (not the manager) that knows the whole
// trace and, when it needs a page, evicts the cached page whose next use is
// farthest in the future. Prefix semantics as in the manager: pages are
// identified by the same chained block hash, a match stops at the first
// missing page and leaves at least one prompt token to compute, full pages
// are published when computed, a request's pages are in use while it runs.
// Only leaves of the cached prefix tree are evicted (a child is never used
// without its parent, so its next use is never earlier: evicting the parent
// first could only strand the child). Ties: the deeper page goes first.
// An upper reference for online policies, not a policy: O(log n) per page
// with a std::set, allocating freely.
#pragma once

#include <span>

#include "kvcache/replay/trace_replay.h"

namespace kvcache::replay {

// Precondition: options.sequential. Throws InvalidArgument on bad requests.
ReplayResult replay_offline_belady(std::span<const TraceRequest> trace,
                                   const ReplayOptions& options);

}  // namespace kvcache::replay
