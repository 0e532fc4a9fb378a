#include "kvcache/paged_manager.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>

#include "manager/checks.h"
#include "memory/block_pool.h"
#include "memory/host_arena.h"

namespace kvcache {

using manager::seq_name;

namespace {
std::uint32_t pages_for(std::uint32_t tokens, std::uint32_t page_size) {
  return static_cast<std::uint32_t>((std::uint64_t{tokens} + page_size - 1) / page_size);
}
}  // namespace

struct PagedKVCacheManager::Impl {
  struct Sequence {
    std::vector<std::uint32_t> pages;  // page table: page j holds tokens [j*ps, (j+1)*ps)
    std::uint32_t length = 0;
    std::uint32_t reserved = 0;
    std::uint64_t mark = 0;
  };

  Impl(const KVCacheParams& p, std::uint32_t num_pages, std::uint32_t max_batch,
       std::uint32_t max_seq)
      : params(p), max_batch_size(max_batch), max_seq_len(max_seq), pool(num_pages) {
    const std::size_t per_device = estimated_memory_size(p, num_pages) / p.n_devices;
    for (std::uint32_t d = 0; d < p.n_devices; ++d) arenas.emplace_back(per_device);
  }

  Sequence& mark(SeqId id) {
    auto it = seqs.find(id);
    if (it == seqs.end()) manager::throw_unknown(id);
    if (it->second.mark == epoch) manager::throw_duplicate(id);
    it->second.mark = epoch;
    return it->second;
  }

  const Sequence& find(SeqId id) const {
    auto it = seqs.find(id);
    if (it == seqs.end()) manager::throw_unknown(id);
    return it->second;
  }

  KVCacheParams params;
  std::uint32_t max_batch_size;
  std::uint32_t max_seq_len;
  std::vector<memory::HostArena> arenas;
  memory::BlockPool pool;
  std::unordered_map<SeqId, Sequence> seqs;
  SeqId next_id = 0;
  std::uint64_t epoch = 0;
  mutable std::mutex mu;
};

PagedKVCacheManager::PagedKVCacheManager(const KVCacheParams& params,
                                         std::uint32_t total_num_pages,
                                         std::uint32_t max_batch_size, std::uint32_t max_seq_len)
    : KVCacheManager(params, max_batch_size, max_seq_len) {
  if (params.cache_strategy != CacheStrategy::paged) {
    throw InvalidArgument("PagedKVCacheManager needs cache_strategy paged, got " +
                          std::string(strategy_name(params.cache_strategy)));
  }
  if (total_num_pages == 0) throw InvalidArgument("total_num_pages is 0: it must be at least 1");
  if (total_num_pages == UINT32_MAX) {
    throw InvalidArgument("total_num_pages " + std::to_string(total_num_pages) +
                          " leaves no room for the sentinel; the limit is 4294967294");
  }
  impl_ = std::make_unique<Impl>(params, total_num_pages, max_batch_size, max_seq_len);
}

PagedKVCacheManager::~PagedKVCacheManager() = default;

std::size_t PagedKVCacheManager::estimated_memory_size(const KVCacheParams& params,
                                                       std::uint32_t total_num_pages) {
  params.validate();
  return std::size_t{total_num_pages} * params.page_size * params.bytes_per_token();
}

std::uint32_t PagedKVCacheManager::pages_for_memory(const KVCacheParams& params,
                                                    std::size_t memory_bytes) {
  params.validate();
  if (params.page_size == 0) throw InvalidArgument("page_size is 0: pages_for_memory needs a page size");
  const std::size_t page_bytes = std::size_t{params.page_size} * params.bytes_per_token();
  return static_cast<std::uint32_t>(std::min<std::size_t>(memory_bytes / page_bytes, UINT32_MAX - 1));
}

std::vector<SeqId> PagedKVCacheManager::claim(std::uint32_t n) {
  std::lock_guard lock(impl_->mu);
  manager::check_claim(n, static_cast<std::uint32_t>(impl_->seqs.size()), impl_->max_batch_size);
  std::vector<SeqId> ids;
  ids.reserve(n);
  impl_->seqs.reserve(impl_->seqs.size() + n);
  try {
    for (std::uint32_t i = 0; i < n; ++i) {
      impl_->seqs.emplace(impl_->next_id, Impl::Sequence{});  // may throw bad_alloc
      ids.push_back(impl_->next_id++);
    }
  } catch (...) {  // all or nothing: undo the ids already handed out
    for (SeqId id : ids) impl_->seqs.erase(id);
    impl_->next_id -= ids.size();
    throw;
  }
  return ids;
}

void PagedKVCacheManager::fetch_into(KVCacheBatch& out, std::span<const SeqId> seqs,
                                     std::span<const std::uint32_t> num_new_tokens,
                                     std::uint32_t num_steps) {
  std::lock_guard lock(impl_->mu);
  manager::check_batch_spans(seqs, num_new_tokens.size(), "num_new_tokens");
  manager::check_num_steps(num_steps);
  const std::uint32_t ps = impl_->params.page_size;
  ++impl_->epoch;
  std::uint64_t pages_needed = 0;
  std::uint32_t stride = 1;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    Impl::Sequence& s = impl_->mark(seqs[b]);
    const std::uint32_t target =
        manager::reserved_target(seqs[b], s.length, num_new_tokens[b], num_steps, impl_->max_seq_len);
    const std::uint32_t want = pages_for(target, ps);
    if (want > s.pages.size()) pages_needed += want - s.pages.size();
    stride = std::max<std::uint32_t>(stride, std::max<std::uint32_t>(want, s.pages.size()));
  }
  if (pages_needed > impl_->pool.num_free()) {
    throw OutOfPages("need " + std::to_string(pages_needed) + " pages for this batch of " +
                     std::to_string(seqs.size()) + " sequences, " +
                     std::to_string(impl_->pool.num_free()) + " free of " +
                     std::to_string(impl_->pool.num_blocks()));
  }
  // Grow page-table capacity and the output buffers first: the only steps
  // that can throw (bad_alloc) happen before any state changes.
  out.reserve(seqs.size(), seqs.size() * std::size_t{stride}, impl_->arenas.size());
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    Impl::Sequence& s = impl_->seqs.find(seqs[b])->second;
    s.pages.reserve(pages_for(s.length + num_new_tokens[b] + (num_steps - 1), ps));
  }
  KVCacheBatch& next = out;  // buffers reserved above; nothing below allocates
  next.seq_ids_.assign(seqs.begin(), seqs.end());
  next.cache_lengths_.resize(seqs.size());
  next.reserved_lengths_.resize(seqs.size());
  next.lookup_table_.assign(seqs.size() * std::size_t{stride}, impl_->pool.num_blocks());
  next.device_blocks_.clear();
  for (auto& arena : impl_->arenas) next.device_blocks_.push_back(arena.data());
  // Commit.
  next.params_ = impl_->params;
  next.lookup_stride_ = stride;
  next.num_blocks_ = impl_->pool.num_blocks();
  next.block_tokens_ = ps;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    Impl::Sequence& s = impl_->seqs.find(seqs[b])->second;
    s.reserved = s.length + num_new_tokens[b] + (num_steps - 1);
    while (s.pages.size() < pages_for(s.reserved, ps)) s.pages.push_back(impl_->pool.allocate());
    next.cache_lengths_[b] = s.length;
    next.reserved_lengths_[b] = s.reserved;
    std::copy(s.pages.begin(), s.pages.end(), next.lookup_table_.begin() + b * stride);
  }
  next.recompute_maxima(num_new_tokens);
}

