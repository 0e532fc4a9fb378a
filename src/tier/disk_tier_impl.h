// DiskTier::Impl: the disk tier's state, shared by disk_tier.cpp (the I/O
// paths and the group commit) and disk_open.cpp (opening, locking and
// recovering a directory).
//
// Locks: mu guards the slot table, the stats and the error count;
// commit_mu the commit queue. Never both at once. I/O, checksums and copies
// run under neither.
#pragma once

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvcache/disk_tier.h"
#include "tier/aligned_buffers.h"
#include "tier/eviction_log.h"
#include "tier/io_backend.h"
#include "tier/manifest.h"
#include "tier/slab_files.h"
#include "tier/slot_table.h"
#include "tier/ticket_state.h"
#include "tier/workers.h"

namespace kvcache {

struct DiskTier::Impl {
  using StatePtr = std::shared_ptr<TierTicket::State>;

  Impl(TierFingerprint f, std::filesystem::path d, std::uint64_t capacity, DiskTierOptions o);
  ~Impl();

  // disk_open.cpp
  void lock_dir();
  void recover();

  // disk_tier.cpp
  void store_one(const StatePtr& st, std::size_t i, PageWrite w);
  void load_one(const StatePtr& st, std::size_t i, PageRead r, std::uint64_t t0);
  void write_done(const StatePtr& st, std::size_t i, std::uint32_t slot, PageKey key,
                  std::uint64_t checksum, long result, std::size_t want);
  void read_done(const StatePtr& st, std::size_t i, const PageRead& r, std::uint32_t slot,
                 std::uint64_t expected, const std::byte* meta, const std::byte* staged,
                 long result, std::size_t want, std::uint64_t t0);
  void fail_store(const StatePtr& st, std::size_t i, std::uint32_t slot, int err, const char* what);
  void io_failed(int err, const char* what, std::uint32_t slot);  // counts, logs, may disable
  void io_succeeded();
  void commit(const StatePtr& st, std::size_t i, std::uint32_t slot, PageKey key,
              std::uint64_t checksum);
  void commit_batch();
  void queue_removal(std::uint32_t slot, PageKey key);
  void maybe_compact();
  void finish_store(const StatePtr& st, std::size_t i, StoreResult r);
  void finish_load(const StatePtr& st, std::size_t i, LoadResult r);
  bool zero_copy(const std::byte* p) const;

  const TierFingerprint fp;
  const std::filesystem::path dir;
  const DiskTierOptions opt;
  const std::uint64_t digest;
  const std::size_t page_bytes;
  const std::size_t meta_bytes;  // header + tokens, rounded up to 4 KiB
  const std::size_t data_bytes;  // page bytes, rounded up to 4 KiB
  const std::size_t slot_bytes;
  const std::uint64_t capacity_bytes;
  const std::uint64_t max_slots;
  const std::uint64_t slab_slots;
  const tier::ManifestGeometry geometry;

  int lock_fd = -1;
  DiskRecovery recovery_report;
  std::atomic<bool> enabled{true};

  mutable std::mutex mu;
  tier::SlotTable table;                 // under mu
  TierStats st;                          // under mu
  std::uint32_t consecutive_errors = 0;  // under mu
  tier::EvictionLog evicted;             // its own lock

  struct PendingStore {
    StatePtr state;
    std::size_t index;
    tier::ManifestRecord record;
  };
  std::mutex commit_mu;
  std::vector<PendingStore> pending;           // under commit_mu
  std::vector<tier::ManifestRecord> removals;  // under commit_mu
  bool committing = false;                     // under commit_mu
  std::unique_ptr<tier::Manifest> manifest;    // used by the one committer

  std::mutex out_mu;
  std::condition_variable out_cv;
  std::size_t outstanding = 0;  // pages accepted and not finished (under out_mu)

  tier::SlabFiles slabs;
  tier::AlignedBuffers meta_buffers;
  tier::AlignedBuffers data_buffers;
  // Last: the I/O stops before the state it works on goes.
  std::unique_ptr<tier::TierWorkers> workers;
  std::unique_ptr<tier::IoBackend> io;
};

}  // namespace kvcache
