// DiskTier (kvcache/disk_tier.h): the store and load paths, the group commit
// of manifest records and the error accounting. Opening and recovery:
// disk_open.cpp.
#include "kvcache/disk_tier.h"

#include <chrono>
#include <cstring>
#include <string>

#include "kvcache/error.h"
#include "kvcache/log.h"
#include "tier/disk_tier_impl.h"
#include "tier/page_codec.h"

namespace kvcache {

namespace {
std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}
}  // namespace

bool DiskTier::Impl::zero_copy(const std::byte* p) const {
  if (!slabs.direct()) return true;
  return reinterpret_cast<std::uintptr_t>(p) % tier::kDiskAlign == 0 &&
         page_bytes % tier::kDiskAlign == 0;
}

void DiskTier::Impl::finish_store(const StatePtr& s, std::size_t i, StoreResult r) {
  s->finish_store(i, r);
  std::lock_guard lock(out_mu);
  if (--outstanding == 0) out_cv.notify_all();
}

void DiskTier::Impl::finish_load(const StatePtr& s, std::size_t i, LoadResult r) {
  s->finish_load(i, r);
  std::lock_guard lock(out_mu);
  if (--outstanding == 0) out_cv.notify_all();
}

void DiskTier::Impl::io_failed(int err, const char* what, std::uint32_t slot) {
  bool disable = false;
  {
    std::lock_guard lock(mu);
    ++st.io_errors;
    ++consecutive_errors;
    disable = enabled.load() && consecutive_errors >= opt.max_consecutive_errors;
    if (disable) {
      enabled = false;
      st.enabled = false;
    }
  }
  log_with(LogLevel::warn, [&] {
    return "disk tier " + dir.string() + ": " + what + " slot " + std::to_string(slot) +
           " failed: " + std::strerror(err);
  });
  if (disable) {
    log_with(LogLevel::warn, [&] {
      return "disk tier " + dir.string() + " disabled after " +
             std::to_string(opt.max_consecutive_errors) +
             " I/O errors in a row; the cache goes on without it";
    });
  }
}

void DiskTier::Impl::io_succeeded() {
  std::lock_guard lock(mu);
  consecutive_errors = 0;
}

void DiskTier::Impl::queue_removal(std::uint32_t slot, PageKey key) {
  std::lock_guard lock(commit_mu);
  removals.push_back({tier::ManifestRecord::Kind::removed, slot, key, 0});
}

void DiskTier::Impl::fail_store(const StatePtr& s, std::size_t i, std::uint32_t slot, int err,
                                const char* what) {
  {
    std::lock_guard lock(mu);
    table.abandon(slot);
  }
  io_failed(err, what, slot);
  finish_store(s, i, StoreResult::failed);
}

void DiskTier::Impl::store_one(const StatePtr& s, std::size_t i, PageWrite w) {
  if (!enabled) {
    {
      std::lock_guard lock(mu);
      ++st.rejected;
    }
    return finish_store(s, i, StoreResult::rejected);
  }
  tier::SlotTable::Claimed c;
  {
    std::lock_guard lock(mu);
    c = table.claim_for_write(w.key);
    if (c.evicted) {
      ++st.evictions;
      evicted.record(*c.evicted);
    }
    if (c.what == tier::SlotTable::Claim::full) ++st.rejected;
  }
  if (c.what == tier::SlotTable::Claim::present) return finish_store(s, i, StoreResult::present);
  if (c.what == tier::SlotTable::Claim::full) return finish_store(s, i, StoreResult::rejected);
  if (c.evicted) queue_removal(c.slot, *c.evicted);
  const int fd = slabs.fd_for(c.slot, true);
  if (fd < 0) return fail_store(s, i, c.slot, -fd, "preallocating the slab of");

  std::shared_ptr<std::byte> meta, staged;
  tier::Checksum sum;
  tier::IoRequest req;
  try {
    meta = meta_buffers.get();
    tier::write_meta({meta.get(), meta_bytes}, digest, w.key, w.token_ids, page_bytes, sum);
    req.iov[0] = {meta.get(), meta_bytes};
    if (zero_copy(w.bytes.data())) {
      sum.update(w.bytes.data(), page_bytes);
      req.iov[1] = {const_cast<std::byte*>(w.bytes.data()),
                    slabs.direct() ? data_bytes : page_bytes};
    } else {
      staged = data_buffers.get();
      tier::copy_and_hash(staged.get(), w.bytes.data(), page_bytes, sum);
      std::memset(staged.get() + page_bytes, 0, data_bytes - page_bytes);
      req.iov[1] = {staged.get(), data_bytes};
    }
  } catch (const std::exception&) {
    return fail_store(s, i, c.slot, ENOMEM, "staging");
  }
  const std::uint64_t checksum = tier::seal({meta.get(), meta_bytes}, sum);
  req.fd = fd;
  req.offset = slabs.offset_of(c.slot);
  req.write = true;
  req.iovcnt = 2;
  const std::size_t want = req.bytes();
  io->submit(req, [this, s, i, slot = c.slot, key = w.key, checksum, meta, staged, want](long res) {
    write_done(s, i, slot, key, checksum, res, want);
  });
}

