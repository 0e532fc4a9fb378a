// kvcache/cuda/device.h — the CUDA device error type and device queries.
//
// Part of the optional CUDA backend (CMake -DKVCACHE_CUDA=ON, docs/CUDA.md).
// Usable from plain C++: no CUDA header is included. Streams are passed as
// `CUstream_st*` (what cudaStream_t is); nullptr is the legacy null stream.
//
// Errors: every CUDA runtime failure is reported as kvcache::cuda::DeviceError
// (a kvcache::Error), whose message names the runtime call, CUDA's error
// string and, for allocations and copies, the size in bytes. Kernel faults
// that happen after a launch returned surface as DeviceError from the next
// call that synchronises (download, synchronize, ...).
// Thread-safety: these functions are safe to call from any thread.
#pragma once

#include <cstddef>
#include <string>

#include "kvcache/error.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace kvcache::cuda {

// A CUDA runtime call failed (out of device memory, no device, a kernel
// fault reported late, ...).
class DeviceError : public Error {
 public:
  using Error::Error;
};

// Number of CUDA devices the runtime sees; 0 when there is none or no usable
// driver (never throws for that).
int device_count();

// "NVIDIA H200 (sm_90, 132 SMs)" for the current device. Throws DeviceError.
std::string device_description();

// Blocks until all work queued on `stream` finished. Throws DeviceError with
// the first asynchronous error (e.g. a kernel's illegal address).
void synchronize(CUstream_st* stream = nullptr);

}  // namespace kvcache::cuda
