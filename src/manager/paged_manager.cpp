#include "kvcache/paged_manager.h"

#include <new>

#include "core/checked_math.h"
#include "manager/paged_impl.h"

namespace kvcache {

using manager::seq_name;

PagedKVCacheManager::PagedKVCacheManager(const KVCacheParams& params, std::uint32_t total_num_pages,
                                         std::uint32_t max_batch_size, std::uint32_t max_seq_len,
                                         SeqIdPolicy seq_id_policy)
    : PagedKVCacheManager(params, total_num_pages, max_batch_size, max_seq_len, PrefixCacheConfig{},
                          seq_id_policy) {}

PagedKVCacheManager::PagedKVCacheManager(const KVCacheParams& params, std::uint32_t total_num_pages,
                                         std::uint32_t max_batch_size, std::uint32_t max_seq_len,
                                         PrefixCacheConfig config, SeqIdPolicy seq_id_policy)
    : KVCacheManager(params, max_batch_size, max_seq_len, seq_id_policy) {
  if (params.cache_strategy != CacheStrategy::paged) {
    throw InvalidArgument("PagedKVCacheManager needs cache_strategy paged, got " +
                          std::string(strategy_name(params.cache_strategy)));
  }
  if (total_num_pages == 0) throw InvalidArgument("total_num_pages is 0: it must be at least 1");
  if (total_num_pages == UINT32_MAX) {
    throw InvalidArgument("total_num_pages " + std::to_string(total_num_pages) +
                          " leaves no room for the sentinel; the limit is 4294967294");
  }
  const std::size_t bytes = estimated_memory_size(params, total_num_pages);  // past 64 bits first
  const std::size_t bookkeeping = estimated_bookkeeping_size(params, total_num_pages, config);
  manager::TierLink::check(params, config.tiers);
  const EvictionPolicyKind policy = config.policy;
  const std::size_t num_tiers = config.tiers.tiers.size();
  try {
    impl_ = std::make_unique<Impl>(params, total_num_pages, max_batch_size, max_seq_len,
                                   std::move(config));
    impl_->ids = manager::SeqIdAllocator(seq_id_policy);
  } catch (const std::bad_alloc&) {
    throw OutOfMemory("cannot allocate the bookkeeping of " + std::to_string(total_num_pages) +
                      " pages: " + std::to_string(bookkeeping) + " bytes (ref counts, free list" +
                      (params.enable_prefix_caching ? ", prefix index and eviction policy" : "") +
                      ")");
  }
  impl_->pool_bytes = bytes;
  kv_scales_changed();  // fp8: the tier keys take the (default) scales
  manager::log_after_commit(LogLevel::info, [&] {
    return manager::construction_line("paged manager", total_num_pages, "page", params.page_size,
                                      params, bytes) +
           ", " + std::to_string(bookkeeping) + " bytes of bookkeeping, prefix caching " +
           (params.enable_prefix_caching ? std::string(policy_name(policy)) : "off") +
           (num_tiers > 0 ? ", " + std::to_string(num_tiers) + " tiers below" : "");
  });
}

PagedKVCacheManager::~PagedKVCacheManager() = default;

void PagedKVCacheManager::kv_scales_changed() noexcept {
  std::lock_guard lock(impl_->mu);
  if (impl_->tiered() && is_fp8(params().dtype)) impl_->link->set_kv_scales(kv_scales());
}

std::size_t PagedKVCacheManager::estimated_memory_size(const KVCacheParams& params,
                                                       std::uint32_t total_num_pages) {
  params.validate();
  return detail::checked_product("estimated_memory_size",
                                 {{"total_num_pages", total_num_pages},
                                  {"page_size", params.page_size},
                                  {"bytes_per_token", params.bytes_per_token()}});
}

std::size_t PagedKVCacheManager::estimated_bookkeeping_size(const KVCacheParams& params,
                                                            std::uint32_t total_num_pages,
                                                            const PrefixCacheConfig& config) {
  params.validate();
  const std::uint64_t n = total_num_pages;
  std::uint64_t bytes = n * 2 * sizeof(std::uint32_t);  // ref counts, free list
  if (params.enable_prefix_caching) {
    (void)detail::checked_product(
        "stored token ids", {{"total_num_pages", n}, {"page_size", params.page_size}, {"4", 4}});
    bytes += prefix::PrefixStore::bytes_for(total_num_pages, params.page_size, config);
    bytes += manager::TierLink::staging_bytes(params, config.tiers);
    bytes += manager::TierLink::apart_bytes(total_num_pages, config.tiers);
  }
  return bytes;
}

std::uint32_t PagedKVCacheManager::pages_for_memory(const KVCacheParams& params,
                                                    std::size_t memory_bytes) {
  params.validate();
  if (params.page_size == 0)
    throw InvalidArgument("page_size is 0: pages_for_memory needs a page size");
  const std::size_t page_bytes = std::size_t{params.page_size} * params.bytes_per_token();
  return static_cast<std::uint32_t>(
      std::min<std::size_t>(memory_bytes / page_bytes, UINT32_MAX - 1));
}

std::vector<SeqId> PagedKVCacheManager::claim(std::uint32_t n) {
  std::lock_guard lock(impl_->mu);
  manager::check_claim(n, static_cast<std::uint32_t>(impl_->seqs.size()), impl_->max_batch_size);
  std::vector<SeqId> ids;
  ids.reserve(n);
  impl_->seqs.reserve(impl_->seqs.size() + n);
  impl_->ids.reserve(n);
  const SeqId mark = impl_->ids.next_id();
  try {
    for (std::uint32_t i = 0; i < n; ++i) {
      ids.push_back(impl_->ids.take());                   // capacity reserved above
      impl_->seqs.emplace(ids.back(), Impl::Sequence{});  // may throw bad_alloc
    }
  } catch (...) {  // all or nothing: undo the ids already handed out
    for (SeqId id : ids) impl_->seqs.erase(id);
    impl_->ids.rollback(ids, mark);
    throw;
  }
  impl_->counters.claimed += n;
  return ids;
}

void PagedKVCacheManager::fetch_into(KVCacheBatch& out, std::span<const SeqId> seqs,
                                     std::span<const std::uint32_t> num_new_tokens,
                                     std::uint32_t num_steps) {
  Impl& im = *impl_;
  std::unique_lock lock(im.mu);
  manager::check_batch_spans(seqs, num_new_tokens.size(), "num_new_tokens");
  manager::check_num_steps(num_steps);
  const std::uint32_t ps = im.params.page_size;
  ++im.epoch;
  std::uint64_t pages_needed = 0, copies_needed = 0;
  std::uint32_t stride = 1;
  im.shared_writes.clear();
  im.mark_all(seqs);
  im.check_loaded(seqs, "fetch");
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    Impl::Sequence& s = im.seqs.find(seqs[b])->second;
    const std::uint32_t target =
        manager::reserved_target(seqs[b], s.length, num_new_tokens[b], num_steps, im.max_seq_len);
    const std::uint32_t want = pages_for(target, ps);
    if (want > s.pages.size()) pages_needed += want - s.pages.size();
    // Shared pages that this step writes into need a private copy.
    if (target > s.length) {
      const std::uint32_t last = std::min<std::uint32_t>((target - 1) / ps + 1, s.pages.size());
      for (std::uint32_t j = s.length / ps; j < last; ++j)
        if (im.pool.ref_count(s.pages[j]) > 1) im.shared_writes.push_back(s.pages[j]);
    }
    stride = std::max<std::uint32_t>(stride, std::max<std::uint32_t>(want, s.pages.size()));
  }
  copies_needed = im.count_copies();
  if (pages_needed + copies_needed > im.available()) {
    throw OutOfPages("need " + str(pages_needed + copies_needed) + " pages for this batch of " +
                     str(seqs.size()) + " sequences (" + str(copies_needed) + " copy-on-write), " +
                     str(im.pool.num_free()) + " free + " + str(im.num_evictable()) +
                     " evictable of " + str(im.pool.num_blocks()));
  }
  const std::uint64_t evicted_before = im.caching() ? im.store->counters().evictions : 0;
  // Grow page-table capacity and the output buffers first: the only steps
  // that can throw (bad_alloc) happen before any state changes.
  out.reserve(seqs.size(), seqs.size() * std::size_t{stride}, im.arenas.size(), copies_needed,
              im.offload_bound(pages_needed + copies_needed), im.upload_bound());
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    Impl::Sequence& s = im.seqs.find(seqs[b])->second;
    s.pages.reserve(pages_for(std::uint64_t{s.length} + num_new_tokens[b] + (num_steps - 1), ps));
  }
  KVCacheBatch& next = out;  // buffers reserved above; nothing below allocates
  next.seq_ids_.assign(seqs.begin(), seqs.end());
  next.cache_lengths_.resize(seqs.size());
  next.reserved_lengths_.resize(seqs.size());
  next.lookup_table_.assign(seqs.size() * std::size_t{stride}, im.pool.num_blocks());
  next.device_blocks_.clear();
  for (auto& arena : im.arenas) next.device_blocks_.push_back(arena.data());
  next.head_scales_ = device_scales();
  next.block_copies_.clear();
  // Commit.
  next.params_ = im.params;
  next.lookup_stride_ = stride;
  next.num_blocks_ = im.pool.num_blocks();
  next.page_size_ = ps;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    Impl::Sequence& s = im.seqs.find(seqs[b])->second;
    s.reserved = s.length + num_new_tokens[b] + (num_steps - 1);
    if (s.reserved > s.length) {
      const std::uint32_t last = std::min<std::uint32_t>((s.reserved - 1) / ps + 1, s.pages.size());
      for (std::uint32_t j = s.length / ps; j < last; ++j) {
        const std::uint32_t page = s.pages[j];
        if (im.pool.ref_count(page) > 1) {  // copy-on-write
          const std::uint32_t copy = im.take_page();
          im.copy_page(page, copy);
          next.block_copies_.push_back({page, copy});
          im.pool.unref(page);  // still >= 1: another sequence holds it
          s.pages[j] = copy;
        } else if (im.published(page)) {
          im.store->unpublish(page);  // about to change: leave the index
        }
      }
    }
    while (s.pages.size() < pages_for(s.reserved, ps)) s.pages.push_back(im.take_page());
    next.cache_lengths_[b] = s.length;
    next.reserved_lengths_[b] = s.reserved;
    std::copy(s.pages.begin(), s.pages.end(), next.lookup_table_.begin() + b * stride);
  }
  next.recompute_maxima(num_new_tokens);
  ++im.counters.fetches;
  im.flush_offloads();
  im.hand_out(next);
  const std::uint64_t evicted = im.caching() ? im.store->counters().evictions - evicted_before : 0;
  if ((evicted > 0 || copies_needed > 0) && log_enabled(LogLevel::debug)) {
    const std::uint32_t free_now = im.pool.num_free(), cached_now = im.num_evictable();
    lock.unlock();  // the sink runs outside the manager's lock
    manager::log_after_commit(LogLevel::debug, [&] {
      return "paged manager: fetch (batch of " + str(seqs.size()) + ") evicted " + str(evicted) +
             " cached pages, made " + str(copies_needed) + " copy-on-write copies; " +
             str(free_now) + " free, " + str(cached_now) + " cached";
    });
  }
}

void PagedKVCacheManager::step(std::span<const SeqId> seqs,
                               std::span<const std::uint32_t> valid_lengths) {
  step_ids_unknown(seqs, valid_lengths, /*on_purpose=*/false);
}

void PagedKVCacheManager::step_without_token_ids(std::span<const SeqId> seqs,
                                                 std::span<const std::uint32_t> valid_lengths) {
  step_ids_unknown(seqs, valid_lengths, /*on_purpose=*/true);
}

void PagedKVCacheManager::step_ids_unknown(std::span<const SeqId> seqs,
                                           std::span<const std::uint32_t> valid_lengths,
                                           bool on_purpose) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  manager::check_batch_spans(seqs, valid_lengths.size(), "valid_lengths");
  ++im.epoch;
  im.mark_all(seqs);
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const Impl::Sequence& s = im.seqs.find(seqs[b])->second;
    manager::check_step_room(seqs[b], s.length, valid_lengths[b], s.reserved);
    if (im.caching() && !on_purpose && valid_lengths[b] > 0 && s.tokens_known) {
      throw InvalidArgument(seq_name(seqs[b]) +
                            ": step without token_ids on a prefix-caching manager would stop "
                            "publishing its pages; pass the token ids (step(seqs, "
                            "valid_lengths, token_ids)) or call step_without_token_ids");
    }
  }
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    Impl::Sequence& s = im.seqs.find(seqs[b])->second;
    s.length += valid_lengths[b];
    if (im.caching() && valid_lengths[b] > 0 && s.tokens_known) {
      s.tokens_known = false;  // ids unknown from here on: nothing more to publish
      s.tokens.clear();
    }
  }
  im.counters.count_step(valid_lengths);
}

