// The paged manager and its tiers: onboarding in match_prefix, the loads'
// completion (poll_loads / wait_loads / wait_tiers), what a scheduler asks
// (has_pending_loads) and a pool apart's transfers (hand_out in fetch,
// complete_offloads). Write-back happens in the prefix store's evict hook
// (manager/tier_link.h).
#include <algorithm>
#include <vector>

#include "manager/paged_impl.h"

namespace kvcache {

namespace {

using manager::LoadJob;
using manager::LoadRef;
using manager::TierLink;

// refs[i]: the page of a job in flight that loads keys[i] (tier_of[i] then
// kInFlight), tried first as the next page of the previous key's job.
void find_in_flight(const TierLink& link, std::span<const PageKey> keys, std::span<LoadRef> refs,
                    std::span<std::uint8_t> tier_of) {
  LoadRef hint;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    refs[i] = link.attachable(keys[i], hint);
    if (refs[i].valid()) tier_of[i] = TierLink::kInFlight;
    hint = refs[i].valid() ? LoadRef{refs[i].job, refs[i].index + 1} : LoadRef{};
  }
}

// The leading pages of a run of `run` that take at most `budget` pages of
// their own (pages in flight take none); *own: how many they take.
std::size_t cap_run(std::span<const std::uint8_t> tier_of, std::size_t run, std::size_t budget,
                    std::size_t* own) {
  *own = 0;
  std::size_t i = 0;
  for (; i < run; ++i) {
    if (tier_of[i] == TierLink::kInFlight) continue;
    if (*own == budget) break;
    ++*own;
  }
  return i;
}

}  // namespace

PagedKVCacheManager::Impl::TierPlan PagedKVCacheManager::Impl::plan_tiers(
    std::span<const std::uint32_t> prompt, std::uint64_t extra_key, std::uint32_t max_pages) {
  TierPlan plan;
  const std::uint32_t n = static_cast<std::uint32_t>(scratch.size());
  if (n >= max_pages || link->num_tiers() == 0) return plan;
  const std::uint32_t ps = params.page_size;
  PageKey key = n == 0 ? TierLink::root(extra_key) : store->key_of(scratch.back().page);
  // The run starts at page n: when no job in flight loads it and no tier
  // holds it there is none, and the rest of the prompt is not hashed (a
  // request with nothing to load).
  const PageKey head = link->key(key, prompt.subspan(std::size_t{n} * ps, ps));
  if (!link->attachable(head).valid() && !link->any_holds(head)) return plan;
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
  // Pages a job in flight loads already are attached; the tiers are asked
  // about the others only.
  std::vector<std::uint8_t> tier_of(keys.size(), TierLink::kNoTier);
  plan.refs.assign(keys.size(), LoadRef{});
  find_in_flight(*link, keys, plan.refs, tier_of);
  // Pages of its own the run may take: free or evictable, less the matched
  // pages that attaching takes out of the evictable set.
  std::uint32_t attached_evictable = 0;
  for (const prefix::PrefixStore::Match& m : scratch)
    attached_evictable += pool.ref_count(m.page) == 0;
  const std::size_t held = link->locate(keys, tier_of);  // in flight or in a tier
  std::size_t own = 0;
  const std::size_t run = cap_run(tier_of, held, available() - attached_evictable, &own);
  if (run == 0) return TierPlan{};
  plan.hashes.resize(run);
  plan.keys.assign(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(run));
  plan.refs.resize(run);
  for (std::size_t q = 0; q < run; ++q) {
    const std::uint64_t id = plan.refs[q].job;
    if (id == 0 || std::find(plan.waits.begin(), plan.waits.end(), id) != plan.waits.end())
      continue;
    plan.waits.push_back(id);
    LoadJob& job = *link->job(id);
    job.waiters.reserve(job.waiters.size() + 1);  // commit_tiers adds this sequence
  }
  if (own == 0) return plan;
  plan.waits.push_back(0);  // its own job, whose id commit_tiers learns
  link->reserve_job(own);
  LoadJob& job = plan.job;
  link->prepare(job, own);
  for (std::size_t q = 0; q < run; ++q) {
    if (tier_of[q] == TierLink::kInFlight) continue;
    job.tier_of.push_back(tier_of[q]);  // capacities: prepare()
    job.keys.push_back(keys[q]);
    const auto toks = prompt.subspan((n + q) * ps, ps);
    job.tokens.insert(job.tokens.end(), toks.begin(), toks.end());
  }
  return plan;
}

