// The C interface's storage tiers (include/kvcache/c_api.h, "storage tiers
// below the paged pool"; docs/tiers.md): making host and disk tiers, their
// figures, the tiers part of kvc_prefix_config, the pending-load calls, a
// pool apart's kvc_complete_offloads and a manager's per-tier figures.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "c_api/c_api_internal.h"
#include "kvcache/disk_tier.h"
#include "kvcache/host_tier.h"

namespace kvcache::c_api {

namespace {

// Worker threads a tier may be asked for (as kvc_thread_pool_create).
constexpr std::uint32_t kMaxTierThreads = 1024;

static_assert(KVC_ADMIT_EVERY_PAGE == static_cast<int>(OffloadAdmission::every_page) &&
              KVC_ADMIT_REUSED == static_cast<int>(OffloadAdmission::reused));
static_assert(KVC_DISK_IO_AUTOMATIC == static_cast<int>(DiskIo::automatic) &&
              KVC_DISK_IO_URING == static_cast<int>(DiskIo::io_uring) &&
              KVC_DISK_IO_THREADS == static_cast<int>(DiskIo::threads));
static_assert(KVC_TIER_UNLIMITED == DiskTier::kUnlimited);

std::string str_or_empty(const char* s) { return s == nullptr ? std::string() : std::string(s); }

// The fingerprint of a tier for these params, model id and salt.
TierFingerprint fingerprint(const kvc_params* params, const char* model_id, const char* salt) {
  const KVCacheParams p = to_params(params);
  if (p.cache_strategy != CacheStrategy::paged) {
    throw InvalidArgument(
        "params->strategy is KVC_STRATEGY_CONTINUOUS; a tier holds pages of the paged "
        "strategy (KVC_STRATEGY_PAGED)");
  }
  return TierFingerprint::of(p, str_or_empty(model_id), str_or_empty(salt));
}

void check_threads(std::uint32_t threads) {
  if (threads > kMaxTierThreads) {
    throw InvalidArgument("options->threads is " + std::to_string(threads) + "; at most " +
                          std::to_string(kMaxTierThreads));
  }
}

HostTierOptions host_options(const kvc_host_tier_options* o) {
  HostTierOptions h;
  if (o == nullptr) return h;
  check_threads(o->threads);
  h.threads = o->threads;
  h.synchronous = flag(o->synchronous, "options->synchronous");
  h.huge_pages = flag(o->huge_pages, "options->huge_pages");
  h.checksums = flag(o->checksums, "options->checksums");
  if (o->chunk_bytes > std::numeric_limits<std::size_t>::max()) {
    throw InvalidArgument("options->chunk_bytes " + std::to_string(o->chunk_bytes) +
                          " is past SIZE_MAX");
  }
  h.chunk_bytes = static_cast<std::size_t>(o->chunk_bytes);
  h.linger = std::chrono::microseconds{o->linger_us};  // the tier refuses past 1 s
  return h;
}

DiskTierOptions disk_options(const kvc_disk_tier_options* o) {
  DiskTierOptions d;
  if (o == nullptr) return d;
  d.io = from_c<DiskIo>(o->io, 3, "options->io",
                        "KVC_DISK_IO_AUTOMATIC, KVC_DISK_IO_URING or KVC_DISK_IO_THREADS");
  d.direct_io = flag(o->direct_io, "options->direct_io");
  d.durable = flag(o->durable, "options->durable");
  check_threads(o->threads);
  d.threads = o->threads;
  d.queue_depth = o->queue_depth;
  d.max_consecutive_errors = o->max_consecutive_errors;
  d.slab_bytes = o->slab_bytes;
  d.compact_min_records = o->compact_min_records;
  d.linger = std::chrono::microseconds{o->linger_us};  // the tier refuses past 1 s
  return d;
}

kvc_tier* wrap(std::shared_ptr<Tier> tier) {
  auto h = std::make_unique<kvc_tier>();
  h->name = std::string(tier->name());
  h->impl = std::move(tier);
  return h.release();
}

const Tier& tier_of(const kvc_tier* t) {
  require(t, "tier");
  return *t->impl;
}

kvc_tier_stats to_c(const TierStats& s) {
  kvc_tier_stats c{};
  c.pages_held = s.pages_held;
  c.bytes_held = s.bytes_held;
  c.capacity_bytes = s.capacity_bytes;
  c.lookups = s.lookups;
  c.hits = s.hits;
  c.pages_stored = s.pages_stored;
  c.pages_loaded = s.pages_loaded;
  c.bytes_stored = s.bytes_stored;
  c.bytes_loaded = s.bytes_loaded;
  c.evictions = s.evictions;
  c.rejected = s.rejected;
  c.corrupt = s.corrupt;
  c.io_errors = s.io_errors;
  c.load_nanoseconds = s.load_nanoseconds;
  c.enabled = s.enabled ? 1 : 0;
  return c;
}

kvc_tier_figures to_c(const TierFigures& f) {
  kvc_tier_figures c{};
  const std::size_t n = std::min(f.name.size(), sizeof(c.name) - 1);
  std::memcpy(c.name, f.name.data(), n);
  c.enabled = f.enabled ? 1 : 0;
  c.pages_held = f.pages_held;
  c.bytes_held = f.bytes_held;
  c.capacity_bytes = f.capacity_bytes;
  c.lookups = f.lookups;
  c.hits = f.hits;
  c.pages_stored = f.pages_stored;
  c.bytes_stored = f.bytes_stored;
  c.pages_loaded = f.pages_loaded;
  c.bytes_loaded = f.bytes_loaded;
  c.evictions = f.evictions;
  c.corrupt = f.corrupt;
  c.io_errors = f.io_errors;
  c.load_nanoseconds = f.load_nanoseconds;
  c.pages_offloaded = f.pages_offloaded;
  c.offload_dropped = f.offload_dropped;
  c.pages_onboarded = f.pages_onboarded;
  c.load_failures = f.load_failures;
  return c;
}

}  // namespace

TierConfig tier_config(const kvc_prefix_config& config) {
  TierConfig t;
  require_array(config.tiers, config.n_tiers, "config->tiers");
  for (std::uint32_t i = 0; i < config.n_tiers; ++i) {
    if (config.tiers[i] == nullptr) {
      throw InvalidArgument("config->tiers[" + std::to_string(i) + "] is NULL");
    }
    t.tiers.push_back(config.tiers[i]->impl);
  }
  t.model_id = str_or_empty(config.model_id);
  t.cache_salt = str_or_empty(config.cache_salt);
  t.admission = from_c<OffloadAdmission>(config.admission, 2, "config->admission",
                                         "KVC_ADMIT_EVERY_PAGE or KVC_ADMIT_REUSED");
  t.staging_pages = config.staging_pages;
  t.pool_apart = flag(config.pool_apart, "config->pool_apart");
  // The manager refuses either out of range (naming it), as staging_pages.
  t.offload_batch = config.offload_batch;
  t.offload_delay = std::chrono::microseconds{config.offload_delay_us};
  return t;
}

}  // namespace kvcache::c_api

