// kvcache/host_tier.h — the host-memory tier: pages evicted from the device
// pool kept in bounded host RAM (kvcache/tier.h has the contract).
//
// Storage: capacity_bytes / page_bytes() slots, each holding one page's
// header, token ids and bytes (slot_bytes(), a little more than a page);
// the memory is mapped in chunks as slots are first used, huge-page advised,
// and never returned until the tier is destroyed. A hash map finds a key's
// slot; contains() consults it alone. When every slot is taken a store
// evicts by the policy (HostTierOptions::policy, least-recently-used by
// default), skipping slots being read or written; with none evictable the
// store is `rejected`; take_evicted() reports the keys evicted. A load
// verifies the header (key, fingerprint, token ids) and, with `checksums`,
// the checksum while it copies.
//
// Checksums are off by default: a host page becomes visible only after its
// copy finished, so it cannot be torn, and the checksum would guard only
// against memory corruption at the price of half the bandwidth (an XXH3
// pass beside each memcpy: docs/tiers.md has the figures). With them off
// the header's checksum field is 0 and a load checks key, fingerprint and
// token ids only.
//
// Threads: store() and load() queue one job a page on `threads` worker
// threads and return at once; with `synchronous` they do the work in the
// caller's thread and return a ticket already done. The destructor finishes
// every queued page. Capacity counts page bytes (TierStats::capacity_bytes);
// a capacity below one page holds nothing (every store rejected).
//
// Throws: InvalidArgument from the constructor for a fingerprint with no
// bytes or too many slots (over 2^32 - 2) and for threads 0 without
// `synchronous`; from store()/load() for a buffer or token count of the wrong
// size (nothing enqueued). Thread-safety: every method from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvcache/tier.h"
#include "kvcache/tier_policy.h"

namespace kvcache {

struct HostTierOptions {
  std::size_t threads = 2;   // worker threads (ignored when synchronous)
  bool synchronous = false;  // work in the caller's thread: tickets come back done
  bool huge_pages = true;    // madvise(MADV_HUGEPAGE) the slot memory
  bool checksums = false;    // checksum each page at store, verify it at load
  std::size_t chunk_bytes = std::size_t{256} << 20;  // mapped at a time (at least one slot)
  std::shared_ptr<TierEvictionPolicy> policy;        // null: make_lru_tier_policy()
  // A worker out of jobs naps this long before it sleeps; a store() while
  // one naps wakes no thread (the napper takes it when the nap ends), so
  // frequent write-backs cost their caller no wake-up. load() always wakes
  // one, and waiting on a store's ticket wakes them. 0: every store() wakes
  // a thread. At most 1 s (InvalidArgument).
  std::chrono::microseconds linger{1000};
};

class HostTier final : public Tier {
 public:
  HostTier(TierFingerprint fingerprint, std::uint64_t capacity_bytes, HostTierOptions options = {});
  ~HostTier() override;

  std::string_view name() const override { return "host"; }
  const TierFingerprint& fingerprint() const override;
  bool enabled() const override { return true; }
  std::vector<std::uint8_t> contains(std::span<const PageKey> keys) override;
  TierTicket store(std::span<const PageWrite> pages) override;
  TierTicket load(std::span<const PageRead> pages) override;
  TierStats stats() const override;
  void take_evicted(std::vector<PageKey>& out) override;

  std::size_t num_slots() const;
  std::size_t slot_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache
