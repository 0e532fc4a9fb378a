#include "kvcache/manager.h"

#include <vector>

#include <string>

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
