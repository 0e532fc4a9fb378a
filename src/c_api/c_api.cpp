// The C interface (include/kvcache/c_api.h) over the C++ API: handles own
// the C++ objects, every entry point runs inside `guarded`, which turns the
// library's typed exceptions into a kvc_status and a message and lets no
// exception cross into C.
#include "kvcache/c_api.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kvcache/batch.h"
#include "kvcache/continuous_manager.h"
#include "kvcache/error.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/log.h"
#include "kvcache/metrics.h"
#include "kvcache/paged_manager.h"
#include "kvcache/params.h"
#include "kvcache/prefix_cache.h"
#include "kvcache/thread_pool.h"

struct kvc_manager {
  std::unique_ptr<kvcache::KVCacheManager> impl;
};

struct kvc_batch {
  kvcache::KVCacheBatch batch;
  bool fetched = false;
};

struct kvc_thread_pool {
  explicit kvc_thread_pool(std::size_t n) : pool(n) {}
  kvcache::ThreadPool pool;
};

namespace {

using kvcache::InvalidArgument;

kvc_status report(kvc_error* err, kvc_status status, const char* message) {
  if (err != nullptr) {
    err->status = status;
    const std::size_t n = std::min(std::strlen(message), sizeof(err->message) - 1);
    std::memcpy(err->message, message, n);
    err->message[n] = '\0';
  }
  if (status != KVC_OK && kvcache::log_enabled(kvcache::LogLevel::debug)) {
    try {
      kvcache::log(kvcache::LogLevel::debug, std::string("C interface: returning ") +
                                                 kvc_status_name(status) + ": " + message);
    } catch (...) {  // no memory for the line: the status still goes back
    }
  }
  return status;
}

// Runs fn; maps what it throws to a status (KVC_OK when nothing).
template <class F>
kvc_status guarded(kvc_error* err, F&& fn) noexcept {
  try {
    fn();
    return report(err, KVC_OK, "");
  } catch (const kvcache::UnknownSequence& e) {
    return report(err, KVC_UNKNOWN_SEQUENCE, e.what());
  } catch (const kvcache::OutOfPages& e) {
    return report(err, KVC_OUT_OF_PAGES, e.what());
  } catch (const kvcache::CapacityExceeded& e) {
    return report(err, KVC_CAPACITY_EXCEEDED, e.what());
  } catch (const kvcache::OutOfMemory& e) {
    return report(err, KVC_OUT_OF_MEMORY, e.what());
  } catch (const kvcache::InvalidArgument& e) {
    return report(err, KVC_INVALID_ARGUMENT, e.what());
  } catch (const std::bad_alloc&) {
    return report(err, KVC_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return report(err, KVC_INTERNAL, e.what());
  } catch (...) {
    return report(err, KVC_INTERNAL, "unknown exception");
  }
}

void require(const void* p, const char* name) {
  if (p == nullptr) throw InvalidArgument(std::string(name) + " is NULL");
}

// An array of n elements: may be NULL only when n == 0.
void require_array(const void* p, std::size_t n, const char* name) {
  if (p == nullptr && n != 0) {
    throw InvalidArgument(std::string(name) + " is NULL with " + std::to_string(n) + " elements");
  }
}

// The C constants are the C++ enumerators' values, in the same order (pinned
// here), so a C value converts by a range check and a cast.
static_assert(KVC_DTYPE_F32 == static_cast<int>(kvcache::DType::f32) &&
              KVC_DTYPE_F16 == static_cast<int>(kvcache::DType::f16) &&
              KVC_DTYPE_BF16 == static_cast<int>(kvcache::DType::bf16) &&
              KVC_DTYPE_FP8_E4M3 == static_cast<int>(kvcache::DType::fp8_e4m3) &&
              KVC_DTYPE_FP8_E5M2 == static_cast<int>(kvcache::DType::fp8_e5m2) &&
              KVC_DTYPE_INT8 == static_cast<int>(kvcache::DType::int8));
static_assert(KVC_STRATEGY_CONTINUOUS == static_cast<int>(kvcache::CacheStrategy::continuous) &&
              KVC_STRATEGY_PAGED == static_cast<int>(kvcache::CacheStrategy::paged));
static_assert(KVC_LAYOUT_NHD == static_cast<int>(kvcache::PageLayout::nhd) &&
              KVC_LAYOUT_HND == static_cast<int>(kvcache::PageLayout::hnd));
static_assert(KVC_ARRANGEMENT_INTERLEAVED ==
                  static_cast<int>(kvcache::PoolArrangement::interleaved) &&
              KVC_ARRANGEMENT_PER_LAYER == static_cast<int>(kvcache::PoolArrangement::per_layer));
static_assert(KVC_EVICT_LRU == static_cast<int>(kvcache::EvictionPolicyKind::lru) &&
              KVC_EVICT_S3FIFO == static_cast<int>(kvcache::EvictionPolicyKind::s3fifo) &&
              KVC_EVICT_TIERED == static_cast<int>(kvcache::EvictionPolicyKind::tiered) &&
              KVC_EVICT_INTERVAL == static_cast<int>(kvcache::EvictionPolicyKind::interval) &&
              KVC_EVICT_ADAPTIVE == static_cast<int>(kvcache::EvictionPolicyKind::adaptive));
static_assert(KVC_LOG_TRACE == static_cast<int>(kvcache::LogLevel::trace) &&
              KVC_LOG_DEBUG == static_cast<int>(kvcache::LogLevel::debug) &&
              KVC_LOG_INFO == static_cast<int>(kvcache::LogLevel::info) &&
              KVC_LOG_WARN == static_cast<int>(kvcache::LogLevel::warn) &&
              KVC_LOG_ERROR == static_cast<int>(kvcache::LogLevel::error) &&
              KVC_LOG_OFF == static_cast<int>(kvcache::LogLevel::off));
static_assert(KVC_REUSE_UNKNOWN == static_cast<int>(kvcache::ReuseHint::unknown) &&
              KVC_REUSE_UNLIKELY == static_cast<int>(kvcache::ReuseHint::unlikely) &&
              KVC_REUSE_LIKELY == static_cast<int>(kvcache::ReuseHint::likely));
static_assert(KVC_PRECISION_FP32 == static_cast<int>(kvcache::AttentionPrecision::fp32) &&
              KVC_PRECISION_BF16 == static_cast<int>(kvcache::AttentionPrecision::bf16));
static_assert(
    KVC_PREFETCH_AUTOMATIC == static_cast<int>(kvcache::AttentionPrefetch::automatic) &&
    KVC_PREFETCH_NEXT_STEP_L1 == static_cast<int>(kvcache::AttentionPrefetch::next_step_l1) &&
    KVC_PREFETCH_NEXT_TILE_L2 == static_cast<int>(kvcache::AttentionPrefetch::next_tile_l2) &&
    KVC_PREFETCH_NONE == static_cast<int>(kvcache::AttentionPrefetch::none) &&
    KVC_PREFETCH_NEXT_TILE_L1 == static_cast<int>(kvcache::AttentionPrefetch::next_tile_l1));

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

kvcache::KVCacheParams to_params(const kvc_params* p) {
  require(p, "params");
  if (p->enable_prefix_caching != 0 && p->enable_prefix_caching != 1) {
    throw InvalidArgument("params->enable_prefix_caching is " +
                          std::to_string(p->enable_prefix_caching) + ", must be 0 or 1");
  }
  kvcache::KVCacheParams params;
  params.dtype = from_c<kvcache::DType>(
      p->dtype, 6, "params->dtype",
      "KVC_DTYPE_F32, KVC_DTYPE_F16, KVC_DTYPE_BF16, KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2 or "
      "KVC_DTYPE_INT8");
  params.num_layers = p->num_layers;
  params.n_kv_heads = p->n_kv_heads;
  params.head_dim = p->head_dim;
  params.cache_strategy = from_c<kvcache::CacheStrategy>(
      p->strategy, 2, "params->strategy", "KVC_STRATEGY_CONTINUOUS or KVC_STRATEGY_PAGED");
  params.page_size = p->page_size;
  params.enable_prefix_caching = p->enable_prefix_caching == 1;
  params.page_layout = from_c<kvcache::PageLayout>(p->page_layout, 2, "params->page_layout",
                                                   "KVC_LAYOUT_NHD or KVC_LAYOUT_HND");
  params.pool_arrangement =
      from_c<kvcache::PoolArrangement>(p->pool_arrangement, 2, "params->pool_arrangement",
                                       "KVC_ARRANGEMENT_INTERLEAVED or KVC_ARRANGEMENT_PER_LAYER");
  params.validate();
  return params;
}

// A handle owning a paged manager.
kvc_manager* wrap(std::unique_ptr<kvcache::PagedKVCacheManager> paged) {
  auto m = std::make_unique<kvc_manager>();
  m->impl = std::move(paged);
  return m.release();
}

kvcache::KVCacheManager& manager_of(kvc_manager* m) {
  require(m, "manager");
  return *m->impl;
}
const kvcache::KVCacheManager& manager_of(const kvc_manager* m) {
  require(m, "manager");
  return *m->impl;
}

kvcache::PagedKVCacheManager& paged_of(kvc_manager* m, const char* what) {
  require(m, "manager");
  kvcache::PagedKVCacheManager* paged = manager_of(m).paged();
  if (paged == nullptr) {
    throw InvalidArgument(std::string(what) + " needs the paged strategy; this manager is " +
                          "continuous");
  }
  return *paged;
}

const kvcache::KVCacheBatch& fetched(const kvc_batch* b) {
  require(b, "batch");
  if (!b->fetched) throw InvalidArgument("batch has not been fetched into (kvc_fetch)");
  return b->batch;
}

// a * b * c elements, refusing products past size_t.
std::size_t elements(std::size_t a, std::size_t b, std::size_t c, const char* name) {
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  if ((b != 0 && a > kMax / b) || (c != 0 && a * b > kMax / c)) {
    throw InvalidArgument(std::string(name) + " would hold more than SIZE_MAX elements");
  }
  return a * b * c;
}

// fn(collection) with the batch's typed collection (dtype x strategy).
template <class T, class F>
void with_typed(const kvcache::KVCacheBatch& b, F& fn) {
  if (b.strategy() == kvcache::CacheStrategy::paged) {
    fn(b.paged<T>());
  } else {
    fn(b.continuous<T>());
  }
}
template <class F>
void with_collection(const kvcache::KVCacheBatch& b, F&& fn) {
  switch (b.params().dtype) {
    case kvcache::DType::f32:
      return with_typed<float>(b, fn);
    case kvcache::DType::f16:
      return with_typed<kvcache::Half>(b, fn);
    case kvcache::DType::bf16:
      return with_typed<kvcache::BFloat16>(b, fn);
    case kvcache::DType::fp8_e4m3:
      return with_typed<kvcache::Fp8E4M3>(b, fn);
    case kvcache::DType::fp8_e5m2:
      return with_typed<kvcache::Fp8E5M2>(b, fn);
    case kvcache::DType::int8:
      return with_typed<kvcache::Int8>(b, fn);
  }
}

std::span<const std::uint32_t> checked_row_offsets(const kvcache::KVCacheBatch& b,
                                                   const std::uint32_t* row_offsets) {
  require(row_offsets, "row_offsets");
  const std::span<const std::uint32_t> ro(row_offsets, std::size_t{b.batch_size()} + 1);
  kvcache::detail::check_row_offsets(ro, b.batch_size());
  return ro;
}

}  // namespace

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

kvc_status kvc_estimated_memory_size(const kvc_params* params, uint32_t num_blocks,
                                     uint32_t max_seq_len, size_t* bytes, kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheParams p = to_params(params);
    require(bytes, "bytes");
    *bytes = p.cache_strategy == kvcache::CacheStrategy::paged
                 ? kvcache::PagedKVCacheManager::estimated_memory_size(p, num_blocks)
                 : kvcache::ContinuousBatchingKVCacheManager::estimated_memory_size(p, num_blocks,
                                                                                    max_seq_len);
  });
}

