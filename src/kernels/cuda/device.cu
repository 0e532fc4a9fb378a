// The CUDA runtime wrappers behind kvcache/cuda/device.h and device_buffer.h.
#include <cuda_runtime.h>

#include <string>

#include "cuda_check.h"
#include "kvcache/cuda/device.h"
#include "kvcache/cuda/device_buffer.h"
#include "kvcache/cuda/device_collection.h"

namespace kvcache::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" status
    return 0;
  }
  return n;
}

std::string device_description() {
  int dev = 0;
  detail::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  detail::check_cuda(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
         std::to_string(prop.l2CacheSize >> 20) + " MiB L2)";
}

void synchronize(CUstream_st* stream) {
  detail::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

namespace detail {

void* device_allocate(std::size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), "cudaMalloc", bytes);
  return p;
}

void device_free(void* p) noexcept {
  if (p != nullptr) (void)cudaFree(p);
}

void copy_to_device(void* dst, const void* src, std::size_t bytes, CUstream_st* stream) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(host to device)", bytes);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize after upload", bytes);
}

void copy_to_host(void* dst, const void* src, std::size_t bytes, CUstream_st* stream) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync(device to host)", bytes);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize after download", bytes);
}

void fill_device_bytes(void* dst, unsigned char value, std::size_t bytes, CUstream_st* stream) {
  if (bytes == 0) return;
  check_cuda(cudaMemsetAsync(dst, value, bytes, stream), "cudaMemsetAsync", bytes);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize after memset", bytes);
}

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

void copy_blocks_cuda(void* device_pool, std::size_t chunk_bytes, std::size_t chunks,
                      std::size_t pitch_bytes, std::uint32_t num_blocks,
                      std::span<const BlockCopy> copies, CUstream_st* stream) {
  if (copies.empty()) return;
  if (!is_device_pointer(device_pool)) {
    throw InvalidArgument("copy_blocks: device_pool is not device memory");
  }
  for (std::size_t i = 0; i < copies.size(); ++i) {
    for (const std::uint32_t block : {copies[i].src, copies[i].dst}) {
      if (block >= num_blocks) {
        throw InvalidArgument("copy_blocks: copies[" + std::to_string(i) + "] names block " +
                              std::to_string(block) + ", the pool has " +
                              std::to_string(num_blocks) + " blocks");
      }
    }
  }
  auto* base = static_cast<unsigned char*>(device_pool);
  for (const BlockCopy& c : copies) {
    if (c.src == c.dst) continue;
    check_cuda(cudaMemcpy2DAsync(base + std::size_t{c.dst} * chunk_bytes, pitch_bytes,
                                 base + std::size_t{c.src} * chunk_bytes, pitch_bytes, chunk_bytes,
                                 chunks, cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpy2DAsync(copy_blocks)", chunk_bytes * chunks);
  }
}

}  // namespace detail
}  // namespace kvcache::cuda
