// kvcache/kernels/reference.h — scalar reference kernels: the oracle.
//
// Obviously-correct, unoptimised `store_kv` and `attention`, templated on the
// per-layer view concept so they serve the continuous and the paged cache.
// Every fast kernel is tested against these. They validate their arguments
// (throwing InvalidArgument naming the value) since speed is not their job.
//
// Ragged batch convention (shared with the fast kernels):
//   row_offsets  batch_size + 1 non-decreasing values, row_offsets[0] == 0;
//                entry b owns new-token rows [row_offsets[b], row_offsets[b+1]).
//   k_new/v_new  [total_new_tokens][n_kv_heads][head_dim] floats.
//   q / out      [total_new_tokens][n_q_heads][head_dim] floats.
// New token i of entry b sits at position cache_length(b) + i and, with
// causal masking, attends to positions 0 ..= cache_length(b) + i.
// GQA: query head h reads KV head h / (n_q_heads / n_kv_heads).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kvcache/error.h"
#include "kvcache/kernels/options.h"
#include "kvcache/kv_cache.h"

namespace kvcache {

namespace detail {

inline void check_row_offsets(std::span<const std::uint32_t> row_offsets,
                              std::uint32_t batch_size) {
  if (row_offsets.size() != std::size_t{batch_size} + 1) {
    throw InvalidArgument("row_offsets has " + std::to_string(row_offsets.size()) +
                          " entries, expected batch_size + 1 = " + std::to_string(batch_size + 1));
  }
  if (row_offsets[0] != 0) {
    throw InvalidArgument("row_offsets[0] is " + std::to_string(row_offsets[0]) + ", must be 0");
  }
  for (std::uint32_t b = 0; b < batch_size; ++b) {
    if (row_offsets[b + 1] < row_offsets[b]) {
      throw InvalidArgument("row_offsets decreases at entry " + std::to_string(b + 1) + " (" +
                            std::to_string(row_offsets[b + 1]) + " < " +
                            std::to_string(row_offsets[b]) + ")");
    }
  }
}

// Every entry's cache_length + new rows within the room its fetch reserved
// (views that know it: reserved_length(b)); InvalidArgument naming the entry.
template <class Cache>
void check_reserved_rows(const Cache& c, std::span<const std::uint32_t> row_offsets) {
  if constexpr (requires(const Cache& x) { x.reserved_length(std::uint32_t{0}); }) {
    for (std::uint32_t b = 0; b < c.batch_size(); ++b) {
      const std::uint32_t added = row_offsets[b + 1] - row_offsets[b];
      const std::uint64_t end = std::uint64_t{c.cache_length(b)} + added;
      if (end > c.reserved_length(b)) {
        throw InvalidArgument("row_offsets give entry " + std::to_string(b) + " " +
                              std::to_string(added) + " new tokens after " +
                              std::to_string(c.cache_length(b)) +
                              " cached: " + std::to_string(end) + " exceeds the " +
                              std::to_string(c.reserved_length(b)) + " tokens its fetch reserved");
      }
    }
  }
}

inline void check_size(const char* what, std::size_t got, std::size_t want) {
  if (got != want) {
    throw InvalidArgument(std::string(what) + " has " + std::to_string(got) +
                          " elements, expected " + std::to_string(want));
  }
}

}  // namespace detail

// Writes new K/V rows: token i of entry b goes to position cache_length(b) + i,
// each (token, head) row quantised as the view's store_row does (8-bit
// types: kv_cache.h, docs/quantization.md).
// The fetch that produced the views must have reserved room for them
// (checked: InvalidArgument when an entry's rows pass reserved_length(b)).
template <KVCacheT Cache>
void store_kv_reference(const Cache& k_cache, const Cache& v_cache, std::span<const float> k_new,
                        std::span<const float> v_new, std::span<const std::uint32_t> row_offsets) {
  const std::uint32_t batch = k_cache.batch_size();
  detail::check_row_offsets(row_offsets, batch);
  const std::size_t row = std::size_t{k_cache.n_kv_heads()} * k_cache.head_dim();
  detail::check_size("k_new", k_new.size(), row_offsets[batch] * row);
  detail::check_size("v_new", v_new.size(), row_offsets[batch] * row);
  detail::check_reserved_rows(k_cache, row_offsets);
  for (std::uint32_t b = 0; b < batch; ++b) {
    for (std::uint32_t r = row_offsets[b]; r < row_offsets[b + 1]; ++r) {
      const std::uint32_t pos = k_cache.cache_length(b) + (r - row_offsets[b]);
      for (std::uint32_t h = 0; h < k_cache.n_kv_heads(); ++h) {
        const std::size_t src = r * row + std::size_t{h} * k_cache.head_dim();
        k_cache.store_row(b, h, pos, k_new.subspan(src, k_cache.head_dim()));
        v_cache.store_row(b, h, pos, v_new.subspan(src, k_cache.head_dim()));
      }
    }
  }
}

// Causal attention of the new queries over history + new tokens, fp32
// accumulation with a two-pass (max, then sum) softmax. 8-bit caches are
// dequantised: score = (q . code) * k scale, and each probability is
// multiplied by its V scale before it weighs the V codes.
template <KVCacheT Cache>
void attention_reference(const Cache& k_cache, const Cache& v_cache, std::span<const float> q,
                         std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
                         std::span<float> out, AttentionOptions options = {}) {
  const std::uint32_t batch = k_cache.batch_size();
  const std::uint32_t n_kv = k_cache.n_kv_heads();
  const std::uint32_t dim = k_cache.head_dim();
  detail::check_row_offsets(row_offsets, batch);
  if (n_q_heads == 0 || n_q_heads % n_kv != 0) {
    throw InvalidArgument("n_q_heads " + std::to_string(n_q_heads) +
                          " must be a positive multiple of n_kv_heads " + std::to_string(n_kv));
  }
  const std::size_t q_row = std::size_t{n_q_heads} * dim;
  detail::check_size("q", q.size(), row_offsets[batch] * q_row);
  detail::check_size("out", out.size(), row_offsets[batch] * q_row);
  detail::check_precision(options.precision);
  detail::check_scale(options.scale);
  detail::check_reserved_rows(k_cache, row_offsets);
  const float scale = options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(float(dim));
  const std::uint32_t group = n_q_heads / n_kv;
  // AttentionPrecision::bf16 on a bf16 cache: q * scale and the probabilities
  // rounded to bf16 before they multiply K and V.
  const bool bf16_inputs = options.precision == AttentionPrecision::bf16 &&
                           std::is_same_v<typename Cache::element_type, BFloat16>;
  const auto round_bf16 = [](float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); };
  std::vector<float> scores, q_rounded(dim);
  for (std::uint32_t b = 0; b < batch; ++b) {
    for (std::uint32_t r = row_offsets[b]; r < row_offsets[b + 1]; ++r) {
      const std::uint32_t context = k_cache.cache_length(b) + (r - row_offsets[b]) + 1;
      scores.assign(context, 0.0f);
      for (std::uint32_t h = 0; h < n_q_heads; ++h) {
        const float* qh = q.data() + r * q_row + std::size_t{h} * dim;
        if (bf16_inputs) {
          for (std::uint32_t d = 0; d < dim; ++d) q_rounded[d] = round_bf16(qh[d] * scale);
          qh = q_rounded.data();
        }
        const std::uint32_t kvh = h / group;
        float max_score = -std::numeric_limits<float>::infinity();
        for (std::uint32_t t = 0; t < context; ++t) {
          const auto* k = k_cache.ptr(b, kvh, t, 0);
          float s = 0.0f;
          for (std::uint32_t d = 0; d < dim; ++d) s += qh[d] * to_float(k[d]);
          s *= k_cache.scale(b, kvh, t);  // 8-bit: the dequantisation scale
          scores[t] = bf16_inputs ? s : s * scale;
          max_score = std::max(max_score, scores[t]);
        }
        float sum = 0.0f;
        for (std::uint32_t t = 0; t < context; ++t) {
          scores[t] = std::exp(scores[t] - max_score);
          sum += scores[t];
        }
        float* o = out.data() + r * q_row + std::size_t{h} * dim;
        for (std::uint32_t d = 0; d < dim; ++d) o[d] = 0.0f;
        for (std::uint32_t t = 0; t < context; ++t) {
          const auto* v = v_cache.ptr(b, kvh, t, 0);
          const float p =
              (bf16_inputs ? round_bf16(scores[t]) : scores[t]) / sum * v_cache.scale(b, kvh, t);
          for (std::uint32_t d = 0; d < dim; ++d) o[d] += p * to_float(v[d]);
        }
      }
    }
  }
}

}  // namespace kvcache