kvc_status kvc_manager_create(const kvc_params* params, uint32_t num_blocks,
                              uint32_t max_batch_size, uint32_t max_seq_len, kvc_manager** out,
                              kvc_error* err) {
  return guarded(err, [&] {
    require(out, "out");
    const kvcache::KVCacheParams p = to_params(params);
    if (p.cache_strategy == kvcache::CacheStrategy::paged) {
      *out = wrap(std::make_unique<kvcache::PagedKVCacheManager>(p, num_blocks, max_batch_size,
                                                                 max_seq_len));
      return;
    }
    if (num_blocks != 0 && num_blocks != max_batch_size) {
      throw InvalidArgument("num_blocks is " + std::to_string(num_blocks) +
                            "; a continuous manager has one slot per sequence, so it must be "
                            "0 or max_batch_size (" +
                            std::to_string(max_batch_size) + ")");
    }
    auto m = std::make_unique<kvc_manager>();
    m->impl =
        std::make_unique<kvcache::ContinuousBatchingKVCacheManager>(p, max_batch_size, max_seq_len);
    *out = m.release();
  });
}

void kvc_manager_destroy(kvc_manager* manager) { delete manager; }

kvc_status kvc_claim(kvc_manager* manager, uint32_t n, uint64_t* seq_ids, kvc_error* err) {
  return guarded(err, [&] {
    kvcache::KVCacheManager& m = manager_of(manager);
    require_array(seq_ids, n, "seq_ids");
    const std::vector<kvcache::SeqId> ids = m.claim(n);
    std::copy(ids.begin(), ids.end(), seq_ids);
  });
}

