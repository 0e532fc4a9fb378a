// DiskTier::Impl's construction: the directory, its lock file, the I/O
// backend, and recovery of the pages a previous process left (the
// manifest's records replayed into the slot table).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "kvcache/error.h"
#include "kvcache/log.h"
#include "tier/disk_tier_impl.h"
#include "tier/page_codec.h"

namespace kvcache {

namespace {

constexpr std::uint64_t kMaxSlots = std::numeric_limits<std::uint32_t>::max() - 1;

std::size_t checked_page_bytes(const TierFingerprint& f) {
  const std::size_t b = f.page_bytes();
  if (b == 0) {
    throw InvalidArgument("disk tier: the fingerprint's page has 0 bytes (page_size " +
                          std::to_string(f.page_size) + ", n_kv_heads " +
                          std::to_string(f.n_kv_heads) + ", head_dim " +
                          std::to_string(f.head_dim) + ")");
  }
  return b;
}

std::uint64_t max_slots_of(std::uint64_t capacity, std::size_t page_bytes) {
  if (capacity == DiskTier::kUnlimited) return kMaxSlots;
  const std::uint64_t n = capacity / page_bytes;
  if (n > kMaxSlots) {
    throw InvalidArgument("disk tier: capacity " + std::to_string(capacity) +
                          " bytes is more than the limit of " + std::to_string(kMaxSlots) +
                          " pages of " + std::to_string(page_bytes) + " bytes");
  }
  return n;
}

std::size_t meta_block(const TierFingerprint& f) {
  return tier::round_up(tier::meta_used_bytes(f.page_size), tier::kDiskAlign);
}

std::uint64_t slab_slots_of(const DiskTierOptions& o, std::size_t slot_bytes,
                            std::uint64_t max_slots) {
  std::uint64_t n = std::max<std::uint64_t>(1, o.slab_bytes / slot_bytes);
  return std::max<std::uint64_t>(1, std::min(n, max_slots));
}

const DiskTierOptions& checked(const DiskTierOptions& o) {
  if (o.threads == 0) throw InvalidArgument("disk tier: threads is 0; it needs at least 1");
  if (o.linger < std::chrono::microseconds{0} || o.linger > std::chrono::seconds{1}) {
    throw InvalidArgument("disk tier: linger is " + std::to_string(o.linger.count()) +
                          " us: it must be in [0, 1000000]");
  }
  if (o.queue_depth == 0 || o.queue_depth > 4096) {
    throw InvalidArgument("disk tier: queue_depth " + std::to_string(o.queue_depth) +
                          " is not in range 1 to 4096");
  }
  if (o.max_consecutive_errors == 0) {
    throw InvalidArgument("disk tier: max_consecutive_errors is 0; it needs at least 1");
  }
  return o;
}

std::string sys_reason(const std::filesystem::path& p, const char* what) {
  return "disk tier: " + std::string(what) + " " + p.string() + ": " + std::strerror(errno);
}

}  // namespace

DiskTier::Impl::Impl(TierFingerprint f, std::filesystem::path d, std::uint64_t capacity,
                     DiskTierOptions o)
    : fp(std::move(f)),
      dir(std::move(d)),
      opt(checked(o)),
      digest(fp.digest()),
      page_bytes(checked_page_bytes(fp)),
      meta_bytes(meta_block(fp)),
      data_bytes(tier::round_up(page_bytes, tier::kDiskAlign)),
      slot_bytes(meta_bytes + data_bytes),
      capacity_bytes(capacity),
      max_slots(max_slots_of(capacity, page_bytes)),
      slab_slots(slab_slots_of(opt, slot_bytes, max_slots)),
      geometry{digest, page_bytes, slot_bytes, slab_slots, fp.page_size},
      table(max_slots, opt.policy),
      slabs(dir, slab_slots, slot_bytes, opt.direct_io),
      meta_buffers(meta_bytes),
      data_buffers(data_bytes) {
  st.capacity_bytes = capacity;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw InvalidArgument("disk tier: cannot create the directory " + dir.string() + ": " +
                          ec.message());
  }
  lock_dir();
  try {
    recover();
    workers = std::make_unique<tier::TierWorkers>(opt.threads, opt.linger);
    std::string why;
    if (opt.io != DiskIo::threads) io = tier::make_uring_io(*workers, opt.queue_depth, &why);
    if (io == nullptr && opt.io == DiskIo::io_uring) {
      throw InvalidArgument("disk tier: io_uring was asked for and is not available: " + why);
    }
    if (io == nullptr) {
      if (opt.io == DiskIo::automatic) {
        log_with(LogLevel::info, [&] { return "disk tier: no io_uring (" + why + "): threads"; });
      }
      io = tier::make_thread_io(*workers);
    }
  } catch (...) {
    workers.reset();
    manifest.reset();
    ::close(lock_fd);
    throw;
  }
}

