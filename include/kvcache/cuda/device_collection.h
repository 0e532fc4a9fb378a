// kvcache/cuda/device_collection.h — a batch's cache metadata on the device.
//
// The intended flow keeps the manager on the host and the page pool on the GPU:
//   1. Allocate ONE device pool with the manager's shape and arrangement
//      (interleaved [num_blocks][2][num_layers][block], or per_layer
//      [num_layers][2][num_blocks][block]: kvcache/params.h), that is
//      desc.pool_elements() elements of T, e.g. DeviceBuffer<T>; page (or
//      slot) id p means the same block in the host and the device pool.
//   2. Every step: `auto host = batch.paged<T>();` (or continuous<T>()) from
//      the manager's fetch, as usual — bookkeeping only, the host blocks are
//      never touched by the GPU path.
//   3. `DeviceCollection<T> dev(host.desc(), pool.data(), stream);` uploads
//      that batch's cache_lengths and lookup_table; dev.key(layer) /
//      dev.value(layer) are per-layer CacheDescs whose pointers are all
//      device memory, computed exactly as the host collection computes its
//      views (CacheDesc::layer: the layer's K / V base, the strides of the
//      arrangement). The device descriptors carry no reserved_lengths (the
//      host's are host memory): the host batch is validated on upload, and
//      the device kernels trust row_offsets to stay within what the fetch
//      reserved (they cannot be checked without reading device memory).
//   4. If the fetch made copy-on-write copies (batch.block_copies(): a write
//      into a page shared after fork, or cut by truncate), make them in the
//      device pool too: copy_blocks(host.desc(), pool.data(),
//      batch.block_copies(), stream) before this step's stores.
//   5. kvcache::cuda::store_kv / attention on those descriptors, then the
//      manager's step() as on the CPU path.
// With n_devices > 1 (tensor parallel), make one DeviceCollection per device
// from batch.paged<T>(device).desc() and that device's pool.
//
// CUDA graphs (the decode step captured once, replayed every step): a
// replayed kernel reads the device memory its capture pointed at, with the
// capture's launch shape. So the metadata must stay where it is and keep its
// shape while its contents move on:
//   - build the collection once with DeviceCollectionBounds: the lookup
//     stride, max_seq_length and max_full_context_length every later step fits in
//     (e.g. the pages of the longest sequence, 1, and the context limit);
//     the descriptors then carry those bounds, so the kernels' launch shape
//     (split plan, grid) is the same every step;
//   - every step, update(next_batch.desc()) repacks the step's page table
//     into the bounded stride (sentinel-padded) and uploads it with the
//     cache lengths into the same device buffers, then replay.
// The batch size is fixed per collection: capture one graph per batch size
// and replay it for smaller batches with padding (DeviceCollectionBounds).
// store_kv / attention's own rules for graphs: kvcache/cuda/kernels.h.
//
// Invariants: the host desc is validated on construction exactly as a host
// collection validates it (lookup entries within num_blocks or the sentinel,
// committed tokens backed by blocks, ...): InvalidArgument naming the value.
// Nothing is checked about `device_blocks` except that it is non-null device
// memory (InvalidArgument otherwise): it must hold host.pool_elements() T.
// 8-bit caches (T = Fp8E4M3, Fp8E5M2, Int8; docs/quantization.md): int8's
// scales live in the pages, so nothing more moves; for fp8 the collection
// also uploads the host desc's static head_scales ([num_layers][2]
// [n_kv_heads]) on construction and every update(), and key(l) / value(l)
// point at the device copy.
// Ownership: owns the uploaded cache_lengths / lookup_table / fp8 scales
// (freed by the destructor); borrows the pool. Descriptors it returns are valid while it
// lives, and across update() (same device pointers). Uploads complete before
// the constructor / update() return.
// Thread-safety: const methods are safe concurrently; update() is not safe
// concurrently with anything on the same collection, and overwrites the
// device metadata: kernels still to run on the old contents must be ordered
// before it (the same stream, or synchronised).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcache/batch.h"
#include "kvcache/collection.h"
#include "kvcache/cuda/device_buffer.h"
#include "kvcache/kv_cache.h"