kvc_status kvc_fetch(kvc_manager* manager, kvc_batch* batch, const uint64_t* seq_ids,
                     const uint32_t* num_new_tokens, uint32_t n, uint32_t num_steps,
                     kvc_error* err) {
  return guarded(err, [&] {
    kvcache::KVCacheManager& m = manager_of(manager);
    require(batch, "batch");
    require_array(seq_ids, n, "seq_ids");
    require_array(num_new_tokens, n, "num_new_tokens");
    m.fetch_into(batch->batch, std::span<const kvcache::SeqId>(seq_ids, n),
                 std::span<const std::uint32_t>(num_new_tokens, n), num_steps);
    batch->fetched = true;
  });
}

kvc_status kvc_step(kvc_manager* manager, const uint64_t* seq_ids, const uint32_t* valid_lengths,
                    uint32_t n, const uint32_t* token_ids, kvc_error* err) {
  return guarded(err, [&] {
    kvcache::KVCacheManager& m = manager_of(manager);
    require_array(seq_ids, n, "seq_ids");
    require_array(valid_lengths, n, "valid_lengths");
    const std::span<const kvcache::SeqId> seqs(seq_ids, n);
    const std::span<const std::uint32_t> valid(valid_lengths, n);
    if (token_ids == nullptr) return m.step(seqs, valid);
    kvcache::PagedKVCacheManager& paged = paged_of(manager, "step with token_ids");
    std::size_t total = 0;
    for (const std::uint32_t v : valid) total += v;
    paged.step(seqs, valid, std::span<const std::uint32_t>(token_ids, total));
  });
}