void PagedKVCacheManager::step(std::span<const SeqId> seqs,
                               std::span<const std::uint32_t> valid_lengths,
                               std::span<const std::uint32_t> token_ids) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  manager::check_batch_spans(seqs, valid_lengths.size(), "valid_lengths");
  std::uint64_t total = 0;
  for (std::uint32_t v : valid_lengths) total += v;
  if (total != token_ids.size()) {
    throw InvalidArgument("token_ids has " + str(token_ids.size()) +
                          " entries but valid_lengths sum to " + str(total));
  }
  ++im.epoch;
  im.mark_all(seqs);
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const Impl::Sequence& s = im.seqs.find(seqs[b])->second;
    manager::check_step_room(seqs[b], s.length, valid_lengths[b], s.reserved);
  }
  if (im.caching()) {  // grow vectors first (strong guarantee), doubling: a decode
    // step appending one token must not reallocate every time
    auto grow = [](auto& v, std::size_t n) {
      if (n > v.capacity()) v.reserve(std::max(n, 2 * v.capacity()));
    };
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      Impl::Sequence& s = im.seqs.find(seqs[b])->second;
      if (!s.tokens_known) continue;
      grow(s.tokens, s.length + valid_lengths[b]);
      grow(s.hashes, (s.length + valid_lengths[b]) / im.params.page_size);
      if (im.tiered()) grow(s.keys, (s.length + valid_lengths[b]) / im.params.page_size);
    }
  }
  std::size_t offset = 0;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    Impl::Sequence& s = im.seqs.find(seqs[b])->second;
    if (im.caching() && s.tokens_known) {
      s.tokens.insert(s.tokens.end(), token_ids.begin() + offset,
                      token_ids.begin() + offset + valid_lengths[b]);
    }
    offset += valid_lengths[b];
    s.length += valid_lengths[b];
    im.publish_full_pages(s);
  }
  im.counters.count_step(valid_lengths);
}

