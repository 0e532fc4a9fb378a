#include "kvcache/continuous_manager.h"

#include <algorithm>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "core/checked_math.h"
#include "manager/checks.h"
#include "manager/observability.h"
#include "manager/seq_ids.h"
#include "memory/block_pool.h"
#include "memory/host_arena.h"

namespace kvcache {

using manager::seq_name;

struct ContinuousBatchingKVCacheManager::Impl {
  struct Sequence {
    std::uint32_t slot = 0;
    std::uint32_t length = 0;
    std::uint32_t reserved = 0;
    std::uint64_t mark = 0;  // last batch epoch that named it (duplicate check)
  };

  Impl(const KVCacheParams& p, std::uint32_t max_batch, std::uint32_t max_seq, SeqIdPolicy ids)
      : params(p), max_batch_size(max_batch), max_seq_len(max_seq), slots(max_batch), ids(ids) {
    const std::size_t per_device = estimated_memory_size(p, max_batch, max_seq) / p.n_devices;
    for (std::uint32_t d = 0; d < p.n_devices; ++d) arenas.emplace_back(per_device);
  }

  void mark_all(std::span<const SeqId> ids) { manager::mark_batch(seqs, ids, epoch); }
  const Sequence& find(SeqId id) const { return manager::find_sequence(seqs, id); }

