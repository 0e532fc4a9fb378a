// kvcache/cuda/tier_transfers.h — a batch's tier transfers on a GPU pool.
//
// With tiers below a device pool, the manager keeps its own pool on the host
// as a bounce buffer and reports what must move (TierConfig::pool_apart,
// kvcache/batch.h, docs/tiers.md "A pool apart"). apply_tier_transfers does
// one fetch's transfers on the device pool, enqueued on `stream` in the
// order the batch documents:
//   1. block_offloads: device -> host, each page packed [2][num_layers]
//      [block] into its staging slot (`bytes`);
//   2. block_loads: host pool -> device pool, same page id;
//   3. block_copies: device -> device (copy_blocks).
// Several devices: call it once per device d, with batch.paged<T>(d).desc(),
// device d's pool and a stream of that device (the caller makes d current):
// it makes the offloads whose `device` is d, and every load and copy (each
// device holds its shard of every page).
// An interleaved pool moves one contiguous run per page; a per_layer pool
// 2 x num_layers runs per page, as strided 2-D copies (cudaMemcpy2DAsync:
// one per page for a load, one per K / V for an offload, whose packed form
// puts the layers' K first, then their V).
//
// The caller's order, per step:
//   KVCacheBatch batch = manager.fetch(...);
//   auto host = batch.paged<T>();
//   cuda::apply_tier_transfers(host.desc(), pool.data(), batch, stream);
//   ... DeviceCollection, store_kv / attention on `stream` ...
//   cuda::synchronize(stream);             // the offloads' bytes are in the slots
//   manager.complete_offloads(batch);      // the tier may read them now
//   manager.step(...);
// The copies only enqueue: the slots are read by the tier after
// complete_offloads, so the stream must have passed them before that call;
// the host pages of the loads must stay as they are until the stream has
// passed them, so synchronise before the manager's next fetch or
// match_prefix (either may start a load into a page the batch uploads).
// Register the host pool (kvcache/cuda/host_registration.h) so that the
// loads are asynchronous DMA, and the manager's staging slots
// (PagedKVCacheManager::tier_staging()) so that the offloads are; memory
// left pageable is copied by the runtime through its own pinned buffer.
//
// Throws InvalidArgument, with nothing enqueued, when T is not the cache's
// dtype, device is not one of the batch's devices (nor an offload's),
// device_pool is not device memory (when there is anything to move),
// host.blocks is null, a page or a copy's block is not a block of the pool
// (>= host.num_blocks), or an offload's bytes are not one page long;
// DeviceError when the runtime refuses a copy (the copies before it stay
// enqueued). Thread-safety: as the stream; the batch is only read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvcache/batch.h"
#include "kvcache/cache_desc.h"
#include "kvcache/cuda/device.h"
#include "kvcache/dtype.h"

namespace kvcache::cuda {

namespace detail {
// A pool's geometry in bytes: block b's run r (r = layer * 2 + kv for
// per_layer, one run for interleaved) at r * pitch + b * run_bytes.
struct PoolRuns {
  std::size_t run_bytes = 0;  // one layer's K or V of a block (per_layer), a block (interleaved)
  std::size_t runs = 1;       // 2 x num_layers (per_layer) or 1
  std::size_t pitch = 0;      // bytes between runs (per_layer): run_bytes x num_blocks
  std::uint32_t num_layers = 0;
  std::uint32_t num_blocks = 0;
};
// src/kernels/cuda/tier_transfers.cu: validates everything, then enqueues.
void apply_tier_transfers_cuda(const PoolRuns& pool, void* device_pool, const void* host_pool,
                               const KVCacheBatch& batch, CUstream_st* stream,
                               std::uint32_t device);
}  // namespace detail

template <CacheElement T>
void apply_tier_transfers(const CacheDesc& host, T* device_pool, const KVCacheBatch& batch,
                          CUstream_st* stream = nullptr, std::uint32_t device = 0) {
  if (host.dtype != dtype_of_v<T>) {
    throw InvalidArgument("apply_tier_transfers: a pool of " +
                          std::string(dtype_name(dtype_of_v<T>)) + " for a cache of " +
                          std::string(dtype_name(host.dtype)));
  }
  const std::size_t layer_bytes = host.block_elements() * sizeof(T);
  detail::PoolRuns pool;
  pool.num_layers = host.num_layers;
  pool.num_blocks = host.num_blocks;
  if (host.arrangement == PoolArrangement::per_layer) {
    pool.run_bytes = layer_bytes;
    pool.runs = 2 * std::size_t{host.num_layers};
    pool.pitch = layer_bytes * host.num_blocks;
  } else {
    pool.run_bytes = layer_bytes * 2 * host.num_layers;
    pool.pitch = pool.run_bytes;
  }
  detail::apply_tier_transfers_cuda(pool, device_pool, host.blocks, batch, stream, device);
}

}  // namespace kvcache::cuda
