// kvcache/kvcache.h — umbrella header: the whole public C++ API of the core
// library (target kvcache::kvcache, libkvcache.a): dtypes, params, errors,
// views, batches, the managers and the prefix cache, the reference and fast
// CPU kernels (attention, store_kv, RoPE and its table, the ISA choice, the
// bandwidth probes), the storage tiers (host, disk), the thread pool and the
// version.
//
// Not included, because each is a separate target or language: the engine
// (kvcache/engine/*, kvcache::engine), trace replay (kvcache/replay/*,
// kvcache::replay), the CUDA backend (kvcache/cuda/*, kvcache::cuda) and the
// C interface (kvcache/c_api.h, for C callers; kvcache::c or kvcache::kvcache).
//
// kvcache needs C++20. Compiled as an older C++, this header stops with one
// #error instead of hundreds of errors from the headers below.
#pragma once

#if defined(_MSVC_LANG) ? _MSVC_LANG < 202002L : __cplusplus < 202002L
#error "kvcache needs C++20: compile with -std=c++20 or later (CMake: cxx_std_20)"
#else

#include "kvcache/batch.h"
#include "kvcache/cache_desc.h"
#include "kvcache/collection.h"
#include "kvcache/continuous_manager.h"
#include "kvcache/disk_tier.h"
#include "kvcache/dtype.h"
#include "kvcache/error.h"
#include "kvcache/host_tier.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/bandwidth.h"
#include "kvcache/kernels/isa.h"
#include "kvcache/kernels/options.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/kernels/rope.h"
#include "kvcache/kernels/rope_table.h"
#include "kvcache/kv_scales.h"
#include "kvcache/kv_cache.h"
#include "kvcache/layer_kv_cache.h"
#include "kvcache/log.h"
#include "kvcache/manager.h"
#include "kvcache/metrics.h"
#include "kvcache/paged_manager.h"
#include "kvcache/params.h"
#include "kvcache/prefix_cache.h"
#include "kvcache/thread_pool.h"
#include "kvcache/tier.h"
#include "kvcache/tier_policy.h"
#include "kvcache/version.h"
#include "kvcache/write_through_tier.h"

#endif
