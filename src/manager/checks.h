// Validation shared by the managers: message wording lives in one place.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcache/batch.h"
#include "kvcache/error.h"
#include "kvcache/params.h"

namespace kvcache::manager {

inline std::string seq_name(SeqId id) { return "seq " + std::to_string(id); }

[[noreturn]] inline void throw_unknown(SeqId id) {
  throw UnknownSequence(seq_name(id) + " is not claimed (never claimed, or already released)");
}

[[noreturn]] inline void throw_duplicate(SeqId id) {
  throw InvalidArgument(seq_name(id) + " appears more than once in the batch");
}

// seqs and per-entry counts must have equal, non-zero length.
// The claimed sequence `id` in `seqs` (a map SeqId -> sequence state);
// throws UnknownSequence.
template <class SequenceMap>
auto& find_sequence(SequenceMap& seqs, SeqId id) {
  auto it = seqs.find(id);
  if (it == seqs.end()) throw_unknown(id);
  return it->second;
}

// Validates a batch's ids before any capacity check, so malformed input is
// reported as such: every id must be claimed and appear once. Marks each
// sequence with `epoch` (a counter bumped per batch) to find duplicates in O(n).
template <class SequenceMap>
void mark_batch(SequenceMap& seqs, std::span<const SeqId> ids, std::uint64_t epoch) {
  for (SeqId id : ids) {
    auto& s = find_sequence(seqs, id);
    if (s.mark == epoch) throw_duplicate(id);
    s.mark = epoch;
  }
}

inline void check_batch_spans(std::span<const SeqId> seqs, std::size_t counts,
                              const char* counts_name) {
  if (seqs.empty()) throw InvalidArgument("the batch is empty: pass at least one seq id");
  if (seqs.size() != counts) {
    throw InvalidArgument(std::string(counts_name) + " has " + std::to_string(counts) +
                          " entries but the batch has " + std::to_string(seqs.size()) + " seq ids");
  }
}

inline void check_num_steps(std::uint32_t num_steps) {
  if (num_steps == 0) throw InvalidArgument("num_steps is 0: it must be at least 1");
}

// Tokens a fetch must make room for, checked against max_seq_len.
inline std::uint32_t reserved_target(SeqId id, std::uint32_t length, std::uint32_t new_tokens,
                                     std::uint32_t num_steps, std::uint32_t max_seq_len) {
  const std::uint64_t target = std::uint64_t{length} + new_tokens + (num_steps - 1);
  if (target > max_seq_len) {
    throw CapacityExceeded(seq_name(id) + " needs room for " + std::to_string(target) +
                           " tokens (" + std::to_string(length) + " cached + " +
                           std::to_string(new_tokens) + " new + " + std::to_string(num_steps - 1) +
                           " extra steps), max_seq_len is " + std::to_string(max_seq_len));
  }
  return static_cast<std::uint32_t>(target);
}

inline void check_step_room(SeqId id, std::uint32_t length, std::uint32_t valid,
                            std::uint32_t reserved) {
  if (std::uint64_t{length} + valid > reserved) {
    throw CapacityExceeded(seq_name(id) + " cannot commit " + std::to_string(valid) +
                           " tokens: it has " + std::to_string(length) +
                           " and fetch reserved room for " + std::to_string(reserved));
  }
}

inline void check_claim(std::uint32_t n, std::uint32_t active, std::uint32_t max_batch_size) {
  if (n == 0) throw InvalidArgument("claim(0): claim at least one sequence");
  if (std::uint64_t{active} + n > max_batch_size) {
    throw CapacityExceeded("cannot claim " + std::to_string(n) +
                           " sequences: " + std::to_string(active) + " of max_batch_size " +
                           std::to_string(max_batch_size) + " are in use");
  }
}

// Shape of the blocks tensor of n blocks of page_size tokens (one device):
// interleaved [n][2][layers][A][B][head_dim], per_layer
// [layers][2][n][A][B][head_dim], with [A][B] = [tokens][heads] (NHD) or
// [heads][tokens] (HND).
inline std::vector<std::size_t> block_shape_of(const KVCacheParams& p, std::uint32_t n,
                                               std::uint32_t page_size) {
  if (has_page_scales(p.dtype)) {  // int8: a block is its values then its scales, in bytes
    const std::size_t bytes = std::size_t{page_size} * p.n_kv_heads_per_device() * (p.head_dim + 4);
    if (p.pool_arrangement == PoolArrangement::per_layer) return {p.num_layers, 2, n, bytes};
    return {n, 2, p.num_layers, bytes};
  }
  const bool hnd = p.page_layout == PageLayout::hnd;
  const std::size_t a = hnd ? p.n_kv_heads_per_device() : page_size;
  const std::size_t b = hnd ? page_size : p.n_kv_heads_per_device();
  if (p.pool_arrangement == PoolArrangement::per_layer)
    return {p.num_layers, 2, n, a, b, p.head_dim};
  return {n, 2, p.num_layers, a, b, p.head_dim};
}

}  // namespace kvcache::manager
