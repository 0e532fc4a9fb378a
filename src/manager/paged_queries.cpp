// The paged manager's readings: metrics, stats, lengths, snapshot and the
// invariant check (and reset_prefix_cache / reset_metrics beside them). The
// lifecycle is in paged_manager.cpp, the tiers in paged_tiers.cpp.
#include <string>

#include "kvcache/paged_manager.h"
#include "manager/paged_impl.h"

namespace kvcache {

using manager::seq_name;

void PagedKVCacheManager::reset_prefix_cache() {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  if (im.caching()) im.store->reset();
}

PrefixCacheMetrics PagedKVCacheManager::metrics() const {
  const Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  PrefixCacheMetrics m = im.metrics;
  if (im.caching()) {
    m.pages_published = im.store->counters().pages_published;
    m.evictions = im.store->counters().evictions;
  }
  m.pages_total = im.num_pages();
  m.pages_free = im.pool.num_free();
  m.pages_cached = im.num_evictable();
  m.pages_used = m.pages_total - m.pages_free - m.pages_cached;
  m.pages_pinned = im.caching() ? im.store->num_pinned() : 0;
  return m;
}

ManagerStats PagedKVCacheManager::stats() const {
  const Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  ManagerStats s;
  s.blocks_total = im.num_pages();
  s.blocks_free = im.pool.num_free();
  s.blocks_cached = im.num_evictable();
  s.blocks_used = s.blocks_total - s.blocks_free - s.blocks_cached;
  s.blocks_pinned = im.caching() ? im.store->num_pinned() : 0;
  s.page_size = im.params.page_size;
  s.active_sequences = static_cast<std::uint32_t>(im.seqs.size());
  s.pool_bytes = im.pool_bytes;
  im.counters.fill(s);
  s.prefix_lookups = im.metrics.match_calls;
  s.prefix_prompt_tokens = im.metrics.prompt_tokens;
  s.prefix_hit_tokens = im.metrics.reused_tokens;
  s.cow_copies = im.metrics.cow_copies;
  if (im.caching()) {
    s.blocks_published = im.store->counters().pages_published;
    s.evictions = im.store->counters().evictions;
  }
  if (im.tiered()) im.link->fill(s);
  return s;
}

void PagedKVCacheManager::reset_metrics() {
  std::lock_guard lock(impl_->mu);
  impl_->metrics = PrefixCacheMetrics{};
  if (impl_->caching()) impl_->store->reset_counters();
}

std::uint32_t PagedKVCacheManager::cache_length(SeqId seq) const {
  std::lock_guard lock(impl_->mu);
  return impl_->find(seq).length;
}

bool PagedKVCacheManager::contains(SeqId seq) const {
  std::lock_guard lock(impl_->mu);
  return impl_->seqs.count(seq) != 0;
}

std::uint32_t PagedKVCacheManager::num_active_sequences() const {
  std::lock_guard lock(impl_->mu);
  return static_cast<std::uint32_t>(impl_->seqs.size());
}

std::uint32_t PagedKVCacheManager::total_blocks() const { return impl_->pool.num_blocks(); }

std::uint32_t PagedKVCacheManager::free_blocks() const {
  std::lock_guard lock(impl_->mu);
  return impl_->pool.num_free();
}

std::vector<std::size_t> PagedKVCacheManager::block_shape(std::uint32_t n) const {
  return manager::block_shape_of(impl_->params, n, impl_->params.page_size);
}

ManagerSnapshot PagedKVCacheManager::snapshot() const {
  const Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  ManagerSnapshot snap;
  for (const auto& [id, s] : im.seqs) snap.sequences.push_back({id, s.length, s.reserved, s.pages});
  std::sort(snap.sequences.begin(), snap.sequences.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  snap.free_blocks = im.pool.free_list();
  std::sort(snap.free_blocks.begin(), snap.free_blocks.end());
  snap.ref_counts = im.pool.ref_counts();
  snap.next_seq_id = im.ids.next_id();
  if (im.caching()) im.store->snapshot(snap);
  return snap;
}

void PagedKVCacheManager::check_invariants() const {
  const Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  const std::uint32_t n = im.pool.num_blocks();
  const std::uint32_t ps = im.params.page_size;
  std::vector<std::uint32_t> refs(n, 0);
  if (im.seqs.size() > im.max_batch_size) throw Error("more sequences than max_batch_size");
  im.ids.check(im.seqs, im.max_batch_size);
  for (const auto& [id, s] : im.seqs) {
    if (s.length > s.reserved) {
      throw Error(seq_name(id) + " length " + str(s.length) + " exceeds reserved " +
                  str(s.reserved));
    }
    if (s.reserved > im.max_seq_len) throw Error(seq_name(id) + " reserved past max_seq_len");
    if (s.pages.size() < pages_for(s.reserved, ps)) {
      throw Error(seq_name(id) + " has " + str(s.pages.size()) + " pages for " + str(s.reserved) +
                  " reserved tokens");
    }
    for (std::uint32_t p : s.pages) {
      if (p >= n) throw Error(seq_name(id) + " holds page " + str(p) + " >= " + str(n));
      ++refs[p];
    }
    if (!im.caching()) continue;
    if (im.tiered()) im.check_tier_state(id, s);
    if (s.tokens_known && s.tokens.size() != s.length) {
      throw Error(seq_name(id) + " keeps " + str(s.tokens.size()) + " token ids for length " +
                  str(s.length));
    }
    if (s.hashes.size() > s.length / ps)
      throw Error(seq_name(id) + " hashed a page that is not full");
    for (std::size_t j = 0; j < s.pages.size(); ++j) {
      if (!im.store->published(s.pages[j])) continue;
      // A published page is a verified full page of the sequence, or (after
      // truncate) the partial page it writes next, shared and copied on write.
      const bool hashed = j < s.hashes.size() && s.hashes[j] == im.store->hash_of(s.pages[j]);
      const bool cut = j >= s.hashes.size() && j == s.length / ps && s.length % ps != 0;
      if (!hashed && !cut) {
        throw Error(seq_name(id) + " page " + str(j) + " (id " + str(s.pages[j]) +
                    ") is published but not a verified full page of it");
      }
      const std::size_t mine = hashed ? ps : s.length % ps;
      const auto stored = im.store->stored_tokens(s.pages[j]);
      if (s.tokens_known &&
          !std::equal(stored.begin(), stored.begin() + mine, s.tokens.begin() + j * ps)) {
        throw Error(seq_name(id) + " page " + str(j) + " stored tokens differ from its own");
      }
    }
  }
  if (im.tiered()) {  // a load holds its own reference on each of its pages
    im.link->check_slots();
    im.check_jobs();
    for (const manager::LoadJob& job : im.link->jobs())
      for (std::uint32_t p : job.pages) ++refs[p];
  }
  std::vector<std::uint8_t> free(n, 0);
  for (std::uint32_t p : im.pool.free_list()) {
    if (p >= n || free[p]++ != 0)
      throw Error("page " + str(p) + " is on the free list twice or out of range");
  }
  for (std::uint32_t p = 0; p < n; ++p) {
    if (refs[p] != im.pool.ref_count(p)) {
      throw Error("page " + str(p) + " has ref count " + str(im.pool.ref_count(p)) + " but " +
                  str(refs[p]) + " page-table references");
    }
    const bool pub = im.published(p);
    if (refs[p] == 0 && !pub && !free[p])
      throw Error("page " + str(p) + " is leaked: unreferenced, not free, not cached");
    if (refs[p] != 0 && free[p]) throw Error("page " + str(p) + " is referenced and free");
  }
  if (im.caching()) im.store->check(refs, free);
}

}  // namespace kvcache