void DiskTier::Impl::write_done(const StatePtr& s, std::size_t i, std::uint32_t slot, PageKey key,
                                std::uint64_t checksum, long result, std::size_t want) {
  if (result < 0) return fail_store(s, i, slot, static_cast<int>(-result), "writing");
  if (static_cast<std::size_t>(result) != want) return fail_store(s, i, slot, ENOSPC, "writing");
  slabs.mark_dirty(slot);
  commit(s, i, slot, key, checksum);
}

// Group commit: the first thread to find no commit running becomes the
// committer and, batch after batch, syncs the slabs, appends the records
// and publishes the pages, while others only queue theirs.
void DiskTier::Impl::commit(const StatePtr& s, std::size_t i, std::uint32_t slot, PageKey key,
                            std::uint64_t checksum) {
  {
    std::lock_guard lock(commit_mu);
    pending.push_back({s, i, {tier::ManifestRecord::Kind::stored, slot, key, checksum}});
    if (committing) return;
    committing = true;
  }
  commit_batch();
}

void DiskTier::Impl::commit_batch() {
  for (;;) {
    std::vector<PendingStore> batch;
    std::vector<tier::ManifestRecord> records;
    {
      std::lock_guard lock(commit_mu);
      if (pending.empty()) {
        committing = false;
        return;
      }
      batch.swap(pending);
      records.swap(removals);
    }
    for (const PendingStore& p : batch) records.push_back(p.record);
    const bool synced = !opt.durable || slabs.sync_dirty();
    const bool ok = synced && manifest->append(records);
    const int err = errno;
    {
      std::lock_guard lock(mu);
      for (const PendingStore& p : batch) {
        if (ok) {
          table.publish(p.record.slot, p.record.checksum);
          ++st.pages_stored;
          st.bytes_stored += page_bytes;
        } else {
          table.abandon(p.record.slot);
        }
      }
      if (ok) consecutive_errors = 0;
    }
    if (!ok) io_failed(err, synced ? "recording" : "syncing", batch.front().record.slot);
    for (const PendingStore& p : batch) {
      finish_store(p.state, p.index, ok ? StoreResult::stored : StoreResult::failed);
    }
    if (ok) maybe_compact();
  }
}

void DiskTier::Impl::maybe_compact() {
  std::vector<tier::ManifestRecord> held;
  {
    std::lock_guard lock(mu);
    if (manifest->records() <= 2 * table.pages_held() + opt.compact_min_records) return;
    for (const auto& e : table.held_entries()) {
      held.push_back({tier::ManifestRecord::Kind::stored, e.slot, e.key, e.checksum});
    }
  }
  {
    // Removals queued after the snapshot stay queued; those before are in it.
    std::lock_guard lock(commit_mu);
    removals.clear();
  }
  if (!manifest->compact(held)) io_failed(errno, "compacting the manifest for", 0);
}

void DiskTier::Impl::load_one(const StatePtr& s, std::size_t i, PageRead r, std::uint64_t t0) {
  if (!enabled) return finish_load(s, i, LoadResult::missing);
  std::optional<std::uint32_t> slot;
  std::uint64_t expected = 0;
  {
    std::lock_guard lock(mu);
    slot = table.pin(r.key);
    if (slot) expected = table.checksum_of(*slot);
  }
  if (!slot) return finish_load(s, i, LoadResult::missing);
  const int fd = slabs.fd_for(*slot, false);
  std::shared_ptr<std::byte> meta, staged;
  try {
    if (fd < 0) throw std::system_error(-fd, std::generic_category());
    meta = meta_buffers.get();
    if (!zero_copy(r.bytes.data())) staged = data_buffers.get();
  } catch (const std::exception&) {
    {
      std::lock_guard lock(mu);
      table.unpin(*slot, false);
    }
    io_failed(fd < 0 ? -fd : ENOMEM, "opening", *slot);
    return finish_load(s, i, LoadResult::failed);
  }
  tier::IoRequest req;
  req.fd = fd;
  req.offset = slabs.offset_of(*slot);
  req.iov[0] = {meta.get(), meta_bytes};
  req.iov[1] = staged ? iovec{staged.get(), data_bytes}
                      : iovec{r.bytes.data(), slabs.direct() ? data_bytes : page_bytes};
  req.iovcnt = 2;
  const std::size_t want = req.bytes();
  io->submit(req, [this, s, i, r, slot = *slot, expected, meta, staged, want, t0](long res) {
    read_done(s, i, r, slot, expected, meta.get(), staged.get(), res, want, t0);
  });
}

