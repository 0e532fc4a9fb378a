// manager/paged_impl.h — the paged manager's state (internal), shared by
// its lifecycle (paged_manager.cpp) and its tiers (paged_tiers.cpp).
// Everything here runs under Impl::mu.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvcache/error.h"
#include "kvcache/paged_manager.h"
#include "manager/checks.h"
#include "manager/observability.h"
#include "manager/seq_ids.h"
#include "manager/tier_link.h"
#include "memory/block_pool.h"
#include "memory/host_arena.h"
#include "prefix/prefix_store.h"

namespace kvcache {

namespace paged_detail {
inline std::uint32_t pages_for(std::uint64_t tokens, std::uint32_t page_size) {
  return static_cast<std::uint32_t>((tokens + page_size - 1) / page_size);
}
inline std::string str(std::uint64_t v) { return std::to_string(v); }
}  // namespace paged_detail
using paged_detail::pages_for;
using paged_detail::str;

struct PagedKVCacheManager::Impl {
  struct Sequence {
    std::vector<std::uint32_t> pages;  // page table: page j holds tokens [j*ps, (j+1)*ps)
    std::uint32_t length = 0;
    std::uint32_t reserved = 0;
    std::uint64_t mark = 0;
    // Prefix caching only.
    std::vector<std::uint32_t> tokens;  // committed token ids (while tokens_known)
    std::vector<std::uint64_t> hashes;  // chain hash of each full page hashed so far
    bool tokens_known = true;
    std::uint64_t extra_key = 0;
    bool extends_cached = false;  // match_prefix reused at least one page
    // Tiers only.
    std::vector<PageKey> keys;  // tier key of each page in `hashes`
    bool loading = false;       // pages of it are being loaded from a tier (LoadJob)
    // While loading: pages [pending_first, pages.size()) are pages of load
    // jobs (pending[q] the job page of page pending_first + q, its own job's
    // or another's it attached), waits the ids of those jobs, each once.
    std::uint32_t pending_first = 0;
    std::vector<manager::LoadRef> pending;
    std::vector<std::uint64_t> waits;
  };

  Impl(const KVCacheParams& p, std::uint32_t num_pages, std::uint32_t max_batch,
       std::uint32_t max_seq, PrefixCacheConfig cfg)
      : params(p), max_batch_size(max_batch), max_seq_len(max_seq), pool(num_pages) {
    page_bytes = std::size_t{p.page_size} * p.bytes_per_token_per_device();
    const std::size_t per_device = estimated_memory_size(p, num_pages) / p.n_devices;
    for (std::uint32_t d = 0; d < p.n_devices; ++d) arenas.emplace_back(per_device);
    if (p.enable_prefix_caching) {
      TierConfig tiers = std::move(cfg.tiers);
      auto on_event = cfg.on_event;
      store = std::make_unique<prefix::PrefixStore>(pool, p.page_size, std::move(cfg));
      if (!tiers.tiers.empty()) {
        std::vector<std::byte*> devices;
        for (auto& arena : arenas) devices.push_back(arena.data());
        link =
            std::make_unique<manager::TierLink>(p, num_pages, devices, tiers, std::move(on_event));
        store->set_evict_hook([this](std::uint32_t page) { link->stage(*store, page); });
      }
    }
  }
  ~Impl() { link.reset(); }  // waits for the tiers' tickets before the pool goes

  // ---- lookups ---------------------------------------------------------------
  void mark_all(std::span<const SeqId> ids) { manager::mark_batch(seqs, ids, epoch); }
  Sequence& find(SeqId id) { return manager::find_sequence(seqs, id); }
  const Sequence& find(SeqId id) const { return manager::find_sequence(seqs, id); }

  bool caching() const { return store != nullptr; }
  bool tiered() const { return link != nullptr; }
  std::uint32_t num_pages() const { return pool.num_blocks(); }
  std::uint32_t num_evictable() const { return caching() ? store->num_evictable() : 0; }
  std::uint32_t available() const { return pool.num_free() + num_evictable(); }
  bool published(std::uint32_t page) const { return caching() && store->published(page); }

  void require_caching(const char* what) const {
    if (!caching()) {
      throw InvalidArgument(std::string(what) +
                            " needs params.enable_prefix_caching = true (it is false)");
    }
  }