kvc_status kvc_release(kvc_manager* manager, uint64_t seq, int32_t hint, kvc_error* err) {
  return guarded(err, [&] {
    kvcache::KVCacheManager& m = manager_of(manager);
    const auto h = from_c<kvcache::ReuseHint>(
        hint, 3, "hint", "KVC_REUSE_UNKNOWN, KVC_REUSE_UNLIKELY or KVC_REUSE_LIKELY");
    if (h == kvcache::ReuseHint::unknown) return m.release(seq);
    paged_of(manager, "a release hint").release(seq, h);
  });
}

kvc_status kvc_cache_length(const kvc_manager* manager, uint64_t seq, uint32_t* length,
                            kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheManager& m = manager_of(manager);
    require(length, "length");
    *length = m.cache_length(seq);
  });
}

kvc_status kvc_match_prefix(kvc_manager* manager, uint64_t seq, const uint32_t* tokens,
                            size_t n_tokens, uint64_t extra_key, uint32_t* reused, kvc_error* err) {
  return guarded(err, [&] {
    kvcache::PagedKVCacheManager& m = paged_of(manager, "match_prefix");
    require_array(tokens, n_tokens, "tokens");
    require(reused, "reused");
    *reused = m.match_prefix(seq, std::span<const std::uint32_t>(tokens, n_tokens), extra_key);
  });
}