namespace kvcache::cuda {

namespace detail {
// src/kernels/cuda/device.cu: validates, then one 2-D device-to-device copy
// per pair: block b is `chunks` runs of chunk_bytes at b * chunk_bytes +
// i * pitch_bytes (interleaved: one run of a whole block; per_layer: one run
// per layer and K/V, pitch = one layer's K or V array).
void copy_blocks_cuda(void* device_pool, std::size_t chunk_bytes, std::size_t chunks,
                      std::size_t pitch_bytes, std::uint32_t num_blocks,
                      std::span<const BlockCopy> copies, CUstream_st* stream);
}  // namespace detail

// Makes a fetch's copy-on-write copies (KVCacheBatch::block_copies) in a
// device pool of the host batch's shape: for each (src, dst) in order, block
// dst of the pool becomes a copy of block src (all layers, K and V). Call it
// after the fetch and before the step's store_kv; with n_devices > 1 call it
// for every device's pool with that device's desc (the same copies apply).
// Enqueues device-to-device copies on `stream` and returns (nothing is
// synchronised). The list differs from fetch to fetch, so with CUDA graphs
// call it on the stream before replaying the step's graph, not inside the
// capture (a captured copy would be repeated by every replay). Throws
// InvalidArgument, with nothing enqueued, when copies is non-empty and
// device_pool is not device memory, or a src / dst is not a block of the
// pool (>= host.num_blocks); DeviceError when a copy cannot be enqueued.
template <CacheElement T>
void copy_blocks(const CacheDesc& host, T* device_pool, std::span<const BlockCopy> copies,
                 CUstream_st* stream = nullptr) {
  if (host.dtype != dtype_of_v<T>) {
    throw InvalidArgument("copy_blocks: a pool of " + std::string(dtype_name(dtype_of_v<T>)) +
                          " for a cache of " + std::string(dtype_name(host.dtype)));
  }
  const std::size_t layer_bytes = host.block_elements() * sizeof(T);
  const std::size_t runs = 2 * std::size_t{host.num_layers};
  if (host.arrangement == PoolArrangement::per_layer) {
    detail::copy_blocks_cuda(device_pool, layer_bytes, runs, layer_bytes * host.num_blocks,
                             host.num_blocks, copies, stream);
  } else {
    detail::copy_blocks_cuda(device_pool, layer_bytes * runs, 1, layer_bytes * runs,
                             host.num_blocks, copies, stream);
  }
}

inline constexpr std::uint32_t kNoPaddingBlock = UINT32_MAX;

// The shape a DeviceCollection keeps across update(): its descriptors carry
// these values, each at least the host batch's (see CUDA graphs above).
// Padding (a graph captured for batch_size entries, replayed for fewer):
// with a padding_block, a host batch may have fewer entries than the
// collection; the entries past it get cache_length 0 and a page table of
// padding_block then the sentinel. The caller gives them row_offsets of its
// own (at most min(page_size, max_seq_length) new tokens each, e.g. 1 in
// decode) and inputs of any finite value: their stores land in padding_block
// (a block of the pool the caller owns and never reads, e.g. the page of a
// sequence it claimed for that), their outputs are meaningless.
struct DeviceCollectionBounds {
  std::uint32_t lookup_stride = 0;                // page-table entries per batch entry
  std::uint32_t max_seq_length = 0;               // new tokens of any entry in any step
  std::uint32_t max_full_context_length = 0;      // cache_length + new tokens, any entry, any step
  std::uint32_t batch_size = 0;                   // entries; 0: the host batch's
  std::uint32_t padding_block = kNoPaddingBlock;  // < num_blocks to allow padding
};

template <CacheElement T>
class DeviceCollection {
 public:
  // The host batch's metadata as it is (bounds = the batch's own values).
  DeviceCollection(const CacheDesc& host, T* device_blocks, CUstream_st* stream = nullptr)
      : DeviceCollection(host, device_blocks,
                         {host.lookup_stride, host.max_seq_length,
                          std::max(host.max_full_context_length, host.max_cache_length)},
                         stream) {}

