#include "kvcache/manager.h"

#include <string>
#include <vector>

#include "kvcache/error.h"

namespace kvcache {

KVCacheManager::KVCacheManager(const KVCacheParams& params, std::uint32_t max_batch_size,
                               std::uint32_t max_seq_len, SeqIdPolicy seq_id_policy)
    : params_(params),
      max_batch_size_(max_batch_size),
      max_seq_len_(max_seq_len),
      seq_id_policy_(seq_id_policy) {
  params.validate();
  if (max_batch_size == 0) throw InvalidArgument("max_batch_size is 0: it must be at least 1");
  if (max_seq_len == 0) throw InvalidArgument("max_seq_len is 0: it must be at least 1");
  if (seq_id_policy != SeqIdPolicy::never_reuse && seq_id_policy != SeqIdPolicy::lowest_free) {
    throw InvalidArgument("seq_id_policy " + std::to_string(static_cast<unsigned>(seq_id_policy)) +
                          " is not a SeqIdPolicy (never_reuse = 0, lowest_free = 1)");
  }
  if (is_fp8(params.dtype)) set_device_scales(KVScales(params.num_layers, params.n_kv_heads));
}

void KVCacheManager::set_device_scales(const KVScales& scales) {
  const std::uint32_t per_device = params_.n_kv_heads_per_device();
  std::vector<float> device(std::size_t{params_.n_kv_heads} * 2 * params_.num_layers);
  std::size_t i = 0;
  for (std::uint32_t d = 0; d < params_.n_devices; ++d) {
    for (std::uint32_t l = 0; l < params_.num_layers; ++l) {
      for (std::uint32_t kv = 0; kv < 2; ++kv) {
        for (std::uint32_t h = 0; h < per_device; ++h) {
          device[i++] = scales.get(l, kv, d * per_device + h);
        }
      }
    }
  }
  kv_scales_ = scales;
  device_scales_ = std::move(device);
}

void KVCacheManager::set_kv_scales(const KVScales& scales) {
  if (!is_fp8(params_.dtype)) {
    throw InvalidArgument("set_kv_scales: the cache dtype is " +
                          std::string(dtype_name(params_.dtype)) +
                          "; static K/V scales are for fp8_e4m3 and fp8_e5m2 caches");
  }
  if (scales.num_layers() != params_.num_layers || scales.n_kv_heads() != params_.n_kv_heads) {
    throw InvalidArgument(
        "set_kv_scales: the scales are for " + std::to_string(scales.num_layers()) +
        " layers and " + std::to_string(scales.n_kv_heads()) + " KV heads, the cache has " +
        std::to_string(params_.num_layers) + " and " + std::to_string(params_.n_kv_heads));
  }
  if (num_active_sequences() != 0) {
    throw InvalidArgument("set_kv_scales: " + std::to_string(num_active_sequences()) +
                          " sequences are active; their codes were written with the old scales");
  }
  set_device_scales(scales);
  kv_scales_changed();
}

KVCacheBatch KVCacheManager::fetch(std::span<const SeqId> seqs,
                                   std::span<const std::uint32_t> num_new_tokens,
                                   std::uint32_t num_steps) {
  KVCacheBatch out;
  fetch_into(out, seqs, num_new_tokens, num_steps);
  return out;
}

KVCacheBatch KVCacheManager::fetch(std::span<const SeqId> seqs) {
  const std::vector<std::uint32_t> none(seqs.size(), 0);
  return fetch(seqs, none);
}

}  // namespace kvcache