  // A page with ref count 1: from the free list, else evicted. Precondition: available() > 0.
  std::uint32_t take_page() {
    if (!caching()) return pool.allocate();
    const std::uint32_t page = store->take_page();
    if (tiered()) link->taken(page);  // a pool apart: an upload of it is void
    return page;
  }
  // Drops one reference; a published page at ref 0 becomes evictable.
  void drop_ref(std::uint32_t page, ReuseHint hint = ReuseHint::unknown) {
    if (caching()) {
      store->drop_ref(page, hint);
    } else {
      pool.release(page);
    }
  }

  // Copies every layer's K and V of page `from` into page `to`, on every
  // device: one run of page_bytes (interleaved) or one run per layer and K/V
  // (per_layer, each its own array of pages).
  void copy_page(std::uint32_t from, std::uint32_t to) {
    const bool per_layer = params.pool_arrangement == PoolArrangement::per_layer;
    const std::size_t runs = per_layer ? 2 * std::size_t{params.num_layers} : 1;
    const std::size_t run_bytes = page_bytes / runs;
    const std::size_t pitch = per_layer ? run_bytes * num_pages() : page_bytes;
    for (auto& arena : arenas) {
      for (std::size_t r = 0; r < runs; ++r) {
        std::byte* base = arena.data() + r * pitch;
        std::memcpy(base + std::size_t{to} * run_bytes, base + std::size_t{from} * run_bytes,
                    run_bytes);
      }
    }
    ++metrics.cow_copies;
  }

  // Copy-on-write copies a batch needs, from the shared pages its entries
  // write into (shared_writes, one item per writer, cleared here): the
  // writers of a page with ref count r copy in turn until one holds it
  // alone, so k writers make min(k, r - 1) copies (a fork pair fetched
  // together: one copy, not two).
  std::uint64_t count_copies() {
    std::sort(shared_writes.begin(), shared_writes.end());
    std::uint64_t copies = 0;
    for (std::size_t i = 0; i < shared_writes.size();) {
      std::size_t k = i;
      while (k < shared_writes.size() && shared_writes[k] == shared_writes[i]) ++k;
      copies += std::min<std::uint64_t>(k - i, pool.ref_count(shared_writes[i]) - 1);
      i = k;
    }
    shared_writes.clear();
    return copies;
  }

  // Hashes full page j of s (j == s.hashes.size()) and publishes it if its
  // parent is published under the chain's previous hash. Needs s.hashes capacity.
  void hash_and_publish(Sequence& s, std::uint32_t j) {
    const std::uint32_t ps = params.page_size;
    const std::uint64_t parent_hash = j == 0 ? 0 : s.hashes[j - 1];
    const auto toks = std::span<const std::uint32_t>(s.tokens).subspan(std::size_t{j} * ps, ps);
    const std::uint64_t h = store->hash(parent_hash, toks, s.extra_key);
    s.hashes.push_back(h);
    PageKey key;
    if (tiered()) {
      key = link->key(j == 0 ? manager::TierLink::root(s.extra_key) : s.keys[j - 1], toks);
      s.keys.push_back(key);  // capacity reserved with hashes
    }
    publish_page(s, j, s.extends_cached);
  }

  // Publishes full page j of s under s.hashes[j] if its parent is published
  // under the chain's previous hash; returns whether it is published now.
  bool publish_page(Sequence& s, std::uint32_t j, bool extension) {
    const std::uint32_t ps = params.page_size;
    const std::uint32_t page = s.pages[j];
    if (store->published(page)) return true;
    const std::uint64_t parent_hash = j == 0 ? 0 : s.hashes[j - 1];
    const std::uint32_t parent = j == 0 ? num_pages() : s.pages[j - 1];
    if (j > 0 && !(store->published(parent) && store->hash_of(parent) == parent_hash)) return false;
    const auto toks = std::span<const std::uint32_t>(s.tokens).subspan(std::size_t{j} * ps, ps);
    return store->publish(page, parent, s.hashes[j], parent_hash, s.extra_key, toks, extension,
                          tiered() ? s.keys[j] : PageKey{});
  }