void PagedKVCacheManager::Impl::commit_tiers(SeqId id, Sequence& s, TierPlan& plan) noexcept {
  LoadJob& job = plan.job;
  const std::uint64_t own_id = link->next_job_id();
  s.pending_first = static_cast<std::uint32_t>(s.pages.size());
  for (std::size_t i = 0; i < plan.hashes.size(); ++i) {
    LoadRef& ref = plan.refs[i];
    std::uint32_t page;
    if (ref.valid()) {  // a job in flight loads it: the sequence's reference
      page = link->job(ref.job)->pages[ref.index];
      pool.retain(page);
    } else {
      page = take_page();  // may evict: staged for write-back
      pool.retain(page);   // the job's reference
      ref = {own_id, static_cast<std::uint32_t>(job.pages.size())};
      job.pages.push_back(page);  // capacities: plan_tiers / match_prefix
    }
    s.pages.push_back(page);
    s.hashes.push_back(plan.hashes[i]);
    s.keys.push_back(plan.keys[i]);
  }
  for (std::uint64_t& w : plan.waits) {
    if (w == 0) {
      w = own_id;
    } else {
      link->job(w)->waiters.push_back(id);  // capacity: plan_tiers
    }
  }
  s.pending = std::move(plan.refs);
  s.waits = std::move(plan.waits);
  s.loading = true;
  if (job.pages.empty()) return;
  job.waiters.push_back(id);  // capacity: prepare()
  link->add(std::move(job));
}

void PagedKVCacheManager::Impl::leave_jobs(SeqId id, Sequence& s) noexcept {
  for (std::uint64_t w : s.waits) std::erase(link->job(w)->waiters, id);
  s.waits.clear();
  s.pending.clear();
  s.loading = false;
}

void PagedKVCacheManager::Impl::finish_loading(SeqId id, Sequence& s) noexcept {
  const std::uint32_t ps = params.page_size;
  LoadJob* job = nullptr;
  auto job_of = [&](const LoadRef& r) -> LoadJob& {
    if (job == nullptr || job->id != r.job) job = link->job(r.job);
    return *job;
  };
  std::size_t loaded = 0;
  while (loaded < s.pending.size() &&
         job_of(s.pending[loaded]).result(s.pending[loaded].index) == LoadResult::loaded) {
    ++loaded;
  }
  for (std::size_t q = 0; q < loaded; ++q) {
    const std::uint32_t j = s.pending_first + static_cast<std::uint32_t>(q);
    const std::uint32_t page = s.pages[j];
    if (publish_page(s, j, true) && store->published(page)) store->mark_reused(page);
    LoadJob& from = job_of(s.pending[q]);
    if (from.kept[s.pending[q].index] == 0) {
      from.kept[s.pending[q].index] = 1;
      link->loaded(page);  // a pool apart: the caller's pool needs it
    }
  }
  for (std::uint64_t w : s.waits) link->job(w)->used = true;
  // Truncate at the first page that did not load: its sequence keeps the rest.
  const std::uint32_t keep = s.pending_first + static_cast<std::uint32_t>(loaded);
  leave_jobs(id, s);
  while (s.pages.size() > keep) {
    drop_ref(s.pages.back());
    s.pages.pop_back();
  }
  s.hashes.resize(keep);
  s.keys.resize(keep);
  s.tokens.resize(std::size_t{keep} * ps);
  s.length = s.reserved = keep * ps;
  metrics.reused_tokens += loaded * ps;
}