void PagedKVCacheManager::release(SeqId seq) { release(seq, ReuseHint::unknown); }

void PagedKVCacheManager::release(SeqId seq, ReuseHint hint) {
  if (hint != ReuseHint::unknown && hint != ReuseHint::unlikely && hint != ReuseHint::likely) {
    throw InvalidArgument("reuse hint " + str(static_cast<unsigned>(hint)) +
                          " is not a ReuseHint (0 unknown, 1 unlikely, 2 likely)");
  }
  std::lock_guard lock(impl_->mu);
  auto it = impl_->seqs.find(seq);
  if (it == impl_->seqs.end()) manager::throw_unknown(seq);
  // Release the tail first: the free list hands the head out last and LRU
  // evicts the tail before the head.
  for (auto p = it->second.pages.rbegin(); p != it->second.pages.rend(); ++p)
    impl_->drop_ref(*p, hint);
  if (it->second.loading) impl_->leave_jobs(seq, it->second);  // the jobs keep their pages
  impl_->seqs.erase(it);
  impl_->ids.release(seq);
  ++impl_->counters.released;
}

std::uint32_t PagedKVCacheManager::match_prefix(SeqId seq,
                                                std::span<const std::uint32_t> prompt_tokens,
                                                std::uint64_t extra_key) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  im.require_caching("match_prefix");
  Impl::Sequence& s = im.find(seq);
  if (s.length != 0 || !s.pages.empty() || !s.tokens_known) {
    throw InvalidArgument(seq_name(seq) + " is not freshly claimed (cache length " + str(s.length) +
                          ", " + str(s.pages.size()) +
                          " pages): match_prefix needs a new sequence");
  }
  const std::uint32_t ps = im.params.page_size;
  const std::uint64_t usable =
      std::min<std::uint64_t>(prompt_tokens.empty() ? 0 : prompt_tokens.size() - 1, im.max_seq_len);
  im.scratch.clear();
  im.scratch.reserve(usable / ps);
  const std::uint32_t max_pages = static_cast<std::uint32_t>(usable / ps);
  im.store->walk(prompt_tokens, extra_key, max_pages, im.scratch);
  const std::uint32_t n = static_cast<std::uint32_t>(im.scratch.size());
  Impl::TierPlan plan;
  if (im.tiered()) plan = im.plan_tiers(prompt_tokens, extra_key, max_pages);
  const std::uint32_t loads = static_cast<std::uint32_t>(plan.hashes.size());
  const std::uint32_t reused = (n + loads) * ps;
  s.pages.reserve(n + loads);
  s.hashes.reserve(n + loads);
  if (im.tiered()) s.keys.reserve(n + loads);
  s.tokens.reserve(prompt_tokens.size());
  // Commit.
  for (const prefix::PrefixStore::Match& m : im.scratch) {
    im.store->attach(m.page);
    s.pages.push_back(m.page);
    s.hashes.push_back(m.hash);
    if (im.tiered()) s.keys.push_back(im.store->key_of(m.page));
  }
  if (loads > 0) im.commit_tiers(seq, s, plan);
  s.tokens.assign(prompt_tokens.begin(), prompt_tokens.begin() + reused);
  s.length = s.reserved = reused;
  s.extra_key = extra_key;
  s.extends_cached = n + loads > 0;
  ++im.metrics.match_calls;
  im.metrics.prompt_tokens += prompt_tokens.size();
  im.metrics.reused_tokens += n * ps;  // loaded pages count when they arrive
  im.flush_offloads();
  return reused;
}