using kvcache::InvalidArgument;
using kvcache::c_api::guarded;
using kvcache::c_api::require;
using kvcache::c_api::require_array;

extern "C" {

kvc_status kvc_tier_page_bytes(const kvc_params* params, uint64_t* bytes, kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::TierFingerprint f = kvcache::c_api::fingerprint(params, nullptr, nullptr);
    require(bytes, "bytes");
    *bytes = f.page_bytes();
  });
}

kvc_host_tier_options kvc_host_tier_options_default(void) {
  const kvcache::HostTierOptions d;
  kvc_host_tier_options o{};
  o.threads = static_cast<uint32_t>(d.threads);
  o.synchronous = d.synchronous ? 1 : 0;
  o.huge_pages = d.huge_pages ? 1 : 0;
  o.checksums = d.checksums ? 1 : 0;
  o.chunk_bytes = d.chunk_bytes;
  o.linger_us = static_cast<uint32_t>(d.linger.count());
  return o;
}

kvc_status kvc_host_tier_create(const kvc_params* params, const char* model_id,
                                const char* cache_salt, uint64_t capacity_bytes,
                                const kvc_host_tier_options* options, kvc_tier** out,
                                kvc_error* err) {
  return guarded(err, [&] {
    require(out, "out");
    kvcache::TierFingerprint f = kvcache::c_api::fingerprint(params, model_id, cache_salt);
    const kvcache::HostTierOptions o = kvcache::c_api::host_options(options);
    *out =
        kvcache::c_api::wrap(std::make_shared<kvcache::HostTier>(std::move(f), capacity_bytes, o));
  });
}

kvc_disk_tier_options kvc_disk_tier_options_default(void) {
  const kvcache::DiskTierOptions d;
  kvc_disk_tier_options o{};
  o.io = static_cast<int32_t>(d.io);
  o.direct_io = d.direct_io ? 1 : 0;
  o.durable = d.durable ? 1 : 0;
  o.threads = static_cast<uint32_t>(d.threads);
  o.queue_depth = d.queue_depth;
  o.max_consecutive_errors = d.max_consecutive_errors;
  o.slab_bytes = d.slab_bytes;
  o.compact_min_records = d.compact_min_records;
  o.linger_us = static_cast<uint32_t>(d.linger.count());
  return o;
}

kvc_status kvc_disk_tier_create(const kvc_params* params, const char* model_id,
                                const char* cache_salt, const char* dir, uint64_t capacity_bytes,
                                const kvc_disk_tier_options* options, kvc_tier** out,
                                kvc_error* err) {
  return guarded(err, [&] {
    require(out, "out");
    require(dir, "dir");
    if (*dir == '\0') throw InvalidArgument("dir is empty");
    kvcache::TierFingerprint f = kvcache::c_api::fingerprint(params, model_id, cache_salt);
    const kvcache::DiskTierOptions o = kvcache::c_api::disk_options(options);
    *out = kvcache::c_api::wrap(
        std::make_shared<kvcache::DiskTier>(std::move(f), dir, capacity_bytes, o));
  });
}