  // With bounds for update(): throws InvalidArgument (naming the value and
  // the limit) when a bound is below the host batch's value, when
  // max_full_context_length exceeds lookup_stride * page_size, when
  // max_seq_length exceeds max_full_context_length, when padding_block is neither
  // kNoPaddingBlock nor a block of the pool, when batch_size exceeds the
  // host batch's without a padding_block, or when lookup_stride is 0 for a
  // non-empty batch.
  DeviceCollection(const CacheDesc& host, T* device_blocks, const DeviceCollectionBounds& bounds,
                   CUstream_st* stream = nullptr)
      : desc_(host) {
    validate(host);
    if (device_blocks == nullptr || !detail::is_device_pointer(device_blocks)) {
      throw InvalidArgument("DeviceCollection: device_blocks is not device memory");
    }
    check_bound("lookup_stride", host.lookup_stride, bounds.lookup_stride);
    check_bound("max_seq_length", host.max_seq_length, bounds.max_seq_length);
    check_bound("max_full_context_length", host.max_full_context_length,
                bounds.max_full_context_length);
    check_bound("max_cache_length", host.max_cache_length, bounds.max_full_context_length);
    if (std::uint64_t{bounds.max_full_context_length} >
        std::uint64_t{bounds.lookup_stride} * host.page_size) {
      throw InvalidArgument("DeviceCollectionBounds: max_full_context_length " +
                            std::to_string(bounds.max_full_context_length) +
                            " exceeds lookup_stride x page_size = " +
                            std::to_string(std::uint64_t{bounds.lookup_stride} * host.page_size));
    }
    if (bounds.max_seq_length > bounds.max_full_context_length) {
      throw InvalidArgument(
          "DeviceCollectionBounds: max_seq_length " + std::to_string(bounds.max_seq_length) +
          " exceeds max_full_context_length " + std::to_string(bounds.max_full_context_length));
    }
    if (bounds.padding_block != kNoPaddingBlock && bounds.padding_block >= host.num_blocks) {
      throw InvalidArgument("DeviceCollectionBounds: padding_block " +
                            std::to_string(bounds.padding_block) + " is past the pool's " +
                            std::to_string(host.num_blocks) + " blocks");
    }
    const std::uint32_t batch = bounds.batch_size != 0 ? bounds.batch_size : host.batch_size;
    check_bound("batch_size", host.batch_size, batch);
    if (batch > 0 && bounds.lookup_stride == 0) {
      throw InvalidArgument("DeviceCollectionBounds: lookup_stride 0 for a batch of " +
                            std::to_string(batch) + " entries (each needs at least 1)");
    }
    if (batch > host.batch_size && bounds.padding_block == kNoPaddingBlock) {
      throw InvalidArgument("DeviceCollectionBounds: batch_size " + std::to_string(batch) +
                            " exceeds the host batch's " + std::to_string(host.batch_size) +
                            " without a padding_block for the entries past it");
    }
    padding_block_ = bounds.padding_block;
    desc_.batch_size = batch;
    desc_.lookup_stride = bounds.lookup_stride;
    desc_.max_seq_length = bounds.max_seq_length;
    desc_.max_cache_length = bounds.max_full_context_length;  // >= every history
    desc_.max_full_context_length = bounds.max_full_context_length;
    desc_.reserved_lengths = nullptr;  // host memory: not for the device
    lengths_ = DeviceBuffer<std::uint32_t>(batch);
    lookup_ = DeviceBuffer<std::uint32_t>(std::size_t{batch} * bounds.lookup_stride);
    if constexpr (is_fp8(dtype_of_v<T>)) {
      head_scales_ = DeviceBuffer<float>(std::size_t{host.num_layers} * 2 * host.n_kv_heads);
    }
    upload(host, stream);
    desc_.blocks = device_blocks;
    desc_.cache_lengths = lengths_.data();
    desc_.lookup_table = lookup_.data();
    desc_.head_scales = is_fp8(dtype_of_v<T>) ? head_scales_.data() : nullptr;
  }

