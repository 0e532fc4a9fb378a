// src/c_api/c_api_internal.h — what the C interface's sources share
// (c_api.cpp: status, parameters, managers, prefix cache, metrics and logging;
// c_api_kernels.cpp: batches, thread pools, kernels; c_api_tiers.cpp: the
// storage tiers): the handle structs, `guarded` (a C++ call to a kvc_status,
// no exception crossing into C), the argument checks and conversions.
// Internal: not installed; kvcache_c.map keeps these symbols out of
// libkvcache_c.so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "kvcache/batch.h"
#include "kvcache/c_api.h"
#include "kvcache/error.h"
#include "kvcache/manager.h"
#include "kvcache/paged_manager.h"
#include "kvcache/params.h"
#include "kvcache/prefix_cache.h"
#include "kvcache/thread_pool.h"
#include "kvcache/tier.h"

struct kvc_manager {
  std::unique_ptr<kvcache::KVCacheManager> impl;
};

struct kvc_batch {
  kvcache::KVCacheBatch batch;
  bool fetched = false;
  // batch.block_offloads() as C structs, rebuilt by kvc_batch_block_offloads
  // (a batch is used by one thread at a time).
  mutable std::vector<kvc_block_offload> offloads;
};

struct kvc_thread_pool {
  explicit kvc_thread_pool(std::size_t n) : pool(n) {}
  kvcache::ThreadPool pool;
};

// A tier handle shares the tier with every manager configured with it.
struct kvc_tier {
  std::shared_ptr<kvcache::Tier> impl;
  std::string name;  // NUL-terminated copy of impl->name()
};

namespace kvcache::c_api {

// Fills err (if any) with status and message (truncated to fit); logs a
// failure at debug. Returns status.
kvc_status report(kvc_error* err, kvc_status status, const char* message) noexcept;

// Runs fn; maps what it throws to a status (KVC_OK when nothing).
template <class F>
kvc_status guarded(kvc_error* err, F&& fn) noexcept {
  try {
    fn();
    return report(err, KVC_OK, "");
  } catch (const UnknownSequence& e) {
    return report(err, KVC_UNKNOWN_SEQUENCE, e.what());
  } catch (const OutOfPages& e) {
    return report(err, KVC_OUT_OF_PAGES, e.what());
  } catch (const CapacityExceeded& e) {
    return report(err, KVC_CAPACITY_EXCEEDED, e.what());
  } catch (const OutOfMemory& e) {
    return report(err, KVC_OUT_OF_MEMORY, e.what());
  } catch (const InvalidArgument& e) {
    return report(err, KVC_INVALID_ARGUMENT, e.what());
  } catch (const std::bad_alloc&) {
    return report(err, KVC_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return report(err, KVC_INTERNAL, e.what());
  } catch (...) {
    return report(err, KVC_INTERNAL, "unknown exception");
  }
}

// InvalidArgument "<name> is NULL" for a NULL p.
void require(const void* p, const char* name);
// An array of n elements: may be NULL only when n == 0.
void require_array(const void* p, std::size_t n, const char* name);

// The C++ enumerator of C value v, one of the `count` constants named in
// `allowed`; InvalidArgument naming the field and the value otherwise.
template <class E>
E from_c(std::int32_t v, std::int32_t count, const char* field, const char* allowed) {
  if (v < 0 || v >= count) {
    throw InvalidArgument(std::string(field) + " value " + std::to_string(v) + " is not " +
                          allowed);
  }
  return static_cast<E>(v);
}

// A C flag that must be 0 or 1; InvalidArgument naming the field otherwise.
bool flag(std::int32_t v, const char* field);

// Validated C++ params of a kvc_params (InvalidArgument naming the field).
KVCacheParams to_params(const kvc_params* p);

KVCacheManager& manager_of(kvc_manager* m);
const KVCacheManager& manager_of(const kvc_manager* m);
// The paged manager behind m; InvalidArgument naming `what` for a continuous one.
PagedKVCacheManager& paged_of(kvc_manager* m, const char* what);
const PagedKVCacheManager& paged_of(const kvc_manager* m, const char* what);

// c_api_tiers.cpp: the tiers part of a kvc_prefix_config (tiers, model_id,
// cache_salt, admission, staging_pages, pool_apart, offload_batch, offload_delay_us). Throws
// InvalidArgument naming the field.
TierConfig tier_config(const kvc_prefix_config& config);

// c_api.cpp: the whole kvc_prefix_config as C++ (policy, sizes, events, tiers).
// Throws InvalidArgument naming the field.
PrefixCacheConfig prefix_config(const kvc_prefix_config& config);

}  // namespace kvcache::c_api
