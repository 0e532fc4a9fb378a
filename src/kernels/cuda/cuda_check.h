// Internal: turning CUDA runtime errors into kvcache::cuda::DeviceError.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "kvcache/cuda/device.h"

namespace kvcache::cuda::detail {

// Throws DeviceError naming `call`, CUDA's error string and (if non-zero)
// `bytes` when `status` is not cudaSuccess.
inline void check_cuda(cudaError_t status, const char* call, std::size_t bytes = 0) {
  if (status == cudaSuccess) return;
  std::string msg = std::string(call) + " failed: " + cudaGetErrorName(status) + " (" +
                    cudaGetErrorString(status) + ")";
  if (bytes != 0) msg += ", size " + std::to_string(bytes) + " bytes";
  throw DeviceError(msg);
}

inline cudaStream_t to_stream(CUstream_st* s) { return s; }

}  // namespace kvcache::cuda::detail