  KVCacheParams params;
  std::uint32_t max_batch_size;
  std::uint32_t max_seq_len;
  std::vector<memory::HostArena> arenas;
  memory::BlockPool slots;
  std::unordered_map<SeqId, Sequence> seqs;
  manager::SeqIdAllocator ids;
  std::uint64_t epoch = 0;
  std::uint64_t pool_bytes = 0;
  manager::LifecycleCounters counters;
  mutable std::mutex mu;
};

ContinuousBatchingKVCacheManager::ContinuousBatchingKVCacheManager(const KVCacheParams& params,
                                                                   std::uint32_t max_batch_size,
                                                                   std::uint32_t max_seq_len,
                                                                   SeqIdPolicy seq_id_policy)
    : KVCacheManager(params, max_batch_size, max_seq_len, seq_id_policy) {
  if (params.cache_strategy != CacheStrategy::continuous) {
    throw InvalidArgument("ContinuousBatchingKVCacheManager needs cache_strategy continuous, got " +
                          std::string(strategy_name(params.cache_strategy)));
  }
  const std::size_t bytes = estimated_memory_size(params, max_batch_size, max_seq_len);
  try {
    impl_ = std::make_unique<Impl>(params, max_batch_size, max_seq_len, seq_id_policy);
  } catch (const std::bad_alloc&) {
    throw OutOfMemory("cannot allocate the bookkeeping of " + std::to_string(max_batch_size) +
                      " slots");
  }
  impl_->pool_bytes = bytes;
  manager::log_after_commit(LogLevel::info, [&] {
    return manager::construction_line("continuous manager", max_batch_size, "slot", max_seq_len,
                                      params, bytes);
  });
}

ContinuousBatchingKVCacheManager::~ContinuousBatchingKVCacheManager() = default;

std::size_t ContinuousBatchingKVCacheManager::estimated_memory_size(const KVCacheParams& params,
                                                                    std::uint32_t max_batch_size,
                                                                    std::uint32_t max_seq_len) {
  params.validate();
  return detail::checked_product("estimated_memory_size",
                                 {{"max_batch_size", max_batch_size},
                                  {"max_seq_len", max_seq_len},
                                  {"bytes_per_token", params.bytes_per_token()}});
}

std::vector<SeqId> ContinuousBatchingKVCacheManager::claim(std::uint32_t n) {
  std::lock_guard lock(impl_->mu);
  manager::check_claim(n, static_cast<std::uint32_t>(impl_->seqs.size()), impl_->max_batch_size);
  std::vector<SeqId> ids;
  ids.reserve(n);
  impl_->seqs.reserve(impl_->seqs.size() + n);  // no rehash-throw below
  impl_->ids.reserve(n);
  const SeqId mark = impl_->ids.next_id();
  try {
    for (std::uint32_t i = 0; i < n; ++i) {
      ids.push_back(impl_->ids.take());                                   // capacity reserved above
      auto it = impl_->seqs.emplace(ids.back(), Impl::Sequence{}).first;  // may throw bad_alloc
      it->second.slot = impl_->slots.allocate();
    }
  } catch (...) {  // all or nothing: undo the ids already handed out
    for (SeqId id : ids) {
      auto it = impl_->seqs.find(id);
      if (it == impl_->seqs.end()) continue;  // its emplace threw
      impl_->slots.release(it->second.slot);
      impl_->seqs.erase(it);
    }
    impl_->ids.rollback(ids, mark);
    throw;
  }
  impl_->counters.claimed += n;
  return ids;
}

void ContinuousBatchingKVCacheManager::fetch_into(KVCacheBatch& out, std::span<const SeqId> seqs,
                                                  std::span<const std::uint32_t> num_new_tokens,
                                                  std::uint32_t num_steps) {
  std::lock_guard lock(impl_->mu);
  manager::check_batch_spans(seqs, num_new_tokens.size(), "num_new_tokens");
  manager::check_num_steps(num_steps);
  ++impl_->epoch;
  impl_->mark_all(seqs);
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const Impl::Sequence& s = impl_->seqs.find(seqs[b])->second;
    manager::reserved_target(seqs[b], s.length, num_new_tokens[b], num_steps, impl_->max_seq_len);
  }
  // Validated. Reserve (may throw, changes nothing observable), then fill.
  out.reserve(seqs.size(), seqs.size(), impl_->arenas.size());
  KVCacheBatch& next = out;  // buffers reserved above; nothing below allocates
  next.params_ = impl_->params;
  next.seq_ids_.assign(seqs.begin(), seqs.end());
  next.cache_lengths_.resize(seqs.size());
  next.reserved_lengths_.resize(seqs.size());
  next.lookup_table_.resize(seqs.size());
  next.lookup_stride_ = 1;
  next.num_blocks_ = impl_->max_batch_size;
  next.page_size_ = impl_->max_seq_len;
  next.device_blocks_.clear();
  for (auto& arena : impl_->arenas) next.device_blocks_.push_back(arena.data());
  next.head_scales_ = device_scales();
  next.block_copies_.clear();    // slots are never shared
  next.block_offloads_.clear();  // no tiers
  next.block_loads_.clear();
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    Impl::Sequence& s = impl_->seqs.find(seqs[b])->second;
    s.reserved = impl_->max_seq_len;  // the whole slot is the sequence's
    next.cache_lengths_[b] = s.length;
    next.reserved_lengths_[b] = s.reserved;
    next.lookup_table_[b] = s.slot;
  }
  next.recompute_maxima(num_new_tokens);
  ++impl_->counters.fetches;
}

void ContinuousBatchingKVCacheManager::step(std::span<const SeqId> seqs,
                                            std::span<const std::uint32_t> valid_lengths) {
  std::lock_guard lock(impl_->mu);
  manager::check_batch_spans(seqs, valid_lengths.size(), "valid_lengths");
  ++impl_->epoch;
  impl_->mark_all(seqs);
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const Impl::Sequence& s = impl_->seqs.find(seqs[b])->second;
    manager::check_step_room(seqs[b], s.length, valid_lengths[b], s.reserved);
  }
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    impl_->seqs.find(seqs[b])->second.length += valid_lengths[b];
  }
  impl_->counters.count_step(valid_lengths);
}

void ContinuousBatchingKVCacheManager::release(SeqId seq) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->seqs.find(seq);
  if (it == impl_->seqs.end()) manager::throw_unknown(seq);
  impl_->slots.release(it->second.slot);
  impl_->seqs.erase(it);
  impl_->ids.release(seq);
  ++impl_->counters.released;
}