kvc_status kvc_fork(kvc_manager* manager, uint64_t seq, uint64_t* child, kvc_error* err) {
  return guarded(err, [&] {
    kvcache::PagedKVCacheManager& m = paged_of(manager, "fork");
    require(child, "child");
    *child = m.fork(seq);
  });
}

kvc_status kvc_truncate(kvc_manager* manager, uint64_t seq, uint32_t new_length, kvc_error* err) {
  return guarded(err, [&] { paged_of(manager, "truncate").truncate(seq, new_length); });
}

kvc_prefix_config kvc_prefix_config_default(void) {
  const kvcache::PrefixCacheConfig d;
  kvc_prefix_config c{};
  c.policy = static_cast<int32_t>(d.policy);
  c.s3fifo_small_fraction = d.s3fifo_small_fraction;
  c.ghost_factor = d.ghost_factor;
  return c;
}

kvc_status kvc_manager_create_prefix(const kvc_params* params, uint32_t num_pages,
                                     uint32_t max_batch_size, uint32_t max_seq_len,
                                     const kvc_prefix_config* config, kvc_manager** out,
                                     kvc_error* err) {
  return guarded(err, [&] {
    require(out, "out");
    require(config, "config");
    const kvcache::KVCacheParams p = to_params(params);
    if (!p.enable_prefix_caching) {
      throw InvalidArgument(
          "kvc_manager_create_prefix needs params->enable_prefix_caching 1 and the paged strategy");
    }
    kvcache::PrefixCacheConfig c;
    c.policy =
        from_c<kvcache::EvictionPolicyKind>(config->policy, 5, "config->policy",
                                            "KVC_EVICT_LRU, KVC_EVICT_S3FIFO, KVC_EVICT_TIERED, "
                                            "KVC_EVICT_INTERVAL or KVC_EVICT_ADAPTIVE");
    c.s3fifo_small_fraction = config->s3fifo_small_fraction;
    c.ghost_factor = config->ghost_factor;
    if (config->on_event != nullptr) {
      c.on_event = [fn = config->on_event, user = config->user_data](const kvcache::PageEvent& e) {
        kvc_page_event ce{};
        ce.kind = e.kind == kvcache::PageEvent::Kind::stored ? KVC_PAGE_STORED : KVC_PAGE_REMOVED;
        ce.page = e.page;
        ce.hash = e.hash;
        ce.parent_hash = e.parent_hash;
        ce.extra_key = e.extra_key;
        ce.tokens = e.tokens.data();
        ce.n_tokens = e.tokens.size();
        fn(&ce, user);
      };
    }
    *out = wrap(std::make_unique<kvcache::PagedKVCacheManager>(p, num_pages, max_batch_size,
                                                               max_seq_len, std::move(c)));
  });
}

