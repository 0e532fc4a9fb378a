// HostTier (kvcache/host_tier.h): slots in chunks of host memory, a
// SlotTable under one mutex, the copies on TierWorkers outside it.
#include "kvcache/host_tier.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>

#include "kvcache/error.h"
#include "memory/host_arena.h"
#include "tier/eviction_log.h"
#include "tier/page_codec.h"
#include "tier/slot_table.h"
#include "tier/ticket_state.h"
#include "tier/workers.h"

namespace kvcache {

namespace {
constexpr std::uint64_t kMaxSlots = std::numeric_limits<std::uint32_t>::max() - 1;
constexpr std::size_t kAlign = 64;

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}
}  // namespace

struct HostTier::Impl {
  Impl(TierFingerprint f, std::uint64_t capacity, HostTierOptions o)
      : fp(std::move(f)),
        digest(fp.digest()),
        page_bytes(fp.page_bytes()),
        meta_bytes(tier::round_up(tier::meta_used_bytes(fp.page_size), kAlign)),
        slot_bytes(meta_bytes + tier::round_up(page_bytes, kAlign)),
        capacity_bytes(capacity),
        num_slots(page_bytes == 0 ? 0 : capacity / page_bytes),
        slots_per_chunk(std::max<std::size_t>(1, o.chunk_bytes / slot_bytes)),
        huge(o.huge_pages),
        checksums(o.checksums),
        table(num_slots, std::move(o.policy)),
        workers(o.synchronous ? 0 : o.threads, o.linger) {}

  std::byte* slot_memory(std::uint32_t slot);  // under mu
  void store_one(const std::shared_ptr<TierTicket::State>& st, std::size_t i, PageWrite w);
  void load_one(const std::shared_ptr<TierTicket::State>& st, std::size_t i, PageRead r,
                std::uint64_t t0);

  const TierFingerprint fp;
  const std::uint64_t digest;
  const std::size_t page_bytes;
  const std::size_t meta_bytes;
  const std::size_t slot_bytes;
  const std::uint64_t capacity_bytes;
  const std::uint64_t num_slots;
  const std::size_t slots_per_chunk;
  const bool huge;
  const bool checksums;

  mutable std::mutex mu;
  std::vector<std::unique_ptr<memory::HostArena>> chunks;  // under mu
  tier::SlotTable table;                                   // under mu
  TierStats st;                                            // under mu
  tier::EvictionLog evicted;                               // its own lock
  tier::TierWorkers workers;  // last: destroyed first, finishing every queued page
};

std::byte* HostTier::Impl::slot_memory(std::uint32_t slot) {
  const std::size_t c = slot / slots_per_chunk;
  if (c >= chunks.size()) chunks.resize(c + 1);
  if (chunks[c] == nullptr) {
    chunks[c] = std::make_unique<memory::HostArena>(slots_per_chunk * slot_bytes, huge);
  }
  return chunks[c]->data() + (slot % slots_per_chunk) * slot_bytes;
}

void HostTier::Impl::store_one(const std::shared_ptr<TierTicket::State>& state, std::size_t i,
                               PageWrite w) {
  std::byte* mem = nullptr;
  tier::SlotTable::Claimed c;
  {
    std::lock_guard lock(mu);
    c = table.claim_for_write(w.key);
    if (c.what == tier::SlotTable::Claim::slot) {
      try {
        mem = slot_memory(c.slot);
      } catch (const Error&) {
        table.abandon(c.slot);
        ++st.io_errors;
        state->finish_store(i, StoreResult::failed);
        return;
      }
      if (c.evicted) {
        ++st.evictions;
        evicted.record(*c.evicted);
      }
    } else if (c.what == tier::SlotTable::Claim::full) {
      ++st.rejected;
    }
  }
  if (c.what == tier::SlotTable::Claim::present)
    return state->finish_store(i, StoreResult::present);
  if (c.what == tier::SlotTable::Claim::full) return state->finish_store(i, StoreResult::rejected);
  tier::Checksum sum;
  const std::span<std::byte> meta(mem, meta_bytes);
  tier::write_meta(meta, digest, w.key, w.token_ids, page_bytes, sum);
  std::uint64_t checksum = 0;
  if (checksums) {
    tier::copy_and_hash(mem + meta_bytes, w.bytes.data(), page_bytes, sum);
    checksum = tier::seal(meta, sum);
  } else {
    std::memcpy(mem + meta_bytes, w.bytes.data(), page_bytes);
  }
  {
    std::lock_guard lock(mu);
    table.publish(c.slot, checksum);
    ++st.pages_stored;
    st.bytes_stored += page_bytes;
  }
  state->finish_store(i, StoreResult::stored);
}

