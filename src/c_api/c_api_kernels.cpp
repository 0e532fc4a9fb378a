// The C interface's batches, thread pools and CPU kernels
// (include/kvcache/c_api.h): kvc_batch_* (a pool apart's transfers among
// them), kvc_thread_pool_*, kvc_store_kv, kvc_attention.
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#include "c_api/c_api_internal.h"
#include "kvcache/cache_desc.h"
#include "kvcache/kernels/attention.h"

namespace {

using kvcache::InvalidArgument;
using kvcache::c_api::from_c;
using kvcache::c_api::guarded;
using kvcache::c_api::require;
using kvcache::c_api::require_array;

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

kvc_status kvc_batch_block_offloads(const kvc_batch* batch, const kvc_block_offload** offloads,
                                    uint32_t* count, kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheBatch& b = fetched(batch);
    require(offloads, "offloads");
    require(count, "count");
    const std::span<const kvcache::BlockOffload> o = b.block_offloads();
    batch->offloads.reserve(o.size());  // may throw: nothing written yet
    batch->offloads.clear();
    for (const kvcache::BlockOffload& x : o) {
      batch->offloads.push_back({x.page, x.bytes.data(), x.bytes.size()});
    }
    *offloads = o.empty() ? nullptr : batch->offloads.data();
    *count = static_cast<uint32_t>(o.size());
  });
}

kvc_status kvc_batch_block_loads(const kvc_batch* batch, const uint32_t** pages, uint32_t* count,
                                 kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheBatch& b = fetched(batch);
    require(pages, "pages");
    require(count, "count");
    const std::span<const std::uint32_t> l = b.block_loads();
    *pages = l.empty() ? nullptr : l.data();
    *count = static_cast<uint32_t>(l.size());
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

}  // extern "C"