kvc_status kvc_pin_prefix(kvc_manager* manager, const uint32_t* tokens, size_t n_tokens,
                          uint32_t priority, uint64_t extra_key, uint32_t* covered,
                          kvc_error* err) {
  return guarded(err, [&] {
    kvcache::PagedKVCacheManager& m = paged_of(manager, "pin_prefix");
    require_array(tokens, n_tokens, "tokens");
    require(covered, "covered");
    *covered = m.pin_prefix(std::span<const std::uint32_t>(tokens, n_tokens), priority, extra_key);
  });
}

kvc_status kvc_reset_prefix_cache(kvc_manager* manager, kvc_error* err) {
  return guarded(err, [&] { paged_of(manager, "reset_prefix_cache").reset_prefix_cache(); });
}

kvc_status kvc_reset_metrics(kvc_manager* manager, kvc_error* err) {
  return guarded(err, [&] { paged_of(manager, "reset_metrics").reset_metrics(); });
}

kvc_status kvc_manager_set_kv_scales(kvc_manager* manager, const float* k_scales,
                                     const float* v_scales, size_t n, kvc_error* err) {
  return guarded(err, [&] {
    kvcache::KVCacheManager& m = manager_of(manager);
    require_array(k_scales, n, "k_scales");
    require_array(v_scales, n, "v_scales");
    const kvcache::KVCacheParams& p = m.params();
    m.set_kv_scales(kvcache::KVScales(p.num_layers, p.n_kv_heads, {k_scales, n}, {v_scales, n}));
  });
}

kvc_status kvc_manager_stats_get(const kvc_manager* manager, kvc_manager_stats* out,
                                 kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheManager& m = manager_of(manager);
    require(out, "out");
    kvc_manager_stats s{};
    s.total_blocks = m.total_blocks();
    s.free_blocks = m.free_blocks();
    s.active_sequences = m.num_active_sequences();
    if (const kvcache::PagedKVCacheManager* paged = manager_of(manager).paged()) {
      const kvcache::PrefixCacheMetrics x = paged->metrics();
      s.pages_cached = x.pages_cached;
      s.pages_pinned = x.pages_pinned;
      s.match_calls = x.match_calls;
      s.prompt_tokens = x.prompt_tokens;
      s.reused_tokens = x.reused_tokens;
      s.pages_published = x.pages_published;
      s.evictions = x.evictions;
      s.cow_copies = x.cow_copies;
    }
    *out = s;
  });
}

kvc_status kvc_check_invariants(const kvc_manager* manager, kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheManager& m = manager_of(manager);
    try {
      m.check_invariants();
    } catch (const kvcache::Error& e) {
      // An inconsistency is a bug whatever type reported it.
      throw std::runtime_error(std::string("invariant broken: ") + e.what());
    }
  });
}

kvc_status kvc_batch_create(kvc_batch** out, kvc_error* err) {
  return guarded(err, [&] {
    require(out, "out");
    *out = new kvc_batch();
  });
}

void kvc_batch_destroy(kvc_batch* batch) { delete batch; }