void HostTier::Impl::load_one(const std::shared_ptr<TierTicket::State>& state, std::size_t i,
                              PageRead r, std::uint64_t t0) {
  std::byte* mem = nullptr;
  std::optional<std::uint32_t> slot;
  {
    std::lock_guard lock(mu);
    slot = table.pin(r.key);
    if (slot) mem = slot_memory(*slot);  // allocated: the slot holds a page
  }
  if (!slot) return state->finish_load(i, LoadResult::missing);
  const std::span<const std::byte> meta(mem, meta_bytes);
  const PageHeader h = tier::read_header(meta);
  LoadResult result = LoadResult::loaded;
  if (!tier::header_well_formed(h, r.key, fp.page_size, page_bytes)) {
    result = LoadResult::corrupt;
  } else if (!checksums) {
    std::memcpy(r.bytes.data(), mem + meta_bytes, page_bytes);
    if (!tier::identity_matches(meta, digest, r.token_ids)) result = LoadResult::mismatch;
  } else {
    tier::Checksum sum;
    tier::hash_meta(meta, fp.page_size, sum);
    tier::copy_and_hash(r.bytes.data(), mem + meta_bytes, page_bytes, sum);
    if (sum.digest() != h.checksum) {
      result = LoadResult::corrupt;
    } else if (!tier::identity_matches(meta, digest, r.token_ids)) {
      result = LoadResult::mismatch;
    }
  }
  {
    std::lock_guard lock(mu);
    if (result == LoadResult::corrupt) {
      table.drop(*slot);
      ++st.corrupt;
    } else {
      table.unpin(*slot, result == LoadResult::loaded);
    }
    if (result == LoadResult::loaded) {
      ++st.pages_loaded;
      st.bytes_loaded += page_bytes;
      st.load_nanoseconds += now_ns() - t0;
    }
  }
  state->finish_load(i, result);
}

HostTier::HostTier(TierFingerprint fingerprint, std::uint64_t capacity_bytes,
                   HostTierOptions options) {
  const std::size_t page_bytes = fingerprint.page_bytes();
  if (page_bytes == 0) {
    throw InvalidArgument("host tier: the fingerprint's page has 0 bytes (page_size " +
                          std::to_string(fingerprint.page_size) + ", n_kv_heads " +
                          std::to_string(fingerprint.n_kv_heads) + ", head_dim " +
                          std::to_string(fingerprint.head_dim) + ")");
  }
  if (capacity_bytes / page_bytes > kMaxSlots) {
    throw InvalidArgument("host tier: capacity " + std::to_string(capacity_bytes) +
                          " bytes is more than the limit of " + std::to_string(kMaxSlots) +
                          " pages of " + std::to_string(page_bytes) + " bytes");
  }
  if (options.linger < std::chrono::microseconds{0} || options.linger > std::chrono::seconds{1}) {
    throw InvalidArgument("host tier: linger is " + std::to_string(options.linger.count()) +
                          " us: it must be in [0, 1000000]");
  }
  if (!options.synchronous && options.threads == 0) {
    throw InvalidArgument("host tier: threads is 0; set synchronous for no worker threads");
  }
  impl_ = std::make_unique<Impl>(std::move(fingerprint), capacity_bytes, std::move(options));
  impl_->st.capacity_bytes = capacity_bytes;
}

HostTier::~HostTier() = default;

const TierFingerprint& HostTier::fingerprint() const { return impl_->fp; }

std::vector<std::uint8_t> HostTier::contains(std::span<const PageKey> keys) {
  std::vector<std::uint8_t> out(keys.size());
  std::lock_guard lock(impl_->mu);
  std::uint64_t hits = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out[i] = impl_->table.held(keys[i]) ? 1 : 0;
    hits += out[i];
  }
  impl_->st.lookups += keys.size();
  impl_->st.hits += hits;
  return out;
}

TierTicket HostTier::store(std::span<const PageWrite> pages) {
  tier::check_writes(pages, impl_->fp.page_size, impl_->page_bytes, name());
  auto state = TierTicket::State::for_stores(pages.size());
  state->set_nudge(impl_->workers.nudger());
  auto writes = std::make_shared<const std::vector<PageWrite>>(pages.begin(), pages.end());
  impl_->workers.post_range(
      pages.size(),
      [impl = impl_.get(), state, writes](std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) impl->store_one(state, i, (*writes)[i]);
      },
      tier::TierWorkers::Wake::lazy);
  return TierTicket(state);
}

TierTicket HostTier::load(std::span<const PageRead> pages) {
  tier::check_reads(pages, impl_->fp.page_size, impl_->page_bytes, name());
  auto state = TierTicket::State::for_loads(pages.size());
  const std::uint64_t t0 = now_ns();
  auto reads = std::make_shared<const std::vector<PageRead>>(pages.begin(), pages.end());
  impl_->workers.post_range(
      pages.size(), [impl = impl_.get(), state, reads, t0](std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) impl->load_one(state, i, (*reads)[i], t0);
      });
  return TierTicket(state);
}

TierStats HostTier::stats() const {
  std::lock_guard lock(impl_->mu);
  TierStats s = impl_->st;
  s.pages_held = impl_->table.pages_held();
  s.bytes_held = s.pages_held * impl_->page_bytes;
  return s;
}

void HostTier::take_evicted(std::vector<PageKey>& out) { impl_->evicted.take(out); }

std::size_t HostTier::num_slots() const { return impl_->num_slots; }
std::size_t HostTier::slot_bytes() const { return impl_->slot_bytes; }

}  // namespace kvcache
