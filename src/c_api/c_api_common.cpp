// The C interface's shared pieces (src/c_api/c_api_internal.h): reporting a
// status, the argument checks, the C parameters as C++ ones, the manager
// handles; kvc_status_name. The C constants are pinned to the C++
// enumerators here.
#include <algorithm>
#include <cstring>
#include <string>

#include "c_api/c_api_internal.h"
#include "kvcache/kernels/options.h"
#include "kvcache/log.h"

namespace kvcache::c_api {

kvc_status report(kvc_error* err, kvc_status status, const char* message) noexcept {
  if (err != nullptr) {
    err->status = status;
    const std::size_t n = std::min(std::strlen(message), sizeof(err->message) - 1);
    std::memcpy(err->message, message, n);
    err->message[n] = '\0';
  }
  if (status != KVC_OK && log_enabled(LogLevel::debug)) {
    try {
      log(LogLevel::debug,
          std::string("C interface: returning ") + kvc_status_name(status) + ": " + message);
    } catch (...) {  // no memory for the line: the status still goes back
    }
  }
  return status;
}

void require(const void* p, const char* name) {
  if (p == nullptr) throw InvalidArgument(std::string(name) + " is NULL");
}

void require_array(const void* p, std::size_t n, const char* name) {
  if (p == nullptr && n != 0) {
    throw InvalidArgument(std::string(name) + " is NULL with " + std::to_string(n) + " elements");
  }
}

bool flag(std::int32_t v, const char* field) {
  if (v != 0 && v != 1) {
    throw InvalidArgument(std::string(field) + " is " + std::to_string(v) + ", must be 0 or 1");
  }
  return v == 1;
}

// The C constants are the C++ enumerators' values, in the same order (pinned
// here), so a C value converts by a range check and a cast.
static_assert(KVC_DTYPE_F32 == static_cast<int>(DType::f32) &&
              KVC_DTYPE_F16 == static_cast<int>(DType::f16) &&
              KVC_DTYPE_BF16 == static_cast<int>(DType::bf16) &&
              KVC_DTYPE_FP8_E4M3 == static_cast<int>(DType::fp8_e4m3) &&
              KVC_DTYPE_FP8_E5M2 == static_cast<int>(DType::fp8_e5m2) &&
              KVC_DTYPE_INT8 == static_cast<int>(DType::int8));
static_assert(KVC_STRATEGY_CONTINUOUS == static_cast<int>(CacheStrategy::continuous) &&
              KVC_STRATEGY_PAGED == static_cast<int>(CacheStrategy::paged));
static_assert(KVC_LAYOUT_NHD == static_cast<int>(PageLayout::nhd) &&
              KVC_LAYOUT_HND == static_cast<int>(PageLayout::hnd));
static_assert(KVC_ARRANGEMENT_INTERLEAVED == static_cast<int>(PoolArrangement::interleaved) &&
              KVC_ARRANGEMENT_PER_LAYER == static_cast<int>(PoolArrangement::per_layer));
static_assert(KVC_EVICT_LRU == static_cast<int>(EvictionPolicyKind::lru) &&
              KVC_EVICT_S3FIFO == static_cast<int>(EvictionPolicyKind::s3fifo) &&
              KVC_EVICT_TIERED == static_cast<int>(EvictionPolicyKind::tiered) &&
              KVC_EVICT_INTERVAL == static_cast<int>(EvictionPolicyKind::interval) &&
              KVC_EVICT_ADAPTIVE == static_cast<int>(EvictionPolicyKind::adaptive));
static_assert(KVC_LOG_TRACE == static_cast<int>(LogLevel::trace) &&
              KVC_LOG_DEBUG == static_cast<int>(LogLevel::debug) &&
              KVC_LOG_INFO == static_cast<int>(LogLevel::info) &&
              KVC_LOG_WARN == static_cast<int>(LogLevel::warn) &&
              KVC_LOG_ERROR == static_cast<int>(LogLevel::error) &&
              KVC_LOG_OFF == static_cast<int>(LogLevel::off));
static_assert(KVC_REUSE_UNKNOWN == static_cast<int>(ReuseHint::unknown) &&
              KVC_REUSE_UNLIKELY == static_cast<int>(ReuseHint::unlikely) &&
              KVC_REUSE_LIKELY == static_cast<int>(ReuseHint::likely));
static_assert(KVC_PRECISION_FP32 == static_cast<int>(AttentionPrecision::fp32) &&
              KVC_PRECISION_BF16 == static_cast<int>(AttentionPrecision::bf16));
static_assert(KVC_PREFETCH_AUTOMATIC == static_cast<int>(AttentionPrefetch::automatic) &&
              KVC_PREFETCH_NEXT_STEP_L1 == static_cast<int>(AttentionPrefetch::next_step_l1) &&
              KVC_PREFETCH_NEXT_TILE_L2 == static_cast<int>(AttentionPrefetch::next_tile_l2) &&
              KVC_PREFETCH_NONE == static_cast<int>(AttentionPrefetch::none) &&
              KVC_PREFETCH_NEXT_TILE_L1 == static_cast<int>(AttentionPrefetch::next_tile_l1));

KVCacheParams to_params(const kvc_params* p) {
  require(p, "params");
  KVCacheParams params;
  params.dtype = from_c<DType>(
      p->dtype, 6, "params->dtype",
      "KVC_DTYPE_F32, KVC_DTYPE_F16, KVC_DTYPE_BF16, KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2 or "
      "KVC_DTYPE_INT8");
  params.num_layers = p->num_layers;
  params.n_kv_heads = p->n_kv_heads;
  params.head_dim = p->head_dim;
  params.cache_strategy = from_c<CacheStrategy>(p->strategy, 2, "params->strategy",
                                                "KVC_STRATEGY_CONTINUOUS or KVC_STRATEGY_PAGED");
  params.page_size = p->page_size;
  params.enable_prefix_caching = flag(p->enable_prefix_caching, "params->enable_prefix_caching");
  params.page_layout = from_c<PageLayout>(p->page_layout, 2, "params->page_layout",
                                          "KVC_LAYOUT_NHD or KVC_LAYOUT_HND");
  params.pool_arrangement =
      from_c<PoolArrangement>(p->pool_arrangement, 2, "params->pool_arrangement",
                              "KVC_ARRANGEMENT_INTERLEAVED or KVC_ARRANGEMENT_PER_LAYER");
  params.n_devices = p->n_devices == 0 ? 1 : p->n_devices;
  params.validate();
  return params;
}

KVCacheManager& manager_of(kvc_manager* m) {
  require(m, "manager");
  return *m->impl;
}
const KVCacheManager& manager_of(const kvc_manager* m) {
  require(m, "manager");
  return *m->impl;
}

PagedKVCacheManager& paged_of(kvc_manager* m, const char* what) {
  require(m, "manager");
  PagedKVCacheManager* paged = manager_of(m).paged();
  if (paged == nullptr) {
    throw InvalidArgument(std::string(what) + " needs the paged strategy; this manager is " +
                          "continuous");
  }
  return *paged;
}
const PagedKVCacheManager& paged_of(const kvc_manager* m, const char* what) {
  require(m, "manager");
  const PagedKVCacheManager* paged = manager_of(m).paged();
  if (paged == nullptr) {
    throw InvalidArgument(std::string(what) + " needs the paged strategy; this manager is " +
                          "continuous");
  }
  return *paged;
}

}  // namespace kvcache::c_api

extern "C" {

const char* kvc_status_name(int32_t status) {
  switch (status) {
    case KVC_OK:
      return "ok";
    case KVC_INVALID_ARGUMENT:
      return "invalid_argument";
    case KVC_UNKNOWN_SEQUENCE:
      return "unknown_sequence";
    case KVC_OUT_OF_PAGES:
      return "out_of_pages";
    case KVC_CAPACITY_EXCEEDED:
      return "capacity_exceeded";
    case KVC_OUT_OF_MEMORY:
      return "out_of_memory";
    case KVC_INTERNAL:
      return "internal";
  }
  return "unknown";
}

}  // extern "C"
