// kvcache/kvcache.h — umbrella header: the whole public API.
#pragma once

#include "kvcache/batch.h"
#include "kvcache/collection.h"
#include "kvcache/continuous_manager.h"
#include "kvcache/dtype.h"
#include "kvcache/error.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/kv_cache.h"
#include "kvcache/layer_kv_cache.h"
#include "kvcache/log.h"
#include "kvcache/manager.h"
#include "kvcache/metrics.h"
#include "kvcache/paged_manager.h"
#include "kvcache/params.h"
#include "kvcache/prefix_cache.h"
