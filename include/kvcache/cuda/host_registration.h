// kvcache/cuda/host_registration.h — host memory pinned for the GPU (RAII).
//
// HostRegistration page-locks an existing host range with cudaHostRegister
// and unregisters it when it goes, so that copies between it and device
// memory are direct DMA that cudaMemcpyAsync can overlap with kernels (from
// pageable memory the runtime stages every copy through a pinned buffer of
// its own, synchronously). The use here: the manager's host pool, the bounce
// buffer of a pool apart's loads (kvcache/cuda/tier_transfers.h):
//   kvcache::cuda::HostRegistration pinned(
//       batch.blocks(), kvcache::PagedKVCacheManager::estimated_memory_size(params, pages));
// Pinning takes the range out of the OS's paging: register what the copies
// need, once, not per step (a registration costs milliseconds per GiB).
//
// Invariants: a non-empty registration covers exactly [data(), data() +
// bytes()); the memory stays owned by whoever owned it and must outlive the
// registration. A range that overlaps one registered already is refused by
// the runtime (DeviceError).
// Ownership: owns the registration, not the memory. Move-only; a moved-from
// registration is empty.
// Throws: InvalidArgument for a null pointer or 0 bytes (nothing
// registered); DeviceError when the runtime refuses (no device, a range
// registered already, past the limits of locked memory).
// Thread-safety: like a value; the runtime calls themselves are thread-safe.
#pragma once

#include <cstddef>
#include <utility>

#include "kvcache/cuda/device.h"

namespace kvcache::cuda {

class HostRegistration {
 public:
  HostRegistration() = default;
  HostRegistration(void* data, std::size_t bytes);
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  HostRegistration(HostRegistration&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  HostRegistration& operator=(HostRegistration&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~HostRegistration() { release(); }

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace kvcache::cuda