DiskTier::Impl::~Impl() {
  {
    std::unique_lock lock(out_mu);
    out_cv.wait(lock, [&] { return outstanding == 0; });
  }
  io.reset();       // the reaper stops; nothing is in flight
  workers.reset();  // a committer still finishing its loop ends
  if (manifest != nullptr) {
    manifest->append(removals);
    manifest->sync();
  }
  manifest.reset();
  if (lock_fd >= 0) ::close(lock_fd);  // releases the flock
}

void DiskTier::Impl::lock_dir() {
  const std::filesystem::path p = dir / "LOCK";
  lock_fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) throw InvalidArgument(sys_reason(p, "cannot open the lock file"));
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(lock_fd);
    lock_fd = -1;
    if (err == EWOULDBLOCK) {
      throw InvalidArgument("disk tier: the directory " + dir.string() +
                            " is in use by another DiskTier (its LOCK is held)");
    }
    errno = err;
    throw InvalidArgument(sys_reason(p, "cannot lock"));
  }
}

void DiskTier::Impl::recover() {
  const std::filesystem::path path = dir / "manifest";
  const tier::ManifestScan scan = tier::scan_manifest(path, geometry);
  if (!scan.same_geometry) {
    if (scan.found) {
      log_with(LogLevel::warn, [&] {
        return "disk tier " + dir.string() +
               ": its pages were written for another fingerprint or geometry; starting empty";
      });
    }
    slabs.remove_all();
    manifest = std::make_unique<tier::Manifest>(path, geometry, 0);
    return;
  }
  DiskRecovery& rep = recovery_report;
  rep.fresh = false;
  rep.torn_manifest_bytes = scan.torn_bytes;
  // A stored record counts only where the slab files cover its slot (a
  // truncated or missing slab loses its slots); sizes read once a slab.
  std::vector<std::int64_t> slab_size;
  std::uint64_t lost = 0;  // torn away with the slab: counted as corrupt
  auto on_disk = [&](std::uint32_t slot) {
    const std::uint64_t slab = slot / slab_slots;
    if (slab >= slab_size.size()) slab_size.resize(slab + 1, -1);
    if (slab_size[slab] < 0) {
      std::error_code ec;
      const auto n = std::filesystem::file_size(tier::SlabFiles::path_of(dir, slab), ec);
      slab_size[slab] = ec ? 0 : static_cast<std::int64_t>(n);
    }
    return static_cast<std::uint64_t>(slab_size[slab]) >= slabs.offset_of(slot) + slot_bytes;
  };
  for (const tier::ManifestRecord& r : scan.records) {
    if (r.kind == tier::ManifestRecord::Kind::removed) {
      if (r.slot < table.used() && table.key_of(r.slot) == r.key) table.forget(r.slot);
    } else if (r.slot >= max_slots || !on_disk(r.slot)) {
      if (r.slot < table.used()) table.forget(r.slot);  // whatever it held before is gone too
      ++rep.dropped;
      if (r.slot < max_slots) ++lost;
    } else {
      table.restore(r.slot, r.key, r.checksum);
    }
  }
  table.finish_restore();
  rep.pages = table.pages_held();
  st.corrupt += lost;
  if (scan.torn_bytes > 0) {
    log_with(LogLevel::warn, [&] {
      return "disk tier " + dir.string() + ": ignored " + std::to_string(scan.torn_bytes) +
             " bytes of torn manifest records";
    });
  }
  manifest = std::make_unique<tier::Manifest>(path, geometry, scan.good_bytes);
  if (manifest->records() > 2 * table.pages_held() + opt.compact_min_records) {
    std::vector<tier::ManifestRecord> held;
    for (const auto& e : table.held_entries()) {
      held.push_back({tier::ManifestRecord::Kind::stored, e.slot, e.key, e.checksum});
    }
    manifest->compact(held);
  }
}

}  // namespace kvcache