void kvc_tier_destroy(kvc_tier* tier) { delete tier; }

const char* kvc_tier_name(const kvc_tier* tier) {
  return tier == nullptr ? nullptr : tier->name.c_str();
}

kvc_status kvc_tier_stats_get(const kvc_tier* tier, kvc_tier_stats* out, kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::Tier& t = kvcache::c_api::tier_of(tier);
    require(out, "out");
    *out = kvcache::c_api::to_c(t.stats());
  });
}

kvc_status kvc_disk_tier_info_get(const kvc_tier* tier, kvc_disk_tier_info* out, kvc_error* err) {
  return guarded(err, [&] {
    const auto* disk = dynamic_cast<const kvcache::DiskTier*>(&kvcache::c_api::tier_of(tier));
    if (disk == nullptr) {
      throw InvalidArgument("tier is a '" + tier->name + "' tier, not a disk tier");
    }
    require(out, "out");
    kvc_disk_tier_info i{};
    i.io = disk->io_backend() == "io_uring" ? KVC_DISK_IO_URING : KVC_DISK_IO_THREADS;
    i.direct_io = disk->direct_io() ? 1 : 0;
    const kvcache::DiskRecovery& r = disk->recovery();
    i.fresh = r.fresh ? 1 : 0;
    i.pages_recovered = r.pages;
    i.pages_dropped = r.dropped;
    i.torn_manifest_bytes = r.torn_manifest_bytes;
    i.slot_bytes = disk->slot_bytes();
    *out = i;
  });
}

kvc_status kvc_has_pending_loads(const kvc_manager* manager, uint64_t seq, int32_t* pending,
                                 kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::PagedKVCacheManager& m =
        kvcache::c_api::paged_of(manager, "kvc_has_pending_loads");
    require(pending, "pending");
    *pending = m.has_pending_loads(seq) ? 1 : 0;
  });
}

kvc_status kvc_poll_loads(kvc_manager* manager, uint64_t* seq_ids, uint32_t cap, uint32_t* count,
                          kvc_error* err) {
  return guarded(err, [&] {
    kvcache::PagedKVCacheManager& m = kvcache::c_api::paged_of(manager, "kvc_poll_loads");
    require(count, "count");
    require_array(seq_ids, cap, "seq_ids");
    if (seq_ids != nullptr && cap < m.max_batch_size()) {
      throw InvalidArgument("seq_ids holds " + std::to_string(cap) +
                            " ids but kvc_poll_loads may finish as many sequences as the "
                            "manager's max_batch_size (" +
                            std::to_string(m.max_batch_size()) + ")");
    }
    if (seq_ids == nullptr && cap == 0) {
      *count = static_cast<uint32_t>(m.poll_loads().size());
      return;
    }
    const std::vector<kvcache::SeqId> ready = m.poll_loads();  // nothing fails after it
    std::copy(ready.begin(), ready.end(), seq_ids);
    *count = static_cast<uint32_t>(ready.size());
  });
}

kvc_status kvc_wait_loads(kvc_manager* manager, uint64_t seq, kvc_error* err) {
  return guarded(err, [&] { kvcache::c_api::paged_of(manager, "kvc_wait_loads").wait_loads(seq); });
}

kvc_status kvc_wait_tiers(kvc_manager* manager, kvc_error* err) {
  return guarded(err, [&] { kvcache::c_api::paged_of(manager, "kvc_wait_tiers").wait_tiers(); });
}

kvc_status kvc_complete_offloads(kvc_manager* manager, const kvc_batch* batch, uint32_t* completed,
                                 kvc_error* err) {
  return guarded(err, [&] {
    kvcache::PagedKVCacheManager& m = kvcache::c_api::paged_of(manager, "kvc_complete_offloads");
    require(batch, "batch");
    if (!batch->fetched) throw InvalidArgument("batch has not been fetched into (kvc_fetch)");
    const std::size_t n = m.complete_offloads(batch->batch);
    if (completed != nullptr) *completed = static_cast<uint32_t>(n);  // <= staging_pages
  });
}

kvc_status kvc_manager_tier_figures(const kvc_manager* manager, kvc_tier_figures* figures,
                                    uint32_t cap, uint32_t* count, uint32_t* pending_loads,
                                    kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheManager& m = kvcache::c_api::manager_of(manager);
    if (figures == nullptr && cap != 0) {
      throw InvalidArgument("figures is NULL with cap " + std::to_string(cap) +
                            " (0 asks for the counts)");
    }
    const kvcache::ManagerStats s = m.stats();
    const auto n = static_cast<uint32_t>(s.tiers.size());
    if (count != nullptr) *count = n;
    if (pending_loads != nullptr) *pending_loads = s.pending_loads;
    if (figures == nullptr) return;
    if (n > cap) {
      throw InvalidArgument("figures holds " + std::to_string(cap) +
                            " entries but the manager has " + std::to_string(n) + " tiers");
    }
    for (uint32_t i = 0; i < n; ++i) figures[i] = kvcache::c_api::to_c(s.tiers[i]);
  });
}

}  // extern "C"
