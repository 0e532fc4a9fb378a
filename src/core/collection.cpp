#include "kvcache/collection.h"

#include <string>

namespace kvcache::detail {

namespace {

std::string u(std::uint64_t v) { return std::to_string(v); }

// Throws InvalidArgument(message()) unless ok; the message is only built on
// failure (this runs for every lookup-table entry of every view).
template <class Message>
void require(bool ok, const Message& message) {
  if (!ok) throw InvalidArgument(message());
}

}  // namespace

void validate_collection_desc(const void* blocks, const std::uint32_t* cache_lengths,
                              const std::uint32_t* lookup_table, std::uint32_t lookup_stride,
                              std::uint32_t batch_size, std::uint32_t max_seq_length,
                              std::uint32_t max_cache_length, std::uint32_t num_layers,
                              std::uint32_t block_tokens, std::uint32_t n_kv_heads,
                              std::uint32_t head_dim, std::uint32_t num_blocks, PageLayout layout) {
  require(blocks != nullptr, [&] { return std::string("collection blocks pointer is null"); });
  require(layout == PageLayout::nhd || layout == PageLayout::hnd, [&] {
    return "collection layout value " + u(static_cast<std::uint32_t>(layout)) +
           " is not nhd or hnd";
  });
  require(num_layers > 0 && block_tokens > 0 && n_kv_heads > 0 && head_dim > 0 && num_blocks > 0,
          [&] {
            return "collection sizes must be non-zero (num_layers " + u(num_layers) +
                   ", block_tokens " + u(block_tokens) + ", n_kv_heads " + u(n_kv_heads) +
                   ", head_dim " + u(head_dim) + ", num_blocks " + u(num_blocks) + ")";
          });
  if (batch_size == 0) return;
  require(cache_lengths != nullptr,
          [&] { return std::string("collection cache_lengths pointer is null"); });
  require(lookup_table != nullptr,
          [&] { return std::string("collection lookup_table pointer is null"); });
  require(lookup_stride > 0, [&] { return std::string("collection lookup_stride is 0"); });
  const std::uint64_t room = std::uint64_t{lookup_stride} * block_tokens;
  require(max_cache_length <= room, [&] {
    return "max_cache_length " + u(max_cache_length) + " exceeds the lookup table's room of " +
           u(room) + " tokens";
  });
  require(max_seq_length <= max_cache_length, [&] {
    return "max_seq_length " + u(max_seq_length) + " exceeds max_cache_length " +
           u(max_cache_length);
  });
  for (std::uint32_t b = 0; b < batch_size; ++b) {
    require(cache_lengths[b] <= max_cache_length, [&] {
      return "cache_lengths[" + u(b) + "] = " + u(cache_lengths[b]) + " exceeds max_cache_length " +
             u(max_cache_length);
    });
    const std::uint32_t committed_blocks = (cache_lengths[b] + block_tokens - 1) / block_tokens;
    for (std::uint32_t j = 0; j < lookup_stride; ++j) {
      const std::uint32_t id = lookup_table[std::uint64_t{b} * lookup_stride + j];
      require(id <= num_blocks, [&] {
        return "lookup_table[" + u(b) + "][" + u(j) + "] = " + u(id) + " is past the " +
               u(num_blocks) + " blocks";
      });
      require(id < num_blocks || j >= committed_blocks, [&] {
        return "lookup_table[" + u(b) + "][" + u(j) + "] is the sentinel but entry " + u(b) +
               " has " + u(cache_lengths[b]) + " committed tokens there";
      });
    }
  }
}

}  // namespace kvcache::detail