SeqId PagedKVCacheManager::fork(SeqId seq) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  const Impl::Sequence& parent = im.find(seq);
  im.check_loaded(std::span(&seq, 1), "fork");
  manager::check_claim(1, static_cast<std::uint32_t>(im.seqs.size()), im.max_batch_size);
  Impl::Sequence child;
  const std::uint32_t shared = pages_for(parent.length, im.params.page_size);
  child.pages.assign(parent.pages.begin(), parent.pages.begin() + shared);
  child.length = child.reserved = parent.length;
  child.tokens = parent.tokens;
  child.hashes = parent.hashes;
  child.keys = parent.keys;
  child.tokens_known = parent.tokens_known;
  child.extra_key = parent.extra_key;
  child.extends_cached = parent.extends_cached;
  im.ids.reserve(1);  // may throw: nothing changed yet
  const SeqId mark = im.ids.next_id();
  const SeqId id = im.ids.take();
  try {
    im.seqs.emplace(id, std::move(child));  // may throw
  } catch (...) {
    im.ids.rollback(std::span(&id, 1), mark);
    throw;
  }
  for (std::uint32_t page : im.seqs.find(id)->second.pages) im.pool.retain(page);
  ++im.counters.forked;
  return id;
}

void PagedKVCacheManager::truncate(SeqId seq, std::uint32_t new_length) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  Impl::Sequence& s = im.find(seq);
  im.check_loaded(std::span(&seq, 1), "truncate");
  if (new_length > s.length) {
    throw InvalidArgument("truncate " + seq_name(seq) + " to " + str(new_length) +
                          " tokens: it only has " + str(s.length));
  }
  const std::uint32_t ps = im.params.page_size;
  const std::uint32_t keep = pages_for(new_length, ps);
  while (s.pages.size() > keep) {
    im.drop_ref(s.pages.back());
    s.pages.pop_back();
  }
  const std::uint32_t full = new_length / ps;
  if (new_length % ps != 0) {
    const std::uint32_t page = s.pages[full];
    if (im.published(page) && im.pool.ref_count(page) == 1) im.store->unpublish(page);
  }
  if (s.hashes.size() > full) s.hashes.resize(full);
  if (s.keys.size() > full) s.keys.resize(full);
  if (s.tokens.size() > new_length) s.tokens.resize(new_length);
  s.length = s.reserved = new_length;
}

std::uint32_t PagedKVCacheManager::pin_prefix(std::span<const std::uint32_t> tokens,
                                              std::uint32_t priority, std::uint64_t extra_key) {
  Impl& im = *impl_;
  std::lock_guard lock(im.mu);
  im.require_caching("pin_prefix");
  im.scratch.clear();
  im.scratch.reserve(tokens.size() / im.params.page_size);
  im.store->walk(tokens, extra_key, static_cast<std::uint32_t>(tokens.size() / im.params.page_size),
                 im.scratch);
  for (const prefix::PrefixStore::Match& m : im.scratch) im.store->set_pin(m.page, priority);
  return static_cast<std::uint32_t>(im.scratch.size()) * im.params.page_size;
}

}  // namespace kvcache