  // Tiers: hands the pages evicted by this call to the first tier.
  void flush_offloads() noexcept {
    if (tiered()) link->flush();
  }
  // A pool apart: capacities for hand_out when a fetch evicts at most
  // `evictions` pages, and the hand-out itself (the waiting write-backs and
  // uploads into the batch; clears its lists otherwise).
  std::size_t offload_bound(std::uint64_t evictions) const {
    return tiered() ? link->offload_bound(evictions) : 0;
  }
  std::size_t upload_bound() const { return tiered() ? link->upload_bound() : 0; }
  void hand_out(KVCacheBatch& out) noexcept;
  // Throws InvalidArgument when a sequence of the batch is still loading.
  void check_loaded(std::span<const SeqId> ids, const char* what) const {
    if (!tiered() || link->jobs().empty()) return;  // no load in flight: none is loading
    for (SeqId id : ids) {
      if (seqs.find(id)->second.loading) {
        throw InvalidArgument(manager::seq_name(id) + " has pending loads from a tier: " + what +
                              " needs them finished (poll_loads / wait_loads)");
      }
    }
  }
  // Settles every job that is done, finishes each sequence whose jobs are
  // all settled (finish_loading; appends it to ready) and removes the
  // settled jobs no sequence waits for (dropping their refs).
  void finish_done_jobs(std::vector<SeqId>* ready) noexcept;
  // Publishes the loaded pages of a sequence whose jobs are settled,
  // truncates it at the first page that did not load, leaves its jobs'
  // waiters.
  void finish_loading(SeqId id, Sequence& s) noexcept;
  // A loading sequence leaves its jobs' waiters (release, finish_loading).
  void leave_jobs(SeqId id, Sequence& s) noexcept;
  // The tier part of match_prefix, after the device walk filled `scratch`:
  // plan_tiers finds the run of the prompt's next pages that jobs in flight
  // load already (attached) or the tiers hold (loaded by a job of its own),
  // up to max_pages in all, its own pages capped by the pages available, and
  // allocates what committing it needs (throws; changes nothing
  // observable); commit_tiers attaches the pages in flight, takes device
  // pages for its own and starts their loads.
  struct TierPlan {
    manager::LoadJob job;                // the pages no job loads yet
    std::vector<std::uint64_t> hashes;   // chain hash of each page of the run
    std::vector<PageKey> keys;           // tier key of each page of the run
    std::vector<manager::LoadRef> refs;  // each page's job page (own: invalid until commit)
    std::vector<std::uint64_t> waits;    // the jobs the run waits for (own job: 0)
  };
  TierPlan plan_tiers(std::span<const std::uint32_t> prompt, std::uint64_t extra_key,
                      std::uint32_t max_pages);
  void commit_tiers(SeqId id, Sequence& s, TierPlan& plan) noexcept;
  // check_invariants' tier part for one sequence: a key per hashed page, the
  // store's key on its published pages, a loading sequence's pages those of
  // the jobs it waits for (published only once loaded); and for the jobs:
  // each waiter a loading sequence that waits for it. Throws kvcache::Error.
  void check_tier_state(SeqId id, const Sequence& s) const;
  void check_jobs() const;

  void publish_full_pages(Sequence& s) {
    if (!caching() || !s.tokens_known) return;
    const std::uint32_t full = s.length / params.page_size;
    while (s.hashes.size() < full) hash_and_publish(s, static_cast<std::uint32_t>(s.hashes.size()));
  }

  KVCacheParams params;
  std::uint32_t max_batch_size;
  std::uint32_t max_seq_len;
  std::vector<memory::HostArena> arenas;
  std::size_t page_bytes = 0;  // per device
  memory::BlockPool pool;
  std::unordered_map<SeqId, Sequence> seqs;
  manager::SeqIdAllocator ids{SeqIdPolicy::never_reuse};  // set by the constructor
  std::uint64_t epoch = 0;
  std::unique_ptr<prefix::PrefixStore> store;  // prefix caching only
  std::unique_ptr<manager::TierLink> link;     // tiers only; destroyed before the arenas
  PrefixCacheMetrics metrics;  // the manager's counters (match calls, tokens, copies)
  manager::LifecycleCounters counters;
  std::uint64_t pool_bytes = 0;
  std::vector<prefix::PrefixStore::Match> scratch;
  std::vector<std::uint32_t> shared_writes;  // fetch's scratch: see count_copies
  mutable std::mutex mu;
};

}  // namespace kvcache
