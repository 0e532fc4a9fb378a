// kvcache/cuda/device_collection.h — a batch's cache metadata on the device.
//
// The intended flow keeps the manager on the host and the page pool on the GPU:
//   1. Allocate ONE device pool with the manager's shape
//      [num_blocks][2][num_layers][block_tokens][n_kv_heads][head_dim]
//      (pool_elements(desc) elements of T), e.g. DeviceBuffer<T>; page (or
//      slot) id p means the same block in the host and the device pool.
//   2. Every step: `auto host = batch.paged<T>();` (or continuous<T>()) from
//      the manager's fetch, as usual — bookkeeping only, the host blocks are
//      never touched by the GPU path.
//   3. `DeviceCollection<T> dev(host.desc(), pool.data(), stream);` uploads
//      that batch's cache_lengths and lookup_table; dev.key(layer) /
//      dev.value(layer) are LayerCacheDesc<T> whose pointers are all device
//      memory, computed exactly as the host collection computes its views
//      (layer / K-V offset inside a block, block_stride = 2 * num_layers *
//      block_tokens * n_kv_heads * head_dim).
//   4. kvcache::cuda::store_kv / attention on those descriptors, then the
//      manager's step() as on the CPU path.
// With n_devices > 1 (tensor parallel), make one DeviceCollection per device
// from batch.paged<T>(device).desc() and that device's pool.
//
// Invariants: the host desc is validated on construction exactly as a host
// collection validates it (lookup entries within num_blocks or the sentinel,
// committed tokens backed by blocks, ...): InvalidArgument naming the value.
// Nothing is checked about `device_blocks` except that it is non-null device
// memory (InvalidArgument otherwise): it must hold pool_elements(host) T.
// Ownership: owns the uploaded cache_lengths / lookup_table (freed by the
// destructor); borrows the pool. Descriptors it returns are valid while it
// lives. The upload completes before the constructor returns.
// Thread-safety: const methods are safe concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvcache/collection.h"
#include "kvcache/cuda/device_buffer.h"
#include "kvcache/kv_cache.h"

namespace kvcache::cuda {

// Elements of T in a pool of desc's shape (all blocks, K and V, all layers).
template <CacheElement T>
std::size_t pool_elements(const CollectionDesc<T>& d) {
  return std::size_t{d.num_blocks} * 2 * d.num_layers * d.block_tokens * d.n_kv_heads * d.head_dim;
}

template <CacheElement T>
class DeviceCollection {
 public:
  DeviceCollection(const CollectionDesc<T>& host, T* device_blocks, CUstream_st* stream = nullptr)
      : desc_(host) {
    kvcache::detail::validate_collection_desc(
        host.blocks, host.cache_lengths, host.lookup_table, host.lookup_stride, host.batch_size,
        host.max_seq_length, host.max_cache_length, host.num_layers, host.block_tokens,
        host.n_kv_heads, host.head_dim, host.num_blocks, host.layout);
    if (device_blocks == nullptr || !detail::is_device_pointer(device_blocks)) {
      throw InvalidArgument("DeviceCollection: device_blocks is not device memory");
    }
    const std::span<const std::uint32_t> lengths(host.cache_lengths, host.batch_size);
    const std::span<const std::uint32_t> lookup(host.lookup_table,
                                                std::size_t{host.batch_size} * host.lookup_stride);
    lengths_ = DeviceBuffer<std::uint32_t>::from_host(lengths, stream);
    lookup_ = DeviceBuffer<std::uint32_t>::from_host(lookup, stream);
    desc_.blocks = device_blocks;
    desc_.cache_lengths = lengths_.data();
    desc_.lookup_table = lookup_.data();
  }

  // The device view of one layer's K (key) or V (value). Throws
  // InvalidArgument for layer >= num_layers.
  LayerCacheDesc<T> key(std::uint32_t layer) const { return layer_desc(layer, 0); }
  LayerCacheDesc<T> value(std::uint32_t layer) const { return layer_desc(layer, 1); }
  // The collection with device pointers (blocks, cache_lengths, lookup_table).
  const CollectionDesc<T>& desc() const { return desc_; }

 private:
  LayerCacheDesc<T> layer_desc(std::uint32_t layer, std::uint32_t kv) const {
    return layer_cache_desc(desc_, layer, kv);
  }

  CollectionDesc<T> desc_;
  DeviceBuffer<std::uint32_t> lengths_;
  DeviceBuffer<std::uint32_t> lookup_;
};

}  // namespace kvcache::cuda
