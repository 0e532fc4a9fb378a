#include "kvcache/batch.h"

#include <algorithm>
#include <string>

namespace kvcache {

void* KVCacheBatch::blocks(std::uint32_t device) const {
  if (device >= device_blocks_.size()) {
    throw InvalidArgument("device " + std::to_string(device) + " is out of range: the cache has " +
                          std::to_string(device_blocks_.size()) + " devices");
  }
  return device_blocks_[device];
}

CacheDesc KVCacheBatch::desc(std::uint32_t device) const {
  CacheDesc d;
  d.blocks = blocks(device);
  d.dtype = params_.dtype;
  d.cache_lengths = cache_lengths_.data();
  d.reserved_lengths = reserved_lengths_.data();
  d.lookup_table = lookup_table_.data();
  d.lookup_stride = lookup_stride_;
  d.batch_size = batch_size();
  d.max_seq_length = max_seq_length_;
  d.max_cache_length = max_cache_length_;
  d.max_full_context_length = max_full_context_length_;
  d.num_layers = params_.num_layers;
  d.page_size = page_size_;
  d.n_kv_heads = params_.n_kv_heads_per_device();
  d.head_dim = params_.head_dim;
  d.num_blocks = num_blocks_;
  d.layout = params_.page_layout;
  d.arrangement = params_.pool_arrangement;
  if (head_scales_ != nullptr) {
    d.head_scales = head_scales_ +
                    std::size_t{device} * 2 * params_.num_layers * params_.n_kv_heads_per_device();
  }
  return d.with_strides();
}

void KVCacheBatch::check_view(DType want, CacheStrategy strategy, std::uint32_t device) const {
  if (device_blocks_.empty()) throw InvalidArgument("the batch is empty: it was never fetched");
  if (want != params_.dtype) {
    throw InvalidArgument("view element type " + std::string(dtype_name(want)) +
                          " does not match the cache dtype " +
                          std::string(dtype_name(params_.dtype)));
  }
  if (strategy != params_.cache_strategy) {
    throw InvalidArgument("a " + std::string(strategy_name(strategy)) + " view was asked of a " +
                          std::string(strategy_name(params_.cache_strategy)) + " cache");
  }
  (void)blocks(device);  // range check
}

void KVCacheBatch::reserve(std::size_t batch, std::size_t lookup_entries, std::size_t devices,
                           std::size_t block_copies, std::size_t block_offloads,
                           std::size_t block_loads) {
  seq_ids_.reserve(batch);
  cache_lengths_.reserve(batch);
  reserved_lengths_.reserve(batch);
  lookup_table_.reserve(lookup_entries);
  device_blocks_.reserve(devices);
  block_copies_.reserve(block_copies);
  block_offloads_.reserve(block_offloads);
  block_loads_.reserve(block_loads);
}

void KVCacheBatch::recompute_maxima(std::span<const std::uint32_t> new_tokens) {
  max_seq_length_ = 0;
  max_cache_length_ = 0;
  max_full_context_length_ = 0;
  is_cache_empty_ = true;
  for (std::size_t b = 0; b < cache_lengths_.size(); ++b) {
    max_seq_length_ = std::max(max_seq_length_, new_tokens[b]);
    max_cache_length_ = std::max(max_cache_length_, cache_lengths_[b]);
    max_full_context_length_ =
        std::max(max_full_context_length_, cache_lengths_[b] + new_tokens[b]);
    if (cache_lengths_[b] != 0) is_cache_empty_ = false;
  }
}

void KVCacheBatch::increment_cache_lengths(std::span<const std::uint32_t> prev_row_offsets) {
  const std::size_t n = seq_ids_.size();
  if (prev_row_offsets.size() != n + 1) {
    throw InvalidArgument("row_offsets has " + std::to_string(prev_row_offsets.size()) +
                          " entries, expected batch_size + 1 = " + std::to_string(n + 1));
  }
  if (prev_row_offsets[0] != 0) {
    throw InvalidArgument("row_offsets[0] is " + std::to_string(prev_row_offsets[0]) +
                          ", must be 0");
  }
  for (std::size_t b = 0; b < n; ++b) {  // malformed input first, then capacity
    if (prev_row_offsets[b + 1] < prev_row_offsets[b]) {
      throw InvalidArgument("row_offsets decreases at entry " + std::to_string(b + 1) + " (" +
                            std::to_string(prev_row_offsets[b + 1]) + " < " +
                            std::to_string(prev_row_offsets[b]) + ")");
    }
  }
  for (std::size_t b = 0; b < n; ++b) {
    const std::uint64_t next = std::uint64_t{cache_lengths_[b]} +
                               (prev_row_offsets[b + 1] - prev_row_offsets[b]) +
                               1;  // + decode token
    if (next > reserved_lengths_[b]) {
      throw CapacityExceeded("seq " + std::to_string(seq_ids_[b]) + " would reach " +
                             std::to_string(next) + " tokens, but fetch reserved room for " +
                             std::to_string(reserved_lengths_[b]) + " (raise num_steps in fetch)");
    }
  }
  for (std::size_t b = 0; b < n; ++b) {
    cache_lengths_[b] += prev_row_offsets[b + 1] - prev_row_offsets[b];
  }
  // MAX: the history maximum advances by the previous step's max_seq_length
  // (an upper bound of the new history maximum; never below it).
  std::uint32_t history = 0;
  for (std::size_t b = 0; b < n; ++b) history = std::max(history, cache_lengths_[b]);
  max_cache_length_ =
      std::max(history, static_cast<std::uint32_t>(std::min<std::uint64_t>(
                            std::uint64_t{max_cache_length_} + max_seq_length_, UINT32_MAX)));
  max_seq_length_ = n == 0 ? 0 : 1;
  max_full_context_length_ = n == 0 ? 0 : history + 1;
  is_cache_empty_ = false;
}

}  // namespace kvcache
