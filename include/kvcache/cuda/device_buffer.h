// kvcache/cuda/device_buffer.h — an owning, typed device allocation.
//
// DeviceBuffer<T> owns `size()` elements of T in device memory (cudaMalloc),
// freed by its destructor. Move-only; a moved-from buffer is empty. The
// contents of a new buffer are undefined (not zeroed).
// Copies (upload / download / to_host / fill_bytes) are ordered on the given
// stream and return when they completed, so the host span may be reused at
// once. Sizes are checked: a host span whose size differs from size() throws
// InvalidArgument naming both sizes, and nothing is copied.
// Failures of the CUDA runtime throw DeviceError (kvcache/cuda/device.h)
// naming the call, CUDA's error string and the size in bytes; the buffer is
// then unchanged (a failed constructor allocates nothing).
// Thread-safety: like a std::vector — concurrent const use is safe, anything
// else needs external synchronisation.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvcache/cuda/device.h"
#include "kvcache/error.h"

namespace kvcache::cuda {

namespace detail {
// Thin wrappers over the CUDA runtime (src/kernels/cuda/device.cu); each
// throws DeviceError on failure.
void* device_allocate(std::size_t bytes);
void device_free(void* p) noexcept;
void copy_to_device(void* dst, const void* src, std::size_t bytes, CUstream_st* stream);
void copy_to_host(void* dst, const void* src, std::size_t bytes, CUstream_st* stream);
void fill_device_bytes(void* dst, unsigned char value, std::size_t bytes, CUstream_st* stream);
// Whether p points into device (or managed) memory of the CUDA runtime.
bool is_device_pointer(const void* p);
}  // namespace detail

template <class T>
requires std::is_trivially_copyable_v<T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates n elements (n == 0: empty, no allocation). Throws DeviceError.
  explicit DeviceBuffer(std::size_t n)
      : data_(n == 0 ? nullptr : static_cast<T*>(detail::device_allocate(n * sizeof(T)))),
        size_(n) {}
  // A buffer holding a copy of `host`.
  static DeviceBuffer from_host(std::span<const T> host, CUstream_st* stream = nullptr) {
    DeviceBuffer b(host.size());
    b.upload(host, stream);
    return b;
  }

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      detail::device_free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { detail::device_free(data_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }
  // The device memory as a span (for the kernels; never dereference on the host).
  std::span<T> span() { return {data_, size_}; }
  std::span<const T> span() const { return {data_, size_}; }

  // Copies host.size() == size() elements host -> device.
  void upload(std::span<const T> host, CUstream_st* stream = nullptr) {
    check_size("upload", host.size());
    detail::copy_to_device(data_, host.data(), bytes(), stream);
  }
  // Copies size() elements device -> host.size() == size() elements.
  void download(std::span<T> host, CUstream_st* stream = nullptr) const {
    check_size("download", host.size());
    detail::copy_to_host(host.data(), data_, bytes(), stream);
  }
  std::vector<T> to_host(CUstream_st* stream = nullptr) const {
    std::vector<T> v(size_);
    download(v, stream);
    return v;
  }
  // Sets every byte to `value` (e.g. 0xff: every float a NaN).
  void fill_bytes(unsigned char value, CUstream_st* stream = nullptr) {
    detail::fill_device_bytes(data_, value, bytes(), stream);
  }

 private:
  void check_size(const char* what, std::size_t host_size) const {
    if (host_size != size_) {
      throw InvalidArgument(std::string("DeviceBuffer::") + what + ": host span has " +
                            std::to_string(host_size) + " elements, the buffer " +
                            std::to_string(size_));
    }
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kvcache::cuda
