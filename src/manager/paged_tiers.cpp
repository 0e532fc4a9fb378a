// The paged manager and its tiers: onboarding in match_prefix, the loads'
// completion (poll_loads / wait_loads / wait_tiers), what a scheduler asks
// (has_pending_loads) and a pool apart's transfers (hand_out in fetch,
// complete_offloads). Write-back happens in the prefix store's evict hook
// (manager/tier_link.h).
#include <vector>

#include "manager/paged_impl.h"

namespace kvcache {

PagedKVCacheManager::Impl::TierPlan PagedKVCacheManager::Impl::plan_tiers(
    std::span<const std::uint32_t> prompt, std::uint64_t extra_key, std::uint32_t max_pages) {
  TierPlan plan;
  const std::uint32_t n = static_cast<std::uint32_t>(scratch.size());
  if (n >= max_pages || link->num_tiers() == 0) return plan;
  const std::uint32_t ps = params.page_size;
  PageKey key = n == 0 ? manager::TierLink::root(extra_key) : store->key_of(scratch.back().page);
  // The run starts at page n: when no tier holds it there is none, and the
  // rest of the prompt is not hashed (a request with nothing to load).
  if (!link->any_holds(link->key(key, prompt.subspan(std::size_t{n} * ps, ps)))) return plan;
  std::vector<PageKey> keys;
  keys.reserve(max_pages - n);
  plan.hashes.reserve(max_pages - n);
  std::uint64_t hash = n == 0 ? 0 : scratch.back().hash;
  for (std::uint32_t j = n; j < max_pages; ++j) {
    const auto toks = prompt.subspan(std::size_t{j} * ps, ps);
    hash = store->hash(hash, toks, extra_key);
    key = link->key(key, toks);
    plan.hashes.push_back(hash);
    keys.push_back(key);
  }
  std::vector<std::uint8_t> tier_of;
  std::size_t run = link->locate(keys, tier_of);
  // Pages the run may take: free or evictable, less the matched pages that
  // attaching takes out of the evictable set.
  std::uint32_t attached_evictable = 0;
  for (const prefix::PrefixStore::Match& m : scratch)
    attached_evictable += pool.ref_count(m.page) == 0;
  run = std::min<std::size_t>(run, available() - attached_evictable);
  if (run == 0) {
    plan.hashes.clear();
    return plan;
  }
  link->reserve_job();
  manager::LoadJob& job = plan.job;
  link->prepare(job, run);
  job.first = n;
  job.tier_of.assign(tier_of.begin(), tier_of.begin() + static_cast<std::ptrdiff_t>(run));
  job.keys.assign(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(run));
  job.tokens.assign(prompt.begin() + std::size_t{n} * ps, prompt.begin() + (n + run) * ps);
  plan.hashes.resize(run);
  return plan;
}

void PagedKVCacheManager::Impl::commit_tiers(SeqId id, Sequence& s, TierPlan& plan) noexcept {
  manager::LoadJob& job = plan.job;
  job.seq = id;
  for (std::size_t i = 0; i < plan.hashes.size(); ++i) {
    const std::uint32_t page = take_page();  // may evict: staged for write-back
    pool.retain(page);                       // the job's reference
    job.pages.push_back(page);               // capacities: plan_tiers / match_prefix
    s.pages.push_back(page);
    s.hashes.push_back(plan.hashes[i]);
    s.keys.push_back(job.keys[i]);
  }
  s.loading = true;
  link->add(std::move(job));
}

void PagedKVCacheManager::Impl::finish_job(std::size_t i) noexcept {
  manager::LoadJob& job = link->jobs()[i];
  const std::uint32_t ps = params.page_size;
  if (!job.orphaned) {
    Sequence& s = seqs.find(job.seq)->second;
    std::size_t loaded = 0;
    while (loaded < job.size() && job.result(loaded) == LoadResult::loaded) ++loaded;
    for (std::size_t q = 0; q < loaded; ++q) {
      const std::uint32_t page = job.pages[q];
      link->unpack_loaded(job, q);  // per_layer: from the job's staging, every device
      if (publish_page(s, job.first + static_cast<std::uint32_t>(q), true) &&
          store->published(page)) {
        store->mark_reused(page);
      }
      link->loaded(page);  // a pool apart: the caller's pool needs it
    }
    link->count_results(job, loaded);
    // Truncate at the first page that did not load: its sequence keeps the rest.
    const std::uint32_t keep = job.first + static_cast<std::uint32_t>(loaded);
    while (s.pages.size() > keep) {
      drop_ref(s.pages.back());
      s.pages.pop_back();
    }
    s.hashes.resize(keep);
    s.keys.resize(keep);
    s.tokens.resize(std::size_t{keep} * ps);
    s.length = s.reserved = keep * ps;
    s.loading = false;
    metrics.reused_tokens += loaded * ps;
  }
  for (std::uint32_t page : job.pages) drop_ref(page);  // the job's references
  link->erase_job(i);
}

void PagedKVCacheManager::Impl::finish_done_jobs(std::vector<SeqId>* ready) noexcept {
  for (std::size_t i = 0; i < link->jobs().size();) {
    const manager::LoadJob& job = link->jobs()[i];
    if (!job.done()) {
      ++i;
      continue;
    }
    if (ready != nullptr && !job.orphaned) ready->push_back(job.seq);  // capacity: every job
    finish_job(i);
  }
}

void PagedKVCacheManager::Impl::check_tier_state(SeqId id, const Sequence& s) const {
  const std::string name = manager::seq_name(id);
  if (s.keys.size() != s.hashes.size()) {
    throw Error(name + " keeps " + str(s.keys.size()) + " tier keys for " + str(s.hashes.size()) +
                " hashed pages");
  }
  for (std::size_t j = 0; j < s.hashes.size(); ++j) {
    const std::uint32_t page = s.pages[j];
    if (store->published(page) && store->hash_of(page) == s.hashes[j] &&
        !(store->key_of(page) == s.keys[j])) {
      throw Error(name + " page " + str(j) + " (id " + str(page) +
                  ") is published under another tier key");
    }
  }
  const manager::LoadJob* job = nullptr;
  for (const manager::LoadJob& j : link->jobs())
    if (!j.orphaned && j.seq == id) job = &j;
  if (s.loading != (job != nullptr)) {
    throw Error(name + (s.loading ? " is loading without a load job"
                                  : " has a load job but is not loading"));
  }
  if (job == nullptr) return;
  if (s.pages.size() != job->first + job->size() ||
      !std::equal(job->pages.begin(), job->pages.end(), s.pages.begin() + job->first)) {
    throw Error(name + " page table differs from the pages its loads fill");
  }
  for (std::uint32_t p : job->pages)
    if (store->published(p)) throw Error(name + " page " + str(p) + " is published while loading");
}

void PagedKVCacheManager::Impl::hand_out(KVCacheBatch& out) noexcept {
  if (!tiered()) {
    out.block_offloads_.clear();
    out.block_loads_.clear();
    out.offload_serial_ = 0;
    return;
  }
  out.offload_serial_ = link->hand_out(out.block_offloads_, out.block_loads_);
}

// ---- public -----------------------------------------------------------------------

std::size_t PagedKVCacheManager::complete_offloads(const KVCacheBatch& batch) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  if (batch.block_offloads_.empty()) return 0;
  if (!im.tiered() || batch.device_blocks_.empty() ||
      batch.device_blocks_.front() != im.arenas.front().data()) {
    throw InvalidArgument("complete_offloads: the batch (" + str(batch.block_offloads_.size()) +
                          " offloads) was not fetched from this manager");
  }
  return im.link->complete(batch.offload_serial_);
}

