// kvcache/prefix_cache.h — configuration, metrics and events of the paged
// manager's prefix cache (automatic reuse of K/V pages across requests).
//
// Block identity: every full page j of a sequence gets a chained hash
//   h_j = hash(h_{j-1}, tokens of page j, extra_key),   h_{-1} = 0,
// (XXH3-64 by default; injectable for tests). The extra key isolates tenants
// (LoRA id, cache salt): equal tokens under different keys never match. A hash
// hit is only trusted after comparing the stored tokens, the extra key and the
// parent page (id + generation), so even a colliding hash can never hand out
// another request's K/V.
//
// Eviction: published pages whose ref count drops to 0 stay cached and become
// evictable; `fetch` takes free pages first and evicts only when the free list
// is empty. The policy choosing the victim is picked here (O(1) per page).
// Pinned pages (priority > 0) are evicted only when no unpinned page is
// evictable, lowest priority first.
//
// Tiers (TierConfig, kvcache/tier.h): below the device pool, a published
// page the pool evicts is written back to the first tier, and match_prefix
// continues a prompt's chain into the tiers and loads the hits back
// (PagedKVCacheManager, docs/tiers.md "The manager and the tiers").
//
// Plain value types; no thread-safety concerns of their own.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/tier.h"

namespace kvcache {

// Eviction policy for cached pages (ref count 0, still in the hash index).
enum class EvictionPolicyKind : std::uint8_t {
  lru,       // least recently released first; a sequence's tail before its head (vLLM)
  s3fifo,    // S3-FIFO: a small probation FIFO for never-reused pages, a main
             // FIFO with second chances for reused ones, a ghost FIFO of evicted hashes
  tiered,    // LRU-2 flavoured: pages used by one request only go first (LRU), then
             // pages used by two or more (reused, or remembered by a ghost of evicted hashes);
             // honours release hints (ReuseHint): `unlikely` pages used once go before
             // every other page, `likely` ones are kept like reused ones
  interval,  // inter-arrival: predicts each content's reuse interval from its own
             // history (mean gap between the requests that used it, kept across
             // evictions by a ghost of evicted hashes; content used once counts as
             // far) and evicts the page with the largest 2 x idle time + interval
  adaptive,  // LRU and tiered side by side: evicts as whichever of the two a pair of
             // shadow caches (hashes only, the pool's size) shows serving more of
             // the recent page uses; never far below the better of the two
};

// What the caller knows, when it releases a sequence, about whether a later
// request will start with this sequence's tokens. Engines know things the
// cache cannot see: a chat turn that expects a follow-up or an agent step
// (likely), a one-shot completion or a request that ran to its token limit
// (unlikely); on the Mooncake trace the output length is such a signal (a
// request with a short output is followed by a reuse of its prompt far more
// often than one with a long output; docs/PERFORMANCE.md). Only the
// `tiered` policy acts on it (and `adaptive`, through its tiered half); the
// others ignore it. A page keeps the last
// hint other than `unknown` it was released with until it is evicted or
// unpublished; reuse by another request still promotes it.
enum class ReuseHint : std::uint8_t { unknown, unlikely, likely };

std::string_view reuse_hint_name(ReuseHint hint);
// "unknown" | "unlikely" | "likely"; throws InvalidArgument otherwise.
ReuseHint parse_reuse_hint(std::string_view name);

std::string_view policy_name(EvictionPolicyKind kind);
// "lru" | "s3fifo" | "tiered" | "interval" | "adaptive"; throws InvalidArgument naming the
// known policies otherwise.
EvictionPolicyKind parse_policy(std::string_view name);

// Chained block hash: (parent hash, page tokens, extra key) -> hash.
using BlockHashFn = std::function<std::uint64_t(
    std::uint64_t parent, std::span<const std::uint32_t> tokens, std::uint64_t extra_key)>;

// XXH3-64 over the tokens, seeded by the parent hash and extra key.
std::uint64_t default_block_hash(std::uint64_t parent, std::span<const std::uint32_t> tokens,
                                 std::uint64_t extra_key);

// A page entering or leaving a medium (what KV-aware routers consume):
// medium "device" for the hash index of the device pool; a tier's name
// (Tier::name(), "host", "disk") when a page written back to that tier is
// stored there, when a load finds the tier no longer holds it, or when the
// tier evicted it for room (removed, reported by Tier::take_evicted at the
// manager's next fetch, match_prefix, poll_loads, wait_loads or wait_tiers;
// such an event carries only the medium and the key: page is the sentinel
// total_num_pages, the hashes 0, no tokens). vLLM's BlockStored /
// BlockRemoved carry the same `medium`.
struct PageEvent {
  enum class Kind : std::uint8_t { stored, removed };
  Kind kind = Kind::stored;
  std::uint32_t page = 0;  // the device page (for a tier: the page the bytes were written from)
  std::uint64_t hash = 0;
  std::uint64_t parent_hash = 0;  // 0 for a sequence's first page
  std::uint64_t extra_key = 0;
  std::span<const std::uint32_t> tokens;  // the page's tokens; valid during the callback only
  std::string_view medium = "device";     // valid during the callback only
  PageKey key;  // the page's 128-bit tier key; {0, 0} when the manager has no tiers
};

// Which evicted pages go down to the first tier.
enum class OffloadAdmission : std::uint8_t {
  every_page,  // every published page the device pool evicts (default)
  reused,      // only pages a later request attached (or that came back from a tier)
};

// The tiers below the device pool (kvcache/tier.h), nearest first. Tiers
// need prefix caching. Keys chain from {0, extra_key} (the request's extra
// key roots the chain, so tenants stay apart in the tiers too).
//
// Devices: each of the manager's params.n_devices devices has a tier of its
// own at every level, holding its shard (its heads of every page): `tiers`
// lists levels x n_devices tiers, level-major (tiers[level * n_devices + d]
// is device d's tier of that level; one device: one tier a level, as
// before); the tiers of a level share a name. Tier i's fingerprint must
// equal fingerprint(params, i % n_devices) (the manager's constructor throws
// InvalidArgument naming the tier and the first field that differs). A page
// is written back to every shard of the first level and counts as held by
// a level only when every shard of it holds the page; a load reads each
// shard from its own tier into its device's pool.
//
// A rank of a tensor-parallel group that runs its own manager (in its own
// process) names its shards with first_shard / shard_count: its device d is
// shard first_shard + d of shard_count, so its keys and values are those of
// shard first_shard + d of one manager over the whole group, and the two
// deployments share tiers (a disk directory written by one serves the
// other). shard_count 0: the manager is the whole group (n_devices shards).
struct TierConfig {
  std::vector<std::shared_ptr<Tier>> tiers;  // empty: no tiers (today's behaviour)
  std::string model_id;                      // the weights' identity, in the fingerprint
  std::string cache_salt;                    // in the fingerprint
  OffloadAdmission admission = OffloadAdmission::every_page;
  // Host staging for write-back: evicted pages being written to the first
  // level, n_devices x page bytes per device + 4 x page_size each, allocated
  // at construction. An
  // eviction that finds every slot busy skips the write-back (counted as
  // offload_dropped); it never waits. In [1, 65536].
  std::uint32_t staging_pages = 16;
  // Write-backs go to the first tier in batches: staged pages wait until
  // offload_batch of them are staged (at most half the staging slots,
  // rounded up), until the oldest has waited offload_delay (looked at by
  // every manager call), or until wait_tiers or destruction, then go in one
  // store(). A page waiting in staging is not found by match_prefix (as a
  // page being stored is not). offload_batch in [1, 65536] (1, or an
  // offload_delay of 0: every call's evictions go at once); offload_delay
  // in [0, 1 s].
  std::uint32_t offload_batch = 32;
  std::chrono::microseconds offload_delay{1000};
  // The K/V live in a pool the caller owns (e.g. a GPU pool with the same
  // shape and page ids: kvcache/cuda/device_collection.h); the manager's own
  // pool is only a host bounce buffer for loads. Write-back and onboarding
  // then go through the caller: an evicted page waits in a staging slot
  // until a fetch hands it out (KVCacheBatch::block_offloads) and the caller
  // completes it (PagedKVCacheManager::complete_offloads); a finished load
  // is handed out by the next fetch (KVCacheBatch::block_loads). Needs at
  // least one tier (InvalidArgument otherwise). C: kvc_prefix_config.pool_apart;
  // Python: PagedKVCacheManager(..., pool_apart=True).
  bool pool_apart = false;
  std::uint32_t first_shard = 0;  // this manager's device 0 in the group (shard_count > 0)
  std::uint32_t shard_count = 0;  // the group's devices; 0: params.n_devices
  // The fingerprint device `device` of a manager with these params expects
  // of its tiers (TierFingerprint::of with model_id and cache_salt, named
  // shard first_shard + device of the group). Throws InvalidArgument for a
  // device >= params.n_devices or a shard range past shard_count.
  TierFingerprint fingerprint(const KVCacheParams& params, std::uint32_t device = 0) const;
};

// Every value is checked by the manager's constructor (InvalidArgument naming
// the field and its range), whichever policy is chosen.
struct PrefixCacheConfig {
  EvictionPolicyKind policy = EvictionPolicyKind::adaptive;
  // S3-FIFO: share of the pool reserved for the probation queue (0, 1).
  double s3fifo_small_fraction = 0.1;
  // s3fifo / tiered / interval / adaptive (two tiered ghosts): ghost FIFO length (hashes of evicted
  // pages, 16 bytes each; 48 for interval, which keeps their use statistics) in units of the pool
  // size, in [0, 64]; at most 2^24 entries whatever the pool (counted by
  // PagedKVCacheManager::estimated_bookkeeping_size).
  double ghost_factor = 16.0;
  BlockHashFn hash;  // empty: default_block_hash
  // Called (under the manager's lock) for every page stored in / removed from
  // the index, and for the tiers' stored / removed pages (PageEvent::medium).
  // Must not call back into the manager and must not throw
  // (an exception escaping it terminates the program).
  std::function<void(const PageEvent&)> on_event;
  TierConfig tiers;  // none by default
};

// Counters since construction (or the last reset_metrics()); gauges are now.
struct PrefixCacheMetrics {
  std::uint32_t pages_total = 0;
  std::uint32_t pages_free = 0;    // on the free list
  std::uint32_t pages_used = 0;    // ref count > 0
  std::uint32_t pages_cached = 0;  // ref count 0, in the hash index (evictable)
  std::uint32_t pages_pinned = 0;  // in the index with pin priority > 0
  std::uint64_t match_calls = 0;
  std::uint64_t prompt_tokens = 0;  // sum of prompt sizes passed to match_prefix
  std::uint64_t reused_tokens = 0;  // sum of tokens match_prefix attached
  std::uint64_t pages_published = 0;
  std::uint64_t evictions = 0;
  std::uint64_t cow_copies = 0;
  double hit_rate() const {
    return prompt_tokens == 0
               ? 0.0
               : static_cast<double>(reused_tokens) / static_cast<double>(prompt_tokens);
  }
};

}  // namespace kvcache
