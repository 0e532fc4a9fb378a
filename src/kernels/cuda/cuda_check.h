// Internal: turning CUDA runtime errors into kvcache::cuda::DeviceError.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "kvcache/cuda/device.h"

namespace kvcache::cuda::detail {

// Throws DeviceError naming `call`, CUDA's error string and (if non-zero)
// `bytes` when `status` is not cudaSuccess. The runtime also keeps a
// non-sticky failure (a failed cudaMalloc, say) as its "last error": that is
// cleared here, or the next launch check would report it as its own.
inline void check_cuda(cudaError_t status, const char* call, std::size_t bytes = 0) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  std::string msg = std::string(call) + " failed: " + cudaGetErrorName(status) + " (" +
                    cudaGetErrorString(status) + ")";
  if (bytes != 0) msg += ", size " + std::to_string(bytes) + " bytes";
  throw DeviceError(msg);
}

inline cudaStream_t to_stream(CUstream_st* s) { return s; }

}  // namespace kvcache::cuda::detail
