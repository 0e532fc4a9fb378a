// A pool apart's transfers on the device (kvcache/cuda/tier_transfers.h) and
// pinned host memory (kvcache/cuda/host_registration.h).
#include <cuda_runtime.h>

#include <string>

#include "cuda_check.h"
#include "kvcache/cuda/device_buffer.h"
#include "kvcache/cuda/device_collection.h"
#include "kvcache/cuda/host_registration.h"
#include "kvcache/cuda/tier_transfers.h"

namespace kvcache::cuda {

HostRegistration::HostRegistration(void* data, std::size_t bytes) {
  if (data == nullptr || bytes == 0) {
    throw InvalidArgument(
        "HostRegistration: " + std::string(data == nullptr ? "a null pointer" : "0 bytes") +
        " (it pins an existing range of at least 1 byte)");
  }
  detail::check_cuda(cudaHostRegister(data, bytes, cudaHostRegisterDefault), "cudaHostRegister",
                     bytes);
  data_ = data;
  bytes_ = bytes;
}

void HostRegistration::release() noexcept {
  if (data_ != nullptr) (void)cudaHostUnregister(data_);
  data_ = nullptr;
  bytes_ = 0;
}

namespace detail {

namespace {

void check_block(const char* list, std::size_t i, std::uint32_t block, std::uint32_t num_blocks) {
  if (block >= num_blocks) {
    throw InvalidArgument("apply_tier_transfers: " + std::string(list) + "[" + std::to_string(i) +
                          "] names block " + std::to_string(block) + ", the pool has " +
                          std::to_string(num_blocks) + " blocks");
  }
}

void check_device(const char* what, std::uint32_t device, std::uint32_t n_devices) {
  if (device >= n_devices) {
    throw InvalidArgument("apply_tier_transfers: " + std::string(what) + " " +
                          std::to_string(device) + " is not a device of the batch (it has " +
                          std::to_string(n_devices) + ")");
  }
}

void validate(const PoolRuns& pool, const void* device_pool, const void* host_pool,
              const KVCacheBatch& batch, std::uint32_t device) {
  const std::size_t page_bytes = pool.run_bytes * pool.runs;
  check_device("device", device, batch.params().n_devices);
  for (std::size_t i = 0; i < batch.block_offloads().size(); ++i) {
    const BlockOffload& o = batch.block_offloads()[i];
    check_block("block_offloads", i, o.page, pool.num_blocks);
    check_device("an offload's device", o.device, batch.params().n_devices);
    if (o.bytes.size() != page_bytes || o.bytes.data() == nullptr) {
      throw InvalidArgument("apply_tier_transfers: block_offloads[" + std::to_string(i) + "] has " +
                            std::to_string(o.bytes.size()) + " bytes, a page of this pool " +
                            std::to_string(page_bytes));
    }
  }
  for (std::size_t i = 0; i < batch.block_loads().size(); ++i)
    check_block("block_loads", i, batch.block_loads()[i], pool.num_blocks);
  for (std::size_t i = 0; i < batch.block_copies().size(); ++i) {
    check_block("block_copies", i, batch.block_copies()[i].src, pool.num_blocks);
    check_block("block_copies", i, batch.block_copies()[i].dst, pool.num_blocks);
  }
  const bool any = !batch.block_offloads().empty() || !batch.block_loads().empty() ||
                   !batch.block_copies().empty();
  if (any && !is_device_pointer(device_pool)) {
    throw InvalidArgument("apply_tier_transfers: device_pool is not device memory");
  }
  if (!batch.block_loads().empty() && host_pool == nullptr) {
    throw InvalidArgument("apply_tier_transfers: the host desc's blocks are null");
  }
}

// Page `page` of the device pool, packed [2][num_layers][block] into `out`.
void offload(const PoolRuns& pool, const unsigned char* dev, std::uint32_t page, std::byte* out,
             cudaStream_t stream) {
  const std::size_t page_bytes = pool.run_bytes * pool.runs;
  if (pool.runs == 1) {
    check_cuda(cudaMemcpyAsync(out, dev + std::size_t{page} * page_bytes, page_bytes,
                               cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(tier offload)", page_bytes);
    return;
  }
  // per_layer: run (layer, kv) at (layer * 2 + kv) * pitch; packed at (kv * L + layer).
  for (std::size_t kv = 0; kv < 2; ++kv) {
    check_cuda(cudaMemcpy2DAsync(out + kv * pool.num_layers * pool.run_bytes, pool.run_bytes,
                                 dev + kv * pool.pitch + std::size_t{page} * pool.run_bytes,
                                 2 * pool.pitch, pool.run_bytes, pool.num_layers,
                                 cudaMemcpyDeviceToHost, stream),
               "cudaMemcpy2DAsync(tier offload)", pool.run_bytes * pool.num_layers);
  }
}

// Page `page` of the host pool into the same page of the device pool.
void load(const PoolRuns& pool, unsigned char* dev, const unsigned char* host, std::uint32_t page,
          cudaStream_t stream) {
  const std::size_t at = std::size_t{page} * pool.run_bytes;
  if (pool.runs == 1) {
    check_cuda(cudaMemcpyAsync(dev + at, host + at, pool.run_bytes, cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync(tier load)", pool.run_bytes);
    return;
  }
  check_cuda(cudaMemcpy2DAsync(dev + at, pool.pitch, host + at, pool.pitch, pool.run_bytes,
                               pool.runs, cudaMemcpyHostToDevice, stream),
             "cudaMemcpy2DAsync(tier load)", pool.run_bytes * pool.runs);
}

}  // namespace

void apply_tier_transfers_cuda(const PoolRuns& pool, void* device_pool, const void* host_pool,
                               const KVCacheBatch& batch, CUstream_st* stream,
                               std::uint32_t device) {
  validate(pool, device_pool, host_pool, batch, device);
  auto* dev = static_cast<unsigned char*>(device_pool);
  for (const BlockOffload& o : batch.block_offloads())
    if (o.device == device) offload(pool, dev, o.page, o.bytes.data(), stream);
  for (std::uint32_t page : batch.block_loads())
    load(pool, dev, static_cast<const unsigned char*>(host_pool), page, stream);
  copy_blocks_cuda(device_pool, pool.run_bytes, pool.runs, pool.pitch, pool.num_blocks,
                   batch.block_copies(), stream);
}

}  // namespace detail
}  // namespace kvcache::cuda
