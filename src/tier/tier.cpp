// The medium-independent part of kvcache/tier.h: fingerprints, page keys,
// result names and the ticket's shared state.
#include "kvcache/tier.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <cstring>
#include <string>

#include "core/checked_math.h"
#include "kvcache/error.h"
#include "tier/ticket_state.h"

namespace kvcache {

TierFingerprint TierFingerprint::of(const KVCacheParams& params, std::string model_id,
                                    std::string cache_salt, std::uint32_t device_index) {
  params.validate();
  if (device_index >= params.n_devices) {
    throw InvalidArgument("device_index " + std::to_string(device_index) +
                          " is out of range: the cache has " + std::to_string(params.n_devices) +
                          " devices");
  }
  TierFingerprint f;
  f.dtype = params.dtype;
  f.layout = params.page_layout;
  f.page_size = params.cache_strategy == CacheStrategy::paged ? params.page_size : 0;
  f.n_kv_heads = params.n_kv_heads_per_device();
  f.head_dim = params.head_dim;
  f.layer_begin = 0;
  f.layer_end = params.num_layers;
  f.device_index = device_index;
  f.device_count = params.n_devices;
  f.model_id = std::move(model_id);
  f.cache_salt = std::move(cache_salt);
  return f;
}

std::uint64_t TierFingerprint::digest() const {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) throw OutOfMemory("XXH3 state for a tier fingerprint");
  XXH3_64bits_reset(state);
  const std::uint32_t fields[] = {static_cast<std::uint32_t>(dtype),
                                  static_cast<std::uint32_t>(layout),
                                  page_size,
                                  n_kv_heads,
                                  head_dim,
                                  layer_begin,
                                  layer_end,
                                  device_index,
                                  device_count,
                                  static_cast<std::uint32_t>(model_id.size()),
                                  static_cast<std::uint32_t>(cache_salt.size())};
  XXH3_64bits_update(state, fields, sizeof fields);
  XXH3_64bits_update(state, model_id.data(), model_id.size());
  XXH3_64bits_update(state, cache_salt.data(), cache_salt.size());
  const std::uint64_t d = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return d;
}

std::uint64_t TierFingerprint::chain_digest() const {
  if (device_index == 0) return digest();
  TierFingerprint first = *this;
  first.device_index = 0;
  return first.digest();
}

PageKey TierFingerprint::shard_mask() const {
  if (device_count <= 1) return {};
  const std::uint64_t d = digest();
  const XXH128_hash_t h = XXH3_128bits_withSeed(&d, sizeof d, 0x5348415244ull);  // "SHARD"
  return {h.high64, h.low64};
}

std::size_t TierFingerprint::page_bytes() const {
  if (layer_end < layer_begin) {
    throw InvalidArgument("tier fingerprint layer range [" + std::to_string(layer_begin) + ", " +
                          std::to_string(layer_end) + ") is reversed");
  }
  // Bytes of one (token, head): its values, and int8's scale kept in the page.
  const std::uint64_t head_bytes =
      std::uint64_t{head_dim} * dtype_size(dtype) + (has_page_scales(dtype) ? sizeof(float) : 0);
  return static_cast<std::size_t>(
      detail::checked_product("tier page bytes", {{"2 (K, V)", 2},
                                                  {"layers", layer_end - layer_begin},
                                                  {"page_size", page_size},
                                                  {"n_kv_heads", n_kv_heads},
                                                  {"head bytes", head_bytes}}));
}

PageKey page_key(PageKey parent, std::span<const std::uint32_t> tokens,
                 std::uint64_t digest) noexcept {
  // Seeded by the digest; the parent key's 16 bytes lead the input. Up to
  // kOneShotTokens tokens the input is gathered on the stack and hashed in
  // one call (3x faster than the streaming state, the same value); longer
  // pages stream from a state on the stack. A key never allocates (the
  // manager computes keys inside its no-throw commit phase).
  constexpr std::size_t kOneShotTokens = 1024;
  const std::uint64_t head[2] = {parent.hi, parent.lo};
  XXH128_hash_t h;
  if (tokens.size() <= kOneShotTokens) {
    unsigned char input[sizeof head + kOneShotTokens * sizeof(std::uint32_t)];
    std::memcpy(input, head, sizeof head);
    if (!tokens.empty()) std::memcpy(input + sizeof head, tokens.data(), tokens.size_bytes());
    h = XXH3_128bits_withSeed(input, sizeof head + tokens.size_bytes(), digest);
  } else {
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_128bits_reset_withSeed(&state, digest);
    XXH3_128bits_update(&state, head, sizeof head);
    XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
    h = XXH3_128bits_digest(&state);
  }
  return PageKey{h.high64, h.low64};
}

std::string_view load_result_name(LoadResult r) {
  switch (r) {
    case LoadResult::pending:
      return "pending";
    case LoadResult::loaded:
      return "loaded";
    case LoadResult::missing:
      return "missing";
    case LoadResult::mismatch:
      return "mismatch";
    case LoadResult::corrupt:
      return "corrupt";
    case LoadResult::failed:
      return "failed";
  }
  return "?";
}

std::string_view store_result_name(StoreResult r) {
  switch (r) {
    case StoreResult::pending:
      return "pending";
    case StoreResult::stored:
      return "stored";
    case StoreResult::present:
      return "present";
    case StoreResult::rejected:
      return "rejected";
    case StoreResult::failed:
      return "failed";
  }
  return "?";
}

// ---- TierTicket ------------------------------------------------------------------

TierTicket::TierTicket(std::shared_ptr<State> state) : state_(std::move(state)) {}

bool TierTicket::done() const { return state_ == nullptr || state_->done(); }

void TierTicket::wait() const {
  if (state_ != nullptr) state_->wait();
}

std::span<const LoadResult> TierTicket::load_results() const {
  if (state_ == nullptr) return {};
  return state_->load_results();
}

std::span<const StoreResult> TierTicket::store_results() const {
  if (state_ == nullptr) return {};
  return state_->store_results();
}

}  // namespace kvcache
