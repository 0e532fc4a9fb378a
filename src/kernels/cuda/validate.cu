// Host-side argument checks of the CUDA kernels (validate.h).
#include <string>

#include "kvcache/cuda/device_buffer.h"
#include "kvcache/cuda/kernels.h"
#include "kvcache/error.h"
#include "validate.h"

namespace kvcache::cuda::detail {
namespace {

std::string str(std::uint64_t v) { return std::to_string(v); }

void check_positive(const char* what, std::uint64_t v) {
  if (v == 0) throw InvalidArgument(std::string("cache view ") + what + " is 0, must be >= 1");
}

void check_device_ptr(const char* what, const void* p) {
  if (p == nullptr) throw InvalidArgument(std::string(what) + " is null");
  if (!is_device_pointer(p)) {
    throw InvalidArgument(std::string(what) + " is not device memory (kvcache::cuda kernels " +
                          "take device pointers; see kvcache/cuda/device_collection.h)");
  }
}

}  // namespace

void check_cache_pair(const CacheDesc& k, const CacheDesc& v) {
  if (k.batch_size != v.batch_size || k.n_kv_heads != v.n_kv_heads || k.head_dim != v.head_dim ||
      k.page_size != v.page_size || k.block_stride != v.block_stride ||
      k.lookup_stride != v.lookup_stride || k.cache_lengths != v.cache_lengths ||
      k.lookup_table != v.lookup_table || k.layout != v.layout || k.dtype != v.dtype) {
    throw InvalidArgument("key and value caches differ in shape or batch (batch " +
                          str(k.batch_size) + " vs " + str(v.batch_size) + ", heads " +
                          str(k.n_kv_heads) + " vs " + str(v.n_kv_heads) + ", head_dim " +
                          str(k.head_dim) + " vs " + str(v.head_dim) + ", page_size " +
                          str(k.page_size) + " vs " + str(v.page_size) + ", block_stride " +
                          str(k.block_stride) + " vs " + str(v.block_stride) + ")");
  }
  if (k.head_dim > kMaxHeadDim) {
    throw InvalidArgument("head_dim " + str(k.head_dim) + " exceeds the CUDA kernels' limit " +
                          str(kMaxHeadDim));
  }
  const CacheDesc resolved = k.with_strides();
  if (k.token_stride != resolved.token_stride || k.head_stride != resolved.head_stride) {
    throw InvalidArgument("cache view token / head strides " + str(k.token_stride) + " / " +
                          str(k.head_stride) + " are not those of its geometry (" +
                          str(resolved.token_stride) + " / " + str(resolved.head_stride) +
                          "): take it from CacheDesc::layer()");
  }
  if (k.layout != PageLayout::nhd && k.layout != PageLayout::hnd) {
    throw InvalidArgument("cache view layout value " + str(static_cast<int>(k.layout)) +
                          " is not nhd or hnd");
  }
  check_positive("head_dim", k.head_dim);
  check_positive("n_kv_heads", k.n_kv_heads);
  check_positive("page_size", k.page_size);
  if (k.batch_size == 0) return;  // nothing will be read
  check_positive("lookup_stride", k.lookup_stride);
  check_positive("block_stride", k.block_stride);
  check_device_ptr("key cache blocks", k.blocks);
  check_device_ptr("value cache blocks", v.blocks);
  check_device_ptr("cache_lengths", k.cache_lengths);
  check_device_ptr("lookup_table", k.lookup_table);
  if (is_fp8(k.dtype)) {
    if (k.head_scales == nullptr || v.head_scales == nullptr) {
      throw InvalidArgument(std::string(dtype_name(k.dtype)) +
                            " cache view has no head_scales (its static K / V scales; "
                            "DeviceCollection uploads them)");
    }
    check_device_ptr("key head_scales", k.head_scales);
    check_device_ptr("value head_scales", v.head_scales);
  }
  if (has_page_scales(k.dtype) && k.head_dim % 4 != 0) {
    throw InvalidArgument("int8 cache head_dim " + str(k.head_dim) +
                          " is not a multiple of 4 (the page's scales stay 4-byte aligned)");
  }
}

void check_row_offsets_span(std::span<const std::uint32_t> row_offsets, std::uint32_t batch_size) {
  if (row_offsets.size() != std::size_t{batch_size} + 1) {
    throw InvalidArgument("row_offsets has " + str(row_offsets.size()) +
                          " entries, expected batch_size + 1 = " + str(batch_size + 1ull));
  }
  check_device_ptr("row_offsets", row_offsets.data());
}

std::size_t rows_of(const char* what, std::size_t n, std::size_t row) {
  if (n % row != 0) {
    throw InvalidArgument(std::string(what) + " has " + str(n) +
                          " elements, not a whole number of rows of " + str(row));
  }
  return n / row;
}

void check_device_span(const char* what, const void* p, std::size_t n) {
  if (n != 0) check_device_ptr(what, p);
}

}  // namespace kvcache::cuda::detail
