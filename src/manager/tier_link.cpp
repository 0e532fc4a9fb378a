#include "manager/tier_link.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "core/checked_math.h"
#include "kvcache/error.h"
#include "manager/observability.h"
#include "prefix/prefix_store.h"

namespace kvcache::manager {

namespace {

std::string str(std::uint64_t v) { return std::to_string(v); }

constexpr std::uint64_t round_up(std::uint64_t n, std::uint64_t to) {
  return (n + to - 1) / to * to;
}

// The monotonic clock at its coarse resolution (a few ms; read in ~3 ns,
// against ~20 for the fine one): every manager call with pages staged asks it.
std::chrono::nanoseconds coarse_now() noexcept {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return std::chrono::seconds{t.tv_sec} + std::chrono::nanoseconds{t.tv_nsec};
}

template <class T>
void check_field(const std::string& who, const char* field, const T& have, const T& want) {
  if (have == want) return;
  auto show = [](const T& v) {
    if constexpr (std::is_same_v<T, std::string>) {
      return "'" + v + "'";
    } else if constexpr (std::is_same_v<T, DType>) {
      return std::string(dtype_name(v));
    } else if constexpr (std::is_same_v<T, PageLayout>) {
      return std::string(layout_name(v));
    } else {
      return std::to_string(v);
    }
  };
  throw InvalidArgument(who + " fingerprint " + field + " is " + show(have) +
                        " but this manager's is " + show(want));
}

}  // namespace

void check_fingerprint(const std::string& tier, const TierFingerprint& have,
                       const TierFingerprint& want) {
  check_field(tier, "dtype", have.dtype, want.dtype);
  check_field(tier, "layout", have.layout, want.layout);
  check_field(tier, "page_size", have.page_size, want.page_size);
  check_field(tier, "n_kv_heads", have.n_kv_heads, want.n_kv_heads);
  check_field(tier, "head_dim", have.head_dim, want.head_dim);
  check_field(tier, "layer_begin", have.layer_begin, want.layer_begin);
  check_field(tier, "layer_end", have.layer_end, want.layer_end);
  check_field(tier, "device_index", have.device_index, want.device_index);
  check_field(tier, "device_count", have.device_count, want.device_count);
  check_field(tier, "model_id", have.model_id, want.model_id);
  check_field(tier, "cache_salt", have.cache_salt, want.cache_salt);
}

// ---- PageBytes ---------------------------------------------------------------------

PageBytes::PageBytes(const KVCacheParams& params, std::byte* arena, std::uint32_t num_pages)
    : arena_(arena), num_layers_(params.num_layers) {
  const std::size_t page = std::size_t{params.page_size} * params.bytes_per_token_per_device();
  const bool per_layer = params.pool_arrangement == PoolArrangement::per_layer;
  runs_ = per_layer ? 2 * std::size_t{params.num_layers} : 1;
  run_bytes_ = page / runs_;
  pitch_ = per_layer ? run_bytes_ * num_pages : page;
}

// per_layer pool: [num_layers][2][num_pages][block]; packed: [2][num_layers][block].
std::byte* PageBytes::run(std::uint32_t page, std::uint32_t kv,
                          std::uint32_t layer) const noexcept {
  const std::size_t r = std::size_t{layer} * 2 + kv;
  return arena_ + r * pitch_ + std::size_t{page} * run_bytes_;
}

void PageBytes::pack(std::uint32_t page, std::span<std::byte> out) const noexcept {
  if (packed_in_place()) {
    std::memcpy(out.data(), in_place(page).data(), run_bytes_);
    return;
  }
  for (std::uint32_t kv = 0; kv < 2; ++kv)
    for (std::uint32_t l = 0; l < num_layers_; ++l)
      std::memcpy(out.data() + (std::size_t{kv} * num_layers_ + l) * run_bytes_, run(page, kv, l),
                  run_bytes_);
}

void PageBytes::unpack(std::span<const std::byte> in, std::uint32_t page) const noexcept {
  if (packed_in_place()) {
    std::memcpy(in_place(page).data(), in.data(), run_bytes_);
    return;
  }
  for (std::uint32_t kv = 0; kv < 2; ++kv)
    for (std::uint32_t l = 0; l < num_layers_; ++l)
      std::memcpy(run(page, kv, l), in.data() + (std::size_t{kv} * num_layers_ + l) * run_bytes_,
                  run_bytes_);
}

// ---- TierLink ----------------------------------------------------------------------

void TierLink::check_ranges(const TierConfig& config) {
  if (config.staging_pages == 0 || config.staging_pages > 65536) {
    throw InvalidArgument("tiers.staging_pages is " + str(config.staging_pages) +
                          ": it must be in [1, 65536]");
  }
  if (config.offload_batch == 0 || config.offload_batch > 65536) {
    throw InvalidArgument("tiers.offload_batch is " + str(config.offload_batch) +
                          ": it must be in [1, 65536]");
  }
  if (config.offload_delay < std::chrono::microseconds{0} ||
      config.offload_delay > std::chrono::seconds{1}) {
    throw InvalidArgument("tiers.offload_delay is " + std::to_string(config.offload_delay.count()) +
                          " us: it must be in [0, 1000000]");
  }
}

void TierLink::check(const KVCacheParams& params, const TierConfig& config) {
  if (config.tiers.empty()) {
    if (config.pool_apart) {
      throw InvalidArgument(
          "tiers.pool_apart is set but tiers.tiers is empty: a pool apart "
          "moves pages to and from tiers, it needs at least one");
    }
    return;
  }
  if (!params.enable_prefix_caching) {
    throw InvalidArgument("tiers need prefix caching: params.enable_prefix_caching is false");
  }
  check_ranges(config);
  check_shards(params, config);
  (void)staging_bytes(params, config);  // past 64 bits: throws
}

std::uint64_t TierLink::staging_bytes(const KVCacheParams& params, const TierConfig& config) {
  if (config.tiers.empty()) return 0;
  check_ranges(config);
  const std::uint64_t page = detail::checked_product(
      "tier staging page", {{"page_size", params.page_size},
                            {"bytes_per_token_per_device", params.bytes_per_token_per_device()},
                            {"n_devices", params.n_devices}});
  const std::uint64_t slots = detail::checked_product(
      "tier staging", {{"staging_pages", config.staging_pages},
                       {"page bytes + token ids",
                        round_up(page, kSlotAlign) + 4 * std::uint64_t{params.page_size}}});
  // One allocation, aligned to kStagingAlign; room for one tier's reports.
  return slots + kStagingAlign + Tier::kEvictionReports * sizeof(PageKey);
}

TierLink::TierLink(const KVCacheParams& params, std::uint32_t num_pages,
                   std::span<std::byte* const> arenas, const TierConfig& config,
                   std::function<void(const PageEvent&)> on_event)
    : tiers_(config.tiers),
      shards_(params.n_devices),
      num_pages_(num_pages),
      fingerprint_digest_(config.fingerprint(params, 0).chain_digest()),
      digest_(fingerprint_digest_),
      page_size_(params.page_size),
      admission_(config.admission),
      batch_(config.offload_delay.count() == 0
                 ? 1
                 : std::min(config.offload_batch, (config.staging_pages + 1) / 2)),
      delay_(config.offload_delay),
      on_event_(std::move(on_event)),
      slots_(config.staging_pages),
      counters_(config.tiers.size()),
      pool_apart_(config.pool_apart),
      fresh_(config.pool_apart ? num_pages : 0) {
  for (const auto& t : tiers_) names_.emplace_back(t->name());
  for (std::uint32_t d = 0; d < shards_; ++d) {
    masks_.push_back(config.fingerprint(params, d).shard_mask());
    bytes_.emplace_back(params, arenas[d], num_pages);
  }
  free_slots_.reserve(slots_.size());
  staged_.reserve(slots_.size());
  const std::size_t slot_bytes = bytes_.front().page_bytes() * shards_;
  const std::size_t stride = round_up(slot_bytes, kSlotAlign);
  staging_ = StagingMemory(static_cast<std::byte*>(
      std::aligned_alloc(kStagingAlign, round_up(stride * slots_.size(), kStagingAlign))));
  if (staging_ == nullptr) throw std::bad_alloc();
  staging_size_ = stride * slots_.size();
  for (std::uint32_t i = 0; i < slots_.size(); ++i) {
    slots_[i].bytes = std::span(staging_.get() + std::size_t{i} * stride, slot_bytes);
    slots_[i].tokens.resize(page_size_);
    free_slots_.push_back(static_cast<std::uint32_t>(slots_.size()) - 1 - i);
  }
  stores_.reserve(slots_.size());
  evicted_.reserve(Tier::kEvictionReports);
  if (pool_apart_) {
    awaiting_.reserve(slots_.size());
    handed_.reserve(slots_.size());
    uploads_.reserve(num_pages);
  }
}

TierLink::~TierLink() {
  // What is staged goes down (a disk tier keeps it across restarts); no
  // event is emitted from here.
  if (!staged_.empty()) issue_staged();
  for (const StoreBatch& b : stores_)
    for (const TierTicket& t : b.tickets) t.wait();
  for (const LoadJob& j : jobs_)
    for (const TierTicket& t : j.tickets) t.wait();
}

PageKey TierLink::key(PageKey parent, std::span<const std::uint32_t> tokens) const noexcept {
  return page_key(parent, tokens, digest_);
}

void TierLink::set_kv_scales(const KVScales& scales) noexcept {
  // splitmix64's finaliser over the sum: a fixed, well-spread mix of the two.
  std::uint64_t z = fingerprint_digest_ + 0x9e3779b97f4a7c15ull * (scales.digest() | 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  digest_ = z ^ (z >> 31);
}

void TierLink::emit(PageEvent::Kind kind, const Slot& info, std::size_t tier) const noexcept {
  if (!on_event_) return;
  on_event_(PageEvent{kind, info.page, info.hash, info.parent_hash, info.extra_key, info.tokens,
                      names_[tier], info.key});
}

void TierLink::stage(const prefix::PrefixStore& store, std::uint32_t page) noexcept {
  if (!level_enabled(0)) return;
  const bool reused = store.reused(page);
  if (admission_ == OffloadAdmission::reused && !reused) return;
  const PageKey key = store.key_of(page);
  // A page that was attached again may have come back from the tier, which
  // then still holds it: ask now and skip the copy. Another the tier skips
  // itself (StoreResult::present), if it holds it at all.
  if (reused && held_by_first(key)) return;
  if (free_slots_.empty()) reap(true);
  if (free_slots_.empty()) {
    count_dropped(1);
    return;
  }
  const std::uint32_t i = free_slots_.back();
  free_slots_.pop_back();
  Slot& s = slots_[i];
  // A pool apart holds the page's bytes, unless a load left them here fresher.
  const bool from_host = !pool_apart_ || fresh_[page] != 0;
  if (from_host) pack_shards(page, s.bytes);
  const auto toks = store.stored_tokens(page);
  std::copy(toks.begin(), toks.end(), s.tokens.begin());
  s.page = page;
  s.hash = store.hash_of(page);
  s.parent_hash = store.parent_hash_of(page);
  s.extra_key = store.extra_key_of(page);
  s.key = key;
  if (!from_host) {
    awaiting_.push_back(i);  // capacity: every slot
    return;
  }
  if (staged_.empty()) staged_since_ = coarse_now();
  staged_.push_back(i);  // capacity: every slot
}

bool TierLink::held_by_first(const PageKey& key) noexcept {
  try {
    return level_contains(0, std::span(&key, 1)).at(0) != 0;
  } catch (...) {
    return true;  // the tier could not answer: skip the write-back
  }
}

bool TierLink::due(bool force) const noexcept {
  if (staged_.empty()) return false;
  if (force || staged_.size() >= batch_) return true;
  return coarse_now() - staged_since_ >= delay_;
}

void TierLink::flush(bool force) noexcept {
  if (due(force)) issue_staged();
  reap(false);
  report_evictions();
}

void TierLink::issue_staged() noexcept {
  const std::size_t n = staged_.size();
  try {
    StoreBatch b;
    b.slots.assign(staged_.begin(), staged_.end());
    store_shards(b, n);
    stores_.push_back(std::move(b));  // capacity: one batch per slot
  } catch (...) {
    for (std::uint32_t i : staged_) free_slots_.push_back(i);
    count_dropped(n);
    log_after_commit(LogLevel::warn, [&] {
      return "paged manager: tier '" + names_.front() + "' refused a write-back of " + str(n) +
             " pages";
    });
  }
  staged_.clear();
}

void TierLink::report_evictions() noexcept {
  if (!on_event_) return;
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    evicted_.clear();
    try {
      tiers_[t]->take_evicted(evicted_);
    } catch (...) {  // only a tier that overfills `out` (capacity: kEvictionReports)
    }
    const PageKey mask = masks_[t % shards_];  // a shard's key back to the chain key
    for (const PageKey& key : evicted_) {
      on_event_(PageEvent{
          PageEvent::Kind::removed, num_pages_, 0, 0, 0, {}, names_[t], shard_key(key, mask)});
    }
  }
}

void TierLink::reap(bool all) noexcept {
  const auto done = [](const StoreBatch& b) {
    return std::all_of(b.tickets.begin(), b.tickets.end(),
                       [](const TierTicket& t) { return t.done(); });
  };
  const auto finish = [&](const StoreBatch& b) {
    for (std::size_t k = 0; k < b.slots.size(); ++k) {
      count_stored(b, k);
      free_slots_.push_back(b.slots[k]);  // capacity: every slot
    }
  };
  if (!all) {
    // The oldest first, up to the first in flight (batches finish about in
    // order): a call with nothing finished costs one look.
    std::size_t n = 0;
    while (n < stores_.size() && done(stores_[n])) finish(stores_[n++]);
    if (n > 0) stores_.erase(stores_.begin(), stores_.begin() + static_cast<std::ptrdiff_t>(n));
    return;
  }
  std::size_t kept = 0;  // an eviction out of slots looks at every batch
  for (std::size_t b = 0; b < stores_.size(); ++b) {
    if (!done(stores_[b])) {
      if (kept != b) stores_[kept] = std::move(stores_[b]);
      ++kept;
      continue;
    }
    finish(stores_[b]);
  }
  stores_.resize(kept);
}

std::vector<TierTicket> TierLink::tickets_in_flight() const {
  std::vector<TierTicket> out;
  for (const StoreBatch& b : stores_) out.insert(out.end(), b.tickets.begin(), b.tickets.end());
  for (const LoadJob& j : jobs_) out.insert(out.end(), j.tickets.begin(), j.tickets.end());
  return out;
}

void TierLink::fill(ManagerStats& stats) const {
  stats.pending_loads = pending_pages();
  stats.tiers.clear();
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    const TierStats s = tiers_[t]->stats();
    TierFigures f;
    f.name = names_[t];
    f.device = static_cast<std::uint32_t>(t % shards_);
    f.enabled = s.enabled;
    f.pages_held = s.pages_held;
    f.bytes_held = s.bytes_held;
    f.capacity_bytes = s.capacity_bytes;
    f.lookups = s.lookups;
    f.hits = s.hits;
    f.pages_stored = s.pages_stored;
    f.bytes_stored = s.bytes_stored;
    f.pages_loaded = s.pages_loaded;
    f.bytes_loaded = s.bytes_loaded;
    f.evictions = s.evictions;
    f.corrupt = s.corrupt;
    f.io_errors = s.io_errors;
    f.load_nanoseconds = s.load_nanoseconds;
    f.pages_offloaded = counters_[t].pages_offloaded;
    f.offload_dropped = counters_[t].offload_dropped;
    f.pages_onboarded = counters_[t].pages_onboarded;
    f.load_failures = counters_[t].load_failures;
    stats.tiers.push_back(std::move(f));
  }
}

}  // namespace kvcache::manager
