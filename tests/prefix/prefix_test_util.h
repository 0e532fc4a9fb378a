// Helpers for prefix-cache tests: write K/V that depend on the whole token
// prefix and check a sequence's pages hold exactly that.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "kvcache/paged_manager.h"

namespace kvcache::testing {

inline KVCacheParams tiny_params(std::uint32_t page_size = 4) {
  return KVCacheParams{.dtype = DType::f32,
                       .num_layers = 2,
                       .n_kv_heads = 1,
                       .head_dim = 2,
                       .cache_strategy = CacheStrategy::paged,
                       .page_size = page_size,
                       .enable_prefix_caching = true};
}

// Hash of tokens[0..i] for every i.
inline std::vector<std::uint64_t> prefix_hashes(std::span<const std::uint32_t> tokens) {
  std::vector<std::uint64_t> out;
  std::uint64_t h = 0x12345;
  for (std::uint32_t t : tokens) {
    h = (h ^ t) * 0x100000001B3ULL + 0x9E37;
    out.push_back(h);
  }
  return out;
}

// The value stored for (prefix hash, K or V, layer, dim): an exact f32 integer.
inline float kv_value(std::uint64_t h, std::uint32_t kv, std::uint32_t layer, std::uint32_t d) {
  return static_cast<float>(((h >> 7) ^ (kv * 7919u + layer * 104729u + d * 31u)) & 0xFFFFFu);
}

// The element in `blocks` (the manager's pool, or a MirrorPool's; null: the
// manager's).
inline float* element(const KVCacheBatch& batch, std::uint32_t b, std::uint32_t pos,
                      std::uint32_t kv, std::uint32_t layer, std::uint32_t d,
                      float* blocks = nullptr) {
  const KVCacheParams& p = batch.params();
  const std::uint32_t ps = p.page_size;
  const std::uint32_t page =
      batch.lookup_table()[std::size_t{b} * batch.lookup_stride() + pos / ps];
  const std::size_t off =
      ((((std::size_t{page} * 2 + kv) * p.num_layers + layer) * ps + pos % ps) * p.n_kv_heads) *
          p.head_dim +
      d;
  return (blocks ? blocks : static_cast<float*>(batch.blocks(0))) + off;
}

// A second pool with the manager's shape kept apart from it, as a GPU pool
// is: it sees only what the caller writes and the copies each fetch reports
// (KVCacheBatch::block_copies), applied in order.
class MirrorPool {
 public:
  MirrorPool(const KVCacheParams& p, std::uint32_t num_pages)
      : page_elems_(std::size_t{2} * p.num_layers * p.page_size * p.n_kv_heads * p.head_dim),
        data_(page_elems_ * num_pages, -1.0f) {}
  void apply(const KVCacheBatch& batch) {
    for (const BlockCopy& c : batch.block_copies()) {
      std::copy_n(data_.begin() + c.src * page_elems_, page_elems_,
                  data_.begin() + c.dst * page_elems_);
    }
  }
  float* blocks() { return data_.data(); }

 private:
  std::size_t page_elems_;
  std::vector<float> data_;
};

// Writes positions [from, to) of entry b, given the sequence's full tokens.
// With `blocks`, into that pool instead of the manager's.
inline void write_kv(const KVCacheBatch& batch, std::uint32_t b,
                     std::span<const std::uint32_t> tokens, std::uint32_t from, std::uint32_t to,
                     float* blocks = nullptr) {
  const auto h = prefix_hashes(tokens);
  const KVCacheParams& p = batch.params();
  for (std::uint32_t pos = from; pos < to; ++pos)
    for (std::uint32_t kv = 0; kv < 2; ++kv)
      for (std::uint32_t l = 0; l < p.num_layers; ++l)
        for (std::uint32_t d = 0; d < p.head_dim; ++d)
          *element(batch, b, pos, kv, l, d, blocks) = kv_value(h[pos], kv, l, d);
}

// True iff positions [0, tokens.size()) of entry b hold the data written for
// tokens (in `blocks` if given, else in the manager's pool).
inline ::testing::AssertionResult kv_matches(const KVCacheBatch& batch, std::uint32_t b,
                                             std::span<const std::uint32_t> tokens,
                                             float* blocks = nullptr) {
  const auto h = prefix_hashes(tokens);
  const KVCacheParams& p = batch.params();
  for (std::uint32_t pos = 0; pos < tokens.size(); ++pos)
    for (std::uint32_t kv = 0; kv < 2; ++kv)
      for (std::uint32_t l = 0; l < p.num_layers; ++l)
        for (std::uint32_t d = 0; d < p.head_dim; ++d)
          if (*element(batch, b, pos, kv, l, d, blocks) != kv_value(h[pos], kv, l, d)) {
            return ::testing::AssertionFailure()
                   << "position " << pos << (kv ? " V" : " K") << " layer " << l << " dim " << d
                   << " holds " << *element(batch, b, pos, kv, l, d, blocks) << ", expected "
                   << kv_value(h[pos], kv, l, d);
          }
  return ::testing::AssertionSuccess();
}

// Token ids start, start + 1, ..., start + n - 1.
inline std::vector<std::uint32_t> iota_tokens(std::uint32_t n, std::uint32_t start) {
  std::vector<std::uint32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Claims a sequence, matches `prompt`, computes and commits the rest.
// Returns the sequence id; `reused` gets match_prefix's answer.
inline SeqId run_prompt(PagedKVCacheManager& m, std::span<const std::uint32_t> prompt,
                        std::uint32_t* reused = nullptr, std::uint64_t extra_key = 0) {
  const SeqId s = m.claim(1)[0];
  const std::uint32_t r = m.match_prefix(s, prompt, extra_key);
  if (reused) *reused = r;
  const std::uint32_t rest = static_cast<std::uint32_t>(prompt.size()) - r;
  const KVCacheBatch batch = m.fetch(std::span(&s, 1), std::span(&rest, 1));
  write_kv(batch, 0, prompt, r, static_cast<std::uint32_t>(prompt.size()));
  m.step(std::span(&s, 1), std::span(&rest, 1), prompt.subspan(r));
  return s;
}

// Fetches zero new tokens for seq and checks its committed K/V against tokens.
inline ::testing::AssertionResult seq_kv_matches(PagedKVCacheManager& m, SeqId s,
                                                 std::span<const std::uint32_t> tokens) {
  const std::uint32_t zero = 0;
  const KVCacheBatch batch = m.fetch(std::span(&s, 1), std::span(&zero, 1));
  return kv_matches(batch, 0, tokens);
}

}  // namespace kvcache::testing