bool PagedKVCacheManager::has_tiers() const noexcept { return impl_->tiered(); }

std::span<std::byte> PagedKVCacheManager::tier_staging() const noexcept {
  return impl_->tiered() ? impl_->link->staging() : std::span<std::byte>();
}

bool PagedKVCacheManager::has_pending_loads(SeqId seq) const {
  std::lock_guard lock(impl_->mu);
  return impl_->find(seq).loading;
}

std::vector<SeqId> PagedKVCacheManager::poll_loads() {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  std::vector<SeqId> ready;
  if (!im.tiered()) return ready;
  ready.reserve(im.link->jobs().size());
  im.finish_done_jobs(&ready);
  im.link->flush();
  return ready;
}

void PagedKVCacheManager::wait_loads(SeqId seq) {
  Impl& im = *impl_;
  std::unique_lock lock(im.mu);
  (void)im.find(seq);  // UnknownSequence
  if (!im.tiered()) return;
  const manager::LoadJob* job = im.link->job_of(seq);
  if (job == nullptr) return;
  const std::vector<TierTicket> tickets = job->tickets;
  lock.unlock();  // the tiers' threads finish them; never wait under the lock
  for (const TierTicket& t : tickets) t.wait();
  lock.lock();
  im.finish_done_jobs(nullptr);
  im.link->flush();
}

void PagedKVCacheManager::wait_tiers() {
  Impl& im = *impl_;
  std::unique_lock lock(im.mu);
  if (!im.tiered()) return;
  im.link->flush(true);  // what is staged goes down now
  const std::vector<TierTicket> tickets = im.link->tickets_in_flight();
  lock.unlock();
  for (const TierTicket& t : tickets) t.wait();
  lock.lock();
  im.finish_done_jobs(nullptr);
  im.link->flush();
}

}  // namespace kvcache