kvc_status kvc_batch_describe(const kvc_batch* batch, kvc_cache_desc* out, kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheBatch& b = fetched(batch);
    require(out, "out");
    const kvcache::CacheDesc c = b.desc();
    kvc_cache_desc d{};
    d.blocks = c.blocks;
    d.cache_lengths = c.cache_lengths;
    d.lookup_table = c.lookup_table;
    d.seq_ids = b.seq_ids().data();
    d.lookup_stride = c.lookup_stride;
    d.batch_size = c.batch_size;
    d.max_seq_length = c.max_seq_length;
    d.max_cache_length = c.max_cache_length;
    d.num_layers = c.num_layers;
    d.page_size = c.page_size;
    d.n_kv_heads = c.n_kv_heads;
    d.head_dim = c.head_dim;
    d.num_blocks = c.num_blocks;
    d.dtype = static_cast<std::int32_t>(c.dtype);
    d.strategy = b.strategy() == kvcache::CacheStrategy::paged ? KVC_STRATEGY_PAGED
                                                               : KVC_STRATEGY_CONTINUOUS;
    d.layout = c.layout == kvcache::PageLayout::hnd ? KVC_LAYOUT_HND : KVC_LAYOUT_NHD;
    d.reserved_lengths = c.reserved_lengths;
    d.max_full_context_length = c.max_full_context_length;
    d.arrangement = c.arrangement == kvcache::PoolArrangement::per_layer
                        ? KVC_ARRANGEMENT_PER_LAYER
                        : KVC_ARRANGEMENT_INTERLEAVED;
    d.block_stride = c.block_stride;
    d.layer_stride = c.layer_stride;
    d.kv_stride = c.kv_stride;
    d.token_stride = c.token_stride;
    d.head_stride = c.head_stride;
    d.head_scales = c.head_scales;
    *out = d;
  });
}

// The C struct reads the C++ one in place: the same two uint32_t fields.
static_assert(sizeof(kvc_block_copy) == sizeof(kvcache::BlockCopy) &&
              offsetof(kvc_block_copy, src) == offsetof(kvcache::BlockCopy, src) &&
              offsetof(kvc_block_copy, dst) == offsetof(kvcache::BlockCopy, dst) &&
              std::is_standard_layout_v<kvcache::BlockCopy>);

kvc_status kvc_batch_block_copies(const kvc_batch* batch, const kvc_block_copy** copies,
                                  uint32_t* count, kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheBatch& b = fetched(batch);
    require(copies, "copies");
    require(count, "count");
    const std::span<const kvcache::BlockCopy> c = b.block_copies();
    *copies = c.empty() ? nullptr : reinterpret_cast<const kvc_block_copy*>(c.data());
    *count = static_cast<uint32_t>(c.size());
  });
}

kvc_status kvc_batch_increment_cache_lengths(kvc_batch* batch, const uint32_t* prev_row_offsets,
                                             uint32_t n_offsets, kvc_error* err) {
  return guarded(err, [&] {
    fetched(batch);
    require_array(prev_row_offsets, n_offsets, "prev_row_offsets");
    batch->batch.increment_cache_lengths(
        std::span<const std::uint32_t>(prev_row_offsets, n_offsets));
  });
}

kvc_status kvc_thread_pool_create(uint32_t num_threads, kvc_thread_pool** out, kvc_error* err) {
  return guarded(err, [&] {
    require(out, "out");
    *out = new kvc_thread_pool(num_threads);
  });
}

void kvc_thread_pool_destroy(kvc_thread_pool* pool) { delete pool; }

kvc_status kvc_store_kv(const kvc_batch* batch, uint32_t layer, const float* k_new,
                        const float* v_new, const uint32_t* row_offsets,
                        const kvc_store_options* options, kvc_thread_pool* pool, kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheBatch& b = fetched(batch);
    const std::span<const std::uint32_t> ro = checked_row_offsets(b, row_offsets);
    const std::size_t n =
        elements(ro.back(), b.params().n_kv_heads_per_device(), b.params().head_dim, "k_new");
    require_array(k_new, n, "k_new");
    require_array(v_new, n, "v_new");
    kvcache::StoreOptions o;
    if (options != nullptr) {
      if (options->rope_k != 0 && options->rope_k != 1) {
        throw InvalidArgument("options->rope_k is " + std::to_string(options->rope_k) +
                              ", must be 0 or 1");
      }
      o.rope_k.enabled = options->rope_k == 1;
      if (options->rope_theta != 0.0f) o.rope_k.theta = options->rope_theta;
      o.rope_k.rotary_dim = options->rotary_dim;
    }
    kvcache::ThreadPool* tp = pool != nullptr ? &pool->pool : nullptr;
    with_collection(b, [&](const auto& collection) {
      kvcache::store_kv(collection.get_key_cache(layer), collection.get_value_cache(layer),
                        std::span<const float>(k_new, n), std::span<const float>(v_new, n), ro, o,
                        tp);
    });
  });
}

kvc_status kvc_attention(const kvc_batch* batch, uint32_t layer, const float* q, uint32_t n_q_heads,
                         const uint32_t* row_offsets, float* out,
                         const kvc_attention_options* options, kvc_thread_pool* pool,
                         kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheBatch& b = fetched(batch);
    const std::span<const std::uint32_t> ro = checked_row_offsets(b, row_offsets);
    const std::size_t n = elements(ro.back(), n_q_heads, b.params().head_dim, "q");
    require_array(q, n, "q");
    require_array(out, n, "out");
    kvcache::AttentionOptions o;
    if (options != nullptr) {
      o.scale = options->scale;
      o.precision = from_c<kvcache::AttentionPrecision>(options->precision, 2, "options->precision",
                                                        "KVC_PRECISION_FP32 or KVC_PRECISION_BF16");
      o.prefetch = from_c<kvcache::AttentionPrefetch>(options->prefetch, 5, "options->prefetch",
                                                      "a KVC_PREFETCH_* constant (0-4)");
    }
    kvcache::ThreadPool* tp = pool != nullptr ? &pool->pool : nullptr;
    with_collection(b, [&](const auto& collection) {
      kvcache::attention(collection.get_key_cache(layer), collection.get_value_cache(layer),
                         std::span<const float>(q, n), n_q_heads, ro, std::span<float>(out, n), o,
                         tp);
    });
  });
}

// ---- metrics and logging -------------------------------------------------------

kvc_status kvc_metrics_text(const kvc_manager* manager, const char* prefix, char* buf, size_t cap,
                            size_t* needed, kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheManager& m = manager_of(manager);
    if (buf == nullptr && cap != 0) {
      throw InvalidArgument("buf is NULL with cap " + std::to_string(cap) +
                            " (0 asks for the size)");
    }
    const std::string text = kvcache::metrics_text(m, prefix == nullptr ? "kvcache" : prefix);
    if (needed != nullptr) *needed = text.size() + 1;
    if (buf == nullptr) return;
    if (text.size() + 1 > cap) {
      throw InvalidArgument("buf holds " + std::to_string(cap) +
                            " bytes but the metrics text needs " + std::to_string(text.size() + 1) +
                            " (with its NUL)");
    }
    std::memcpy(buf, text.c_str(), text.size() + 1);
  });
}

kvc_status kvc_set_log_callback(kvc_log_fn fn, void* user_data, kvc_error* err) {
  return guarded(err, [&] {
    if (fn == nullptr) {
      kvcache::set_log_sink({});
      return;
    }
    kvcache::set_log_sink([fn, user_data](kvcache::LogLevel level, std::string_view message) {
      const std::string text(message);  // NUL-terminated for C
      fn(static_cast<int32_t>(level), text.c_str(), text.size(), user_data);
    });
  });
}

kvc_status kvc_set_log_level(int32_t level, kvc_error* err) {
  return guarded(err, [&] {
    if (level < KVC_LOG_TRACE || level > KVC_LOG_OFF) {
      throw InvalidArgument("log level " + std::to_string(level) +
                            " is not KVC_LOG_TRACE (0) ... KVC_LOG_OFF (5)");
    }
    kvcache::set_log_level(static_cast<kvcache::LogLevel>(level));
  });
}

int32_t kvc_get_log_level(void) { return static_cast<int32_t>(kvcache::log_level()); }

}  // extern "C"