void PagedKVCacheManager::step(std::span<const SeqId> seqs,
                               std::span<const std::uint32_t> valid_lengths) {
  std::lock_guard lock(impl_->mu);
  manager::check_batch_spans(seqs, valid_lengths.size(), "valid_lengths");
  ++impl_->epoch;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const Impl::Sequence& s = impl_->mark(seqs[b]);
    manager::check_step_room(seqs[b], s.length, valid_lengths[b], s.reserved);
  }
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    impl_->seqs.find(seqs[b])->second.length += valid_lengths[b];
  }
}

void PagedKVCacheManager::release(SeqId seq) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->seqs.find(seq);
  if (it == impl_->seqs.end()) manager::throw_unknown(seq);
  // Release the tail first so the free list hands the head out last.
  for (auto p = it->second.pages.rbegin(); p != it->second.pages.rend(); ++p) {
    impl_->pool.release(*p);
  }
  impl_->seqs.erase(it);
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
  const KVCacheParams& p = impl_->params;
  return {n, 2, p.num_layers, p.page_size, p.n_kv_heads_per_device(), p.head_dim};
}

ManagerSnapshot PagedKVCacheManager::snapshot() const {
  std::lock_guard lock(impl_->mu);
  ManagerSnapshot snap;
  for (const auto& [id, s] : impl_->seqs) snap.sequences.push_back({id, s.length, s.reserved, s.pages});
  std::sort(snap.sequences.begin(), snap.sequences.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  snap.free_blocks = impl_->pool.free_list();
  std::sort(snap.free_blocks.begin(), snap.free_blocks.end());
  snap.ref_counts = impl_->pool.ref_counts();
  snap.next_seq_id = impl_->next_id;
  return snap;
}

void PagedKVCacheManager::check_invariants() const {
  std::lock_guard lock(impl_->mu);
  const std::uint32_t n = impl_->pool.num_blocks();
  const std::uint32_t ps = impl_->params.page_size;
  std::vector<std::uint32_t> refs(n, 0);
  if (impl_->seqs.size() > impl_->max_batch_size) throw Error("more sequences than max_batch_size");
  for (const auto& [id, s] : impl_->seqs) {
    if (s.length > s.reserved) {
      throw Error(seq_name(id) + " length " + std::to_string(s.length) + " exceeds reserved " +
                  std::to_string(s.reserved));
    }
    if (s.reserved > impl_->max_seq_len) throw Error(seq_name(id) + " reserved past max_seq_len");
    if (s.pages.size() < pages_for(s.reserved, ps)) {
      throw Error(seq_name(id) + " has " + std::to_string(s.pages.size()) + " pages for " +
                  std::to_string(s.reserved) + " reserved tokens");
    }
    for (std::uint32_t p : s.pages) {
      if (p >= n) throw Error(seq_name(id) + " holds page " + std::to_string(p) + " >= " + std::to_string(n));
      ++refs[p];
    }
    if (id >= impl_->next_id) throw Error(seq_name(id) + " is not below next id");
  }
  std::vector<std::uint8_t> free(n, 0);
  for (std::uint32_t p : impl_->pool.free_list()) {
    if (p >= n || free[p]++ != 0) throw Error("page " + std::to_string(p) + " is on the free list twice or out of range");
  }
  for (std::uint32_t p = 0; p < n; ++p) {
    if (refs[p] != impl_->pool.ref_count(p)) {
      throw Error("page " + std::to_string(p) + " has ref count " +
                  std::to_string(impl_->pool.ref_count(p)) + " but " + std::to_string(refs[p]) +
                  " page-table references");
    }
    if ((refs[p] == 0) != (free[p] == 1)) {
      throw Error("page " + std::to_string(p) + (refs[p] ? " is referenced and free" : " is leaked: unreferenced and not free"));
    }
  }
}

}  // namespace kvcache