void PagedKVCacheManager::Impl::finish_done_jobs(std::vector<SeqId>* ready) noexcept {
  for (LoadJob& job : link->jobs())
    if (!job.settled && job.done()) link->settle(job);
  for (LoadJob& job : link->jobs()) {
    if (!job.settled) continue;
    for (std::size_t k = 0; k < job.waiters.size();) {
      const SeqId id = job.waiters[k];
      Sequence& s = seqs.find(id)->second;
      const bool all = std::all_of(s.waits.begin(), s.waits.end(),
                                   [&](std::uint64_t w) { return link->job(w)->settled; });
      if (!all) {
        ++k;
        continue;
      }
      finish_loading(id, s);                       // takes it out of job.waiters
      if (ready != nullptr) ready->push_back(id);  // capacity: every sequence
    }
  }
  for (std::size_t i = 0; i < link->jobs().size();) {
    const LoadJob& job = link->jobs()[i];
    if (!job.settled || !job.waiters.empty()) {
      ++i;
      continue;
    }
    if (job.used) link->count_results(job);
    for (std::uint32_t page : job.pages) drop_ref(page);  // the job's references
    link->erase_job(i);
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
  if (s.loading == s.pending.empty() || s.loading == s.waits.empty()) {
    throw Error(name + (s.loading ? " is loading without a load job"
                                  : " has load jobs but is not loading"));
  }
  if (!s.loading) return;
  if (s.pages.size() != s.pending_first + s.pending.size())
    throw Error(name + " page table differs from the pages its loads fill");
  for (std::uint64_t w : s.waits) {
    const manager::LoadJob* job = link->job(w);
    if (job == nullptr || std::count(s.waits.begin(), s.waits.end(), w) != 1 ||
        std::count(job->waiters.begin(), job->waiters.end(), id) != 1) {
      throw Error(name + " waits for load job " + str(w) + " but is not its waiter once");
    }
  }
  for (std::size_t q = 0; q < s.pending.size(); ++q) {
    const LoadRef r = s.pending[q];
    const manager::LoadJob* job = link->job(r.job);
    const std::uint32_t page = s.pages[s.pending_first + q];
    if (job == nullptr || std::find(s.waits.begin(), s.waits.end(), r.job) == s.waits.end() ||
        r.index >= job->size() || job->pages[r.index] != page) {
      throw Error(name + " page table differs from the pages its loads fill");
    }
    // Published once loaded: by another sequence that finished with it.
    if (store->published(page) && !(job->settled && job->result(r.index) == LoadResult::loaded))
      throw Error(name + " page " + str(page) + " is published while loading");
  }
}

void PagedKVCacheManager::Impl::check_jobs() const {
  link->check_jobs();
  for (const manager::LoadJob& job : link->jobs()) {
    for (SeqId w : job.waiters) {
      const auto it = seqs.find(w);
      if (it == seqs.end() || !it->second.loading ||
          std::count(it->second.waits.begin(), it->second.waits.end(), job.id) != 1) {
        throw Error("load job " + str(job.id) + " waiter " + manager::seq_name(w) +
                    " does not wait for it");
      }
    }
  }
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
  ready.reserve(im.seqs.size());
  im.finish_done_jobs(&ready);
  im.link->flush();
  return ready;
}

void PagedKVCacheManager::wait_loads(SeqId seq) {
  Impl& im = *impl_;
  std::unique_lock lock(im.mu);
  const Impl::Sequence& s = im.find(seq);  // UnknownSequence
  if (!im.tiered() || !s.loading) return;
  std::vector<TierTicket> tickets;  // every job it waits for, its own and those it attached
  for (std::uint64_t w : s.waits) {
    const manager::LoadJob& job = *im.link->job(w);
    tickets.insert(tickets.end(), job.tickets.begin(), job.tickets.end());
  }
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