  // Uploads another step's host metadata into the same device buffers (see
  // CUDA graphs above): its page table repacked into this collection's
  // lookup_stride, the entries past its own stride set to the sentinel
  // (num_blocks). The host desc is validated as in the constructor and must
  // match this collection's pool (num_blocks, num_layers, page_size,
  // n_kv_heads, head_dim, layout) and batch_size exactly (with a
  // padding_block: at most batch_size, the rest padded), and fit its bounds
  // (lookup_stride, max_seq_length, max_full_context_length): otherwise
  // InvalidArgument naming the value and the limit, and nothing is changed.
  // The descriptors keep the bounds, not the host's values.
  void update(const CacheDesc& host, CUstream_st* stream = nullptr) {
    validate(host);
    check_same("num_blocks", host.num_blocks, desc_.num_blocks);
    check_same("num_layers", host.num_layers, desc_.num_layers);
    check_same("page_size", host.page_size, desc_.page_size);
    check_same("n_kv_heads", host.n_kv_heads, desc_.n_kv_heads);
    check_same("head_dim", host.head_dim, desc_.head_dim);
    check_same("layout", static_cast<std::uint32_t>(host.layout),
               static_cast<std::uint32_t>(desc_.layout));
    check_same("arrangement", static_cast<std::uint32_t>(host.arrangement),
               static_cast<std::uint32_t>(desc_.arrangement));
    if (padding_block_ == kNoPaddingBlock) {
      check_same("batch_size", host.batch_size, desc_.batch_size);
    } else {
      check_bound("batch_size", host.batch_size, desc_.batch_size);
    }
    check_bound("lookup_stride", host.lookup_stride, desc_.lookup_stride);
    check_bound("max_seq_length", host.max_seq_length, desc_.max_seq_length);
    check_bound("max_full_context_length", host.max_full_context_length,
                desc_.max_full_context_length);
    check_bound("max_cache_length", host.max_cache_length, desc_.max_full_context_length);
    upload(host, stream);
  }

  // The device view of one layer's K (key) or V (value). Throws
  // InvalidArgument for layer >= num_layers.
  CacheDesc key(std::uint32_t layer) const { return desc_.layer(layer, 0); }
  CacheDesc value(std::uint32_t layer) const { return desc_.layer(layer, 1); }
  // The whole-cache descriptor with device pointers (blocks, cache_lengths,
  // lookup_table).
  const CacheDesc& desc() const { return desc_; }

 private:
  static void validate(const CacheDesc& h) {
    if (h.dtype != dtype_of_v<T>) {
      throw InvalidArgument("DeviceCollection<" + std::string(dtype_name(dtype_of_v<T>)) +
                            "> was given a cache of " + std::string(dtype_name(h.dtype)));
    }
    h.validate();
  }
  static void check_bound(const char* what, std::uint32_t value, std::uint32_t bound) {
    if (value > bound) {
      throw InvalidArgument(std::string("DeviceCollection: the host batch's ") + what + " " +
                            std::to_string(value) + " exceeds the collection's bound " +
                            std::to_string(bound));
    }
  }
  static void check_same(const char* what, std::uint32_t value, std::uint32_t want) {
    if (value != want) {
      throw InvalidArgument(std::string("DeviceCollection::update: the host batch's ") + what +
                            " " + std::to_string(value) + " differs from the collection's " +
                            std::to_string(want));
    }
  }
  // The host's lengths, and its page table repacked into desc_.lookup_stride
  // (sentinel-padded), into the device buffers; entries past the host batch
  // padded (cache_length 0, padding_block_ then the sentinel).
  void upload(const CacheDesc& host, CUstream_st* stream) {
    const std::size_t stride = desc_.lookup_stride;
    const std::uint32_t batch = desc_.batch_size;
    staging_.assign(std::size_t{batch} * stride, host.num_blocks);
    for (std::size_t b = 0; b < host.batch_size; ++b) {
      const std::uint32_t* row = host.lookup_table + b * host.lookup_stride;
      std::copy(row, row + host.lookup_stride, staging_.begin() + b * stride);
    }
    for (std::size_t b = host.batch_size; b < batch; ++b) staging_[b * stride] = padding_block_;
    lengths_staging_.assign(batch, 0);
    std::copy(host.cache_lengths, host.cache_lengths + host.batch_size, lengths_staging_.begin());
    lengths_.upload(lengths_staging_, stream);
    lookup_.upload(staging_, stream);
    if constexpr (is_fp8(dtype_of_v<T>)) {  // validate() saw them non-null
      scales_staging_.assign(host.head_scales, host.head_scales + head_scales_.size());
      head_scales_.upload(scales_staging_, stream);
    }
  }

  CacheDesc desc_;
  DeviceBuffer<std::uint32_t> lengths_;
  DeviceBuffer<std::uint32_t> lookup_;
  DeviceBuffer<float> head_scales_;  // fp8: [num_layers][2][n_kv_heads], uploaded each update
  std::uint32_t padding_block_ = kNoPaddingBlock;
  std::vector<std::uint32_t> staging_;          // upload()'s repacked page table
  std::vector<std::uint32_t> lengths_staging_;  // upload()'s padded lengths
  std::vector<float> scales_staging_;           // upload()'s fp8 scales
};

}  // namespace kvcache::cuda
