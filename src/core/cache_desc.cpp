#include "kvcache/cache_desc.h"

#include <string>

#include "core/checked_math.h"
#include "kvcache/error.h"

namespace kvcache {

namespace {

std::string u(std::uint64_t v) { return std::to_string(v); }

// Throws InvalidArgument(message()) unless ok; the message is only built on
// failure (this runs for every lookup-table entry of every view).
template <class Message>
void require(bool ok, const Message& message) {
  if (!ok) throw InvalidArgument(message());
}

}  // namespace

CacheDesc CacheDesc::layer(std::uint32_t layer, std::uint32_t kv) const {
  require(layer < num_layers, [&] {
    return "layer " + u(layer) + " is out of range: the cache has " + u(num_layers) + " layers";
  });
  require(kv <= 1, [&] { return "kv " + u(kv) + " is neither 0 (K) nor 1 (V)"; });
  CacheDesc d = *this;
  d.blocks = static_cast<char*>(blocks) + layer_offset(layer, kv) * dtype_size(dtype);
  if (head_scales != nullptr) {
    d.head_scales = head_scales + (std::size_t{layer} * 2 + kv) * n_kv_heads;
  }
  return d;
}

void CacheDesc::validate() const {
  const CacheDesc& d = *this;
  require(d.blocks != nullptr, [&] { return std::string("cache desc blocks pointer is null"); });
  require(is_dtype(d.dtype), [&] {
    return "cache desc dtype value " + u(static_cast<std::uint32_t>(d.dtype)) +
           " is not f32, f16, bf16, fp8_e4m3, fp8_e5m2 or int8";
  });
  require(!is_fp8(d.dtype) || d.head_scales != nullptr, [&] {
    return "cache desc dtype " + std::string(dtype_name(d.dtype)) +
           " needs head_scales (the static K/V scales) but it is null";
  });
  require(!has_page_scales(d.dtype) || d.head_dim % 4 == 0, [&] {
    return "cache desc head_dim " + u(d.head_dim) +
           " is not a multiple of 4, which an int8 cache's in-page scales need";
  });
  require(d.layout == PageLayout::nhd || d.layout == PageLayout::hnd, [&] {
    return "cache desc layout value " + u(static_cast<std::uint32_t>(d.layout)) +
           " is not nhd or hnd";
  });
  require(
      d.arrangement == PoolArrangement::interleaved || d.arrangement == PoolArrangement::per_layer,
      [&] {
        return "cache desc arrangement value " + u(static_cast<std::uint32_t>(d.arrangement)) +
               " is not interleaved or per_layer";
      });
  require(
      d.num_layers > 0 && d.page_size > 0 && d.n_kv_heads > 0 && d.head_dim > 0 && d.num_blocks > 0,
      [&] {
        return "cache desc sizes must be non-zero (num_layers " + u(d.num_layers) + ", page_size " +
               u(d.page_size) + ", n_kv_heads " + u(d.n_kv_heads) + ", head_dim " + u(d.head_dim) +
               ", num_blocks " + u(d.num_blocks) + ")";
      });
  // The pool's element count must fit 64 bits (the views' offsets use it).
  detail::checked_product(
      "cache desc pool elements",
      {{"num_blocks", d.num_blocks},
       {"2 * num_layers", 2 * std::uint64_t{d.num_layers}},
       {"page_size", d.page_size},
       {"n_kv_heads", d.n_kv_heads},
       {"head_dim + scale bytes", d.head_dim + (has_page_scales(d.dtype) ? 4 : 0)},
       {"element size", dtype_size(d.dtype)}});
  const CacheDesc resolved = d.with_strides();
  require(d.block_stride == resolved.block_stride && d.layer_stride == resolved.layer_stride &&
              d.kv_stride == resolved.kv_stride && d.token_stride == resolved.token_stride &&
              d.head_stride == resolved.head_stride,
          [&] {
            return "cache desc strides (block " + u(d.block_stride) + ", layer " +
                   u(d.layer_stride) + ", kv " + u(d.kv_stride) + ", token " + u(d.token_stride) +
                   ", head " + u(d.head_stride) + ") are not those of its geometry (block " +
                   u(resolved.block_stride) + ", layer " + u(resolved.layer_stride) + ", kv " +
                   u(resolved.kv_stride) + ", token " + u(resolved.token_stride) + ", head " +
                   u(resolved.head_stride) + "): build it with with_strides()";
          });
  if (d.batch_size == 0) return;
  require(d.cache_lengths != nullptr,
          [&] { return std::string("cache desc cache_lengths pointer is null"); });
  require(d.lookup_table != nullptr,
          [&] { return std::string("cache desc lookup_table pointer is null"); });
  require(d.lookup_stride > 0, [&] { return std::string("cache desc lookup_stride is 0"); });
  for (std::uint32_t b = 0; b < d.batch_size; ++b) {
    const std::uint32_t length = d.cache_lengths[b];
    require(length <= d.max_cache_length, [&] {
      return "cache_lengths[" + u(b) + "] = " + u(length) + " exceeds max_cache_length " +
             u(d.max_cache_length);
    });
    const std::uint64_t room =
        d.reserved_lengths != nullptr ? d.reserved_lengths[b] : std::uint64_t{length};
    require(d.reserved_lengths == nullptr || room >= length, [&] {
      return "reserved_lengths[" + u(b) + "] = " + u(room) + " is below cache_lengths[" + u(b) +
             "] = " + u(length);
    });
    const std::uint64_t needed_blocks = (room + d.page_size - 1) / d.page_size;
    require(needed_blocks <= d.lookup_stride, [&] {
      return "entry " + u(b) + " needs " + u(needed_blocks) + " blocks for " + u(room) +
             " tokens but lookup_stride is " + u(d.lookup_stride);
    });
    for (std::uint32_t j = 0; j < d.lookup_stride; ++j) {
      const std::uint32_t id = d.lookup_table[std::uint64_t{b} * d.lookup_stride + j];
      require(id <= d.num_blocks, [&] {
        return "lookup_table[" + u(b) + "][" + u(j) + "] = " + u(id) + " is past the " +
               u(d.num_blocks) + " blocks";
      });
      require(id < d.num_blocks || j >= needed_blocks, [&] {
        return "lookup_table[" + u(b) + "][" + u(j) + "] is the sentinel but entry " + u(b) +
               " has " + u(room) + (d.reserved_lengths != nullptr ? " reserved" : " committed") +
               " tokens there";
      });
    }
  }
}

}  // namespace kvcache