std::uint32_t ContinuousBatchingKVCacheManager::cache_length(SeqId seq) const {
  std::lock_guard lock(impl_->mu);
  return impl_->find(seq).length;
}

bool ContinuousBatchingKVCacheManager::contains(SeqId seq) const {
  std::lock_guard lock(impl_->mu);
  return impl_->seqs.count(seq) != 0;
}

std::uint32_t ContinuousBatchingKVCacheManager::num_active_sequences() const {
  std::lock_guard lock(impl_->mu);
  return static_cast<std::uint32_t>(impl_->seqs.size());
}

std::uint32_t ContinuousBatchingKVCacheManager::total_blocks() const {
  return impl_->max_batch_size;
}

std::uint32_t ContinuousBatchingKVCacheManager::free_blocks() const {
  std::lock_guard lock(impl_->mu);
  return impl_->slots.num_free();
}

std::vector<std::size_t> ContinuousBatchingKVCacheManager::block_shape(std::uint32_t n) const {
  return manager::block_shape_of(impl_->params, n, impl_->max_seq_len);
}

ManagerStats ContinuousBatchingKVCacheManager::stats() const {
  std::lock_guard lock(impl_->mu);
  ManagerStats s;
  s.blocks_total = impl_->max_batch_size;
  s.blocks_free = impl_->slots.num_free();
  s.blocks_used = s.blocks_total - s.blocks_free;
  s.page_size = impl_->max_seq_len;
  s.active_sequences = static_cast<std::uint32_t>(impl_->seqs.size());
  s.pool_bytes = impl_->pool_bytes;
  impl_->counters.fill(s);
  return s;
}

ManagerSnapshot ContinuousBatchingKVCacheManager::snapshot() const {
  std::lock_guard lock(impl_->mu);
  ManagerSnapshot snap;
  for (const auto& [id, s] : impl_->seqs) {
    snap.sequences.push_back({id, s.length, s.reserved, {s.slot}});
  }
  std::sort(snap.sequences.begin(), snap.sequences.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  snap.free_blocks = impl_->slots.free_list();
  std::sort(snap.free_blocks.begin(), snap.free_blocks.end());
  snap.ref_counts = impl_->slots.ref_counts();
  snap.next_seq_id = impl_->ids.next_id();
  return snap;
}

void ContinuousBatchingKVCacheManager::check_invariants() const {
  std::lock_guard lock(impl_->mu);
  const std::uint32_t n = impl_->max_batch_size;
  std::vector<std::uint32_t> owners(n, 0);
  for (const auto& [id, s] : impl_->seqs) {
    if (s.slot >= n)
      throw Error(seq_name(id) + " holds slot " + std::to_string(s.slot) +
                  " >= " + std::to_string(n));
    ++owners[s.slot];
    if (s.length > s.reserved)
      throw Error(seq_name(id) + " length " + std::to_string(s.length) + " exceeds reserved " +
                  std::to_string(s.reserved));
    if (s.length > impl_->max_seq_len)
      throw Error(seq_name(id) + " length " + std::to_string(s.length) + " exceeds max_seq_len");
  }
  impl_->ids.check(impl_->seqs, n);
  std::vector<std::uint32_t> on_free_list(n, 0);
  for (std::uint32_t slot : impl_->slots.free_list()) {
    if (slot >= n || on_free_list[slot]++ != 0)
      throw Error("slot " + std::to_string(slot) + " is on the free list twice or out of range");
  }
  for (std::uint32_t i = 0; i < n; ++i) {
    if (owners[i] != impl_->slots.ref_count(i))
      throw Error("slot " + std::to_string(i) + " has ref count " +
                  std::to_string(impl_->slots.ref_count(i)) + " but " + std::to_string(owners[i]) +
                  " owners");
    if ((owners[i] == 0) != (on_free_list[i] == 1))
      throw Error("slot " + std::to_string(i) + " is " +
                  (owners[i] ? "owned and free" : "neither owned nor free"));
  }
}

}  // namespace kvcache
