// kvcache/disk_tier.h — the local-disk tier: pages in preallocated slab
// files under one directory, found again by a process restarted on it
// (kvcache/tier.h has the contract; docs/tiers.md the format).
//
// Storage: slab files of fixed slots (slot_bytes(): the page header and
// token ids in the first 4 KiB-aligned block, the page bytes in the next,
// each rounded up to 4 KiB), created and preallocated (fallocate) as slots
// are first used; capacity_bytes / page_bytes() slots in all (kUnlimited:
// as many as the disk holds); when every slot is taken a store evicts by the
// policy (DiskTierOptions::policy, LRU by default) and take_evicted()
// reports the keys evicted. I/O with O_DIRECT and aligned buffers where
// the filesystem allows it (direct_io() says; buffered otherwise), through
// io_uring or blocking preadv/pwritev on the worker threads (io_backend()).
// Pages whose buffer is 4 KiB-aligned and whose size is a multiple of 4 KiB
// move without a copy; others through an aligned staging buffer.
//
// Durability and recovery: after a page's bytes are written the slabs are
// fdatasync'ed (once for every page finished meanwhile) and only then is
// the page's record appended to the manifest and the page visible (stored).
// A DiskTier opened on a directory replays the manifest: a torn record tail
// is ignored (truncated), a slot the slab file does not cover is dropped;
// every load checks the header and the checksum against the manifest, so a
// torn or damaged page is refused (LoadResult::corrupt), dropped and
// counted (TierStats::corrupt). A directory written for another fingerprint
// or geometry is emptied (logged at warn). A lock file (LOCK, flock) keeps a
// second DiskTier, in this process or another, off the directory.
//
// Failure: a failed write or read (ENOSPC, EIO ...) fails that page
// (StoreResult::failed / LoadResult::failed), counts in io_errors and logs
// a warn line; max_consecutive_errors failures in a row with no success
// between disable the tier (enabled() false, logged): from then contains()
// answers 0, loads `missing`, stores `rejected`. Nothing throws at the
// caller for I/O.
//
// Throws: InvalidArgument from the constructor for a fingerprint with no
// bytes, a capacity past 2^32 - 2 pages, threads 0, a directory that cannot
// be created or opened, or one another DiskTier holds (naming the path);
// from store()/load() for wrong buffer or token counts (nothing enqueued).
// Thread-safety: every method from any thread. The destructor finishes
// every page queued, then syncs the manifest.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>

#include "kvcache/tier.h"
#include "kvcache/tier_policy.h"

namespace kvcache {

enum class DiskIo : std::uint8_t {
  automatic,  // io_uring when the kernel grants a ring, else threads
  io_uring,   // io_uring or throw InvalidArgument
  threads,    // preadv / pwritev on the worker threads
};

struct DiskTierOptions {
  DiskIo io = DiskIo::automatic;
  bool direct_io = true;      // O_DIRECT where the filesystem allows it
  bool durable = true;        // fdatasync the slabs before a page's manifest record
  std::size_t threads = 2;    // worker threads: checksums, copies (and the I/O with threads)
  unsigned queue_depth = 32;  // io_uring requests in flight at most
  std::uint64_t slab_bytes = std::uint64_t{1} << 30;  // per slab file (at least one slot)
  std::uint32_t max_consecutive_errors = 8;           // I/O failures in a row that disable it
  std::uint64_t compact_min_records = 4096;    // compact when records > 2 * pages held + this
  std::shared_ptr<TierEvictionPolicy> policy;  // null: make_lru_tier_policy()
  // As HostTierOptions::linger: a worker naps this long before it sleeps,
  // and a store() while one naps wakes no thread. At most 1 s.
  std::chrono::microseconds linger{1000};
};

// What opening the directory found.
struct DiskRecovery {
  bool fresh = true;          // no usable manifest: started empty
  std::uint64_t pages = 0;    // pages found again
  std::uint64_t dropped = 0;  // records whose slot the slabs do not cover, or past capacity
  std::uint64_t torn_manifest_bytes = 0;  // ignored at the manifest's end
};

class DiskTier final : public Tier {
 public:
  static constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();

  DiskTier(TierFingerprint fingerprint, std::filesystem::path dir, std::uint64_t capacity_bytes,
           DiskTierOptions options = {});
  ~DiskTier() override;

  std::string_view name() const override { return "disk"; }
  const TierFingerprint& fingerprint() const override;
  bool enabled() const override;
  std::vector<std::uint8_t> contains(std::span<const PageKey> keys) override;
  TierTicket store(std::span<const PageWrite> pages) override;
  TierTicket load(std::span<const PageRead> pages) override;
  TierStats stats() const override;
  void take_evicted(std::vector<PageKey>& out) override;

  std::string_view io_backend() const;  // "io_uring" | "threads"
  bool direct_io() const;               // O_DIRECT in use
  std::size_t slot_bytes() const;
  const DiskRecovery& recovery() const;
  const std::filesystem::path& dir() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache
