// The C interface (include/kvcache/c_api.h) over the C++ API: handles own
// the C++ objects, every entry point runs inside `guarded`
// (c_api_internal.h), which turns the library's typed exceptions into a
// kvc_status and a message and lets no exception cross into C. This file:
// managers, the lifecycle, the prefix cache, stats, metrics and logging
// (batches and kernels: c_api_kernels.cpp; tiers: c_api_tiers.cpp).
#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "c_api/c_api_internal.h"
#include "kvcache/continuous_manager.h"
#include "kvcache/kv_scales.h"
#include "kvcache/log.h"
#include "kvcache/metrics.h"

namespace {

using kvcache::InvalidArgument;
using kvcache::c_api::from_c;
using kvcache::c_api::guarded;
using kvcache::c_api::manager_of;
using kvcache::c_api::paged_of;
using kvcache::c_api::require;
using kvcache::c_api::require_array;
using kvcache::c_api::to_params;

// A handle owning a paged manager.
kvc_manager* wrap(std::unique_ptr<kvcache::PagedKVCacheManager> paged) {
  auto m = std::make_unique<kvc_manager>();
  m->impl = std::move(paged);
  return m.release();
}

// The C++ on_event for a C callback: the event as a kvc_page_event, its
// medium NUL-terminated in a buffer of the call's own (a longer name is cut).
std::function<void(const kvcache::PageEvent&)> event_callback(kvc_page_event_fn fn, void* user) {
  return [fn, user](const kvcache::PageEvent& e) {
    std::array<char, 64> medium{};
    std::copy_n(e.medium.begin(), std::min(e.medium.size(), medium.size() - 1), medium.begin());
    kvc_page_event ce{};
    ce.kind = e.kind == kvcache::PageEvent::Kind::stored ? KVC_PAGE_STORED : KVC_PAGE_REMOVED;
    ce.page = e.page;
    ce.hash = e.hash;
    ce.parent_hash = e.parent_hash;
    ce.extra_key = e.extra_key;
    ce.tokens = e.tokens.data();
    ce.n_tokens = e.tokens.size();
    ce.medium = medium.data();
    ce.key_hi = e.key.hi;
    ce.key_lo = e.key.lo;
    fn(&ce, user);
  };
}

}  // namespace

namespace kvcache::c_api {

PrefixCacheConfig prefix_config(const kvc_prefix_config& config) {
  PrefixCacheConfig c;
  c.policy = from_c<EvictionPolicyKind>(config.policy, 5, "config->policy",
                                        "KVC_EVICT_LRU, KVC_EVICT_S3FIFO, KVC_EVICT_TIERED, "
                                        "KVC_EVICT_INTERVAL or KVC_EVICT_ADAPTIVE");
  c.s3fifo_small_fraction = config.s3fifo_small_fraction;
  c.ghost_factor = config.ghost_factor;
  if (config.on_event != nullptr) c.on_event = event_callback(config.on_event, config.user_data);
  c.tiers = tier_config(config);
  return c;
}

}  // namespace kvcache::c_api

extern "C" {

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
  c.admission = static_cast<int32_t>(d.tiers.admission);
  c.staging_pages = d.tiers.staging_pages;
  c.pool_apart = d.tiers.pool_apart ? 1 : 0;
  c.offload_batch = d.tiers.offload_batch;
  c.offload_delay_us = static_cast<uint32_t>(d.tiers.offload_delay.count());
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
    *out = wrap(std::make_unique<kvcache::PagedKVCacheManager>(
        p, num_pages, max_batch_size, max_seq_len, kvcache::c_api::prefix_config(*config)));
  });
}

kvc_status kvc_estimated_bookkeeping_size(const kvc_params* params, uint32_t num_pages,
                                          const kvc_prefix_config* config, size_t* bytes,
                                          kvc_error* err) {
  return guarded(err, [&] {
    const kvcache::KVCacheParams p = to_params(params);
    require(bytes, "bytes");
    const kvcache::PrefixCacheConfig c =
        config == nullptr ? kvcache::PrefixCacheConfig{} : kvcache::c_api::prefix_config(*config);
    *bytes = kvcache::PagedKVCacheManager::estimated_bookkeeping_size(p, num_pages, c);
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