void DiskTier::Impl::read_done(const StatePtr& s, std::size_t i, const PageRead& r,
                               std::uint32_t slot, std::uint64_t expected, const std::byte* meta_p,
                               const std::byte* staged, long result, std::size_t want,
                               std::uint64_t t0) {
  LoadResult out = LoadResult::loaded;
  if (result < 0) {
    {
      std::lock_guard lock(mu);
      table.unpin(slot, false);
    }
    io_failed(static_cast<int>(-result), "reading", slot);
    return finish_load(s, i, LoadResult::failed);
  }
  const std::span<const std::byte> meta(meta_p, meta_bytes);
  const PageHeader h = tier::read_header(meta);
  if (static_cast<std::size_t>(result) != want ||  // the slab ends inside the slot
      !tier::header_well_formed(h, r.key, fp.page_size, page_bytes) || h.checksum != expected) {
    out = LoadResult::corrupt;
  } else {
    tier::Checksum sum;
    tier::hash_meta(meta, fp.page_size, sum);
    if (staged != nullptr) {
      tier::copy_and_hash(r.bytes.data(), staged, page_bytes, sum);
    } else {
      sum.update(r.bytes.data(), page_bytes);
    }
    if (sum.digest() != expected) {
      out = LoadResult::corrupt;
    } else if (!tier::identity_matches(meta, digest, r.token_ids)) {
      out = LoadResult::mismatch;
    }
  }
  {
    std::lock_guard lock(mu);
    consecutive_errors = 0;
    if (out == LoadResult::corrupt) {
      table.drop(slot);
      ++st.corrupt;
    } else {
      table.unpin(slot, out == LoadResult::loaded);
    }
    if (out == LoadResult::loaded) {
      ++st.pages_loaded;
      st.bytes_loaded += page_bytes;
      st.load_nanoseconds += now_ns() - t0;
    }
  }
  if (out == LoadResult::corrupt) {
    queue_removal(slot, r.key);
    log_with(LogLevel::warn, [&] {
      return "disk tier " + dir.string() + ": slot " + std::to_string(slot) +
             " failed its checksum or header; dropped";
    });
  }
  finish_load(s, i, out);
}

// ---- the public face ----------------------------------------------------------------

DiskTier::DiskTier(TierFingerprint fingerprint, std::filesystem::path dir,
                   std::uint64_t capacity_bytes, DiskTierOptions options)
    : impl_(std::make_unique<Impl>(std::move(fingerprint), std::move(dir), capacity_bytes,
                                   std::move(options))) {}

DiskTier::~DiskTier() = default;

const TierFingerprint& DiskTier::fingerprint() const { return impl_->fp; }
bool DiskTier::enabled() const { return impl_->enabled.load(); }

std::vector<std::uint8_t> DiskTier::contains(std::span<const PageKey> keys) {
  std::vector<std::uint8_t> out(keys.size(), 0);
  std::lock_guard lock(impl_->mu);
  impl_->st.lookups += keys.size();
  if (!impl_->enabled) return out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out[i] = impl_->table.held(keys[i]) ? 1 : 0;
    impl_->st.hits += out[i];
  }
  return out;
}

TierTicket DiskTier::store(std::span<const PageWrite> pages) {
  tier::check_writes(pages, impl_->fp.page_size, impl_->page_bytes, name());
  auto state = TierTicket::State::for_stores(pages.size());
  state->set_nudge(impl_->workers->nudger());
  {
    std::lock_guard lock(impl_->out_mu);
    impl_->outstanding += pages.size();
  }
  auto writes = std::make_shared<const std::vector<PageWrite>>(pages.begin(), pages.end());
  impl_->workers->post_range(
      pages.size(),
      [impl = impl_.get(), state, writes](std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) impl->store_one(state, i, (*writes)[i]);
      },
      tier::TierWorkers::Wake::lazy);
  return TierTicket(state);
}

TierTicket DiskTier::load(std::span<const PageRead> pages) {
  tier::check_reads(pages, impl_->fp.page_size, impl_->page_bytes, name());
  auto state = TierTicket::State::for_loads(pages.size());
  const std::uint64_t t0 = now_ns();
  {
    std::lock_guard lock(impl_->out_mu);
    impl_->outstanding += pages.size();
  }
  auto reads = std::make_shared<const std::vector<PageRead>>(pages.begin(), pages.end());
  impl_->workers->post_range(
      pages.size(), [impl = impl_.get(), state, reads, t0](std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) impl->load_one(state, i, (*reads)[i], t0);
      });
  return TierTicket(state);
}

TierStats DiskTier::stats() const {
  std::lock_guard lock(impl_->mu);
  TierStats s = impl_->st;
  s.pages_held = impl_->table.pages_held();
  s.bytes_held = s.pages_held * impl_->page_bytes;
  s.enabled = impl_->enabled.load();
  return s;
}

void DiskTier::take_evicted(std::vector<PageKey>& out) { impl_->evicted.take(out); }

std::string_view DiskTier::io_backend() const { return impl_->io->name(); }
bool DiskTier::direct_io() const { return impl_->slabs.direct(); }
std::size_t DiskTier::slot_bytes() const { return impl_->slot_bytes; }
const DiskRecovery& DiskTier::recovery() const { return impl_->recovery_report; }
const std::filesystem::path& DiskTier::dir() const { return impl_->dir; }

}  // namespace kvcache
