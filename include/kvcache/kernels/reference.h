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
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kvcache/error.h"
#include "kvcache/kv_cache.h"

namespace kvcache {

// How the fast decode kernel (kernels/attention.h) hides the latency of the
// K/V rows it reads; results never depend on it, only speed does. The
// reference kernel ignores it.
//  automatic:    next_step_l1 on processors other than AMD's, and on AMD
//                processors without AVX-512 (Zen 3 and older) for NHD pages;
//                on other AMD processors and pages next_tile_l1 from Zen 5
//                (CPUID family 1Ah) on and next_tile_l2 before it (what
//                measured fastest on each; docs/PERFORMANCE.md, "Prefetch"). On AMD processors each
//                worker first times loads of the first line of 16 K/V rows spread over each decode
//                item; items whose lines all answer from a cache run as `none` (from cache the
//                prefetch stream is pure cost: MHA 1.4x on one thread). After one probe finds rows
//                in memory, the worker streams the call's later items without probing.
//  next_step_l1: the rows of the next block of tokens (all the item's KV
//                heads) into L1, one block ahead (best on a Sapphire Rapids
//                Xeon when the kernel still walked a tile head by head; not
//                re-measured there since the token-major order; best on a
//                Zen 3 with NHD pages).
//  next_tile_l2: whole rows (all heads) of the next tile into L2
//                (prefetcht1), in address order, issued as fast as the loops
//                read the current tile (best on Zen 4: DRAM decode 1.3-2.0x
//                of next_tile_l1 there).
//  none:         hardware prefetchers only.
//  next_tile_l1: next_tile_l2's walk issued as prefetcht0 (into L1 and L2;
//                most lines leave L1 again before use): best on Zen 5
//                (1.02-1.10x of next_tile_l2 in DRAM), slow on
//                Zen 4, where prefetcht0 barely gets ahead of memory.
// (next_tile_l1 comes last so that the earlier values keep their numbers.)
enum class AttentionPrefetch : std::uint8_t {
  automatic,
  next_step_l1,
  next_tile_l2,
  none,
  next_tile_l1
};

// What the query and the softmax probabilities are rounded to before they
// multiply the cache's K and V elements. Every sum is fp32 either way.
//  fp32: nothing is rounded (the default): results are within fp32 rounding
//        of an exact computation on the stored K/V.
//  bf16: on a bf16 cache, the scaled query (q * scale, an fp32 product) and
//        each probability (exp(score - running max)) are rounded to bf16,
//        nearest even, as GPU flash-attention kernels do with bf16 inputs.
//        Their products with bf16 K/V elements are then exact in fp32. Where
//        the processor has AVX512-BF16 the fast kernel multiplies bf16 pairs
//        (vdpbf16ps: 32 products an instruction, fp32 FMAs do 16) in decode
//        with several query heads per KV head over rows in the caches and in
//        prefill's score loop, the compute-bound cases (decode 1.1-1.2x,
//        prefill 1.3x); elsewhere it
//        computes the same values with fp32 FMAs, at the speed of `fp32`
//        (within 1-2 %). Query rounding is
//        exact and reproducible; a probability is rounded against the running
//        maximum of its tile walk (the reference rounds exp(score - max)),
//        so the two agree within 2^-8 of the largest |V| element (two
//        roundings of 2^-9 each) plus fp32 rounding. f32 and f16 caches ignore it.
enum class AttentionPrecision : std::uint8_t { fp32, bf16 };

struct AttentionOptions {
  float scale = 0.0f;  // 0 => 1 / sqrt(head_dim); must be finite (InvalidArgument)
  AttentionPrefetch prefetch = AttentionPrefetch::automatic;
  AttentionPrecision precision = AttentionPrecision::fp32;
};

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

inline void check_precision(AttentionPrecision precision) {
  if (precision > AttentionPrecision::bf16) {
    throw InvalidArgument("AttentionOptions::precision value " +
                          std::to_string(static_cast<int>(precision)) + " is not fp32 or bf16");
  }
}

// AttentionOptions::scale: any finite value (0 picks 1 / sqrt(head_dim)); a
// NaN or infinite scale would turn every output into NaN.
inline void check_scale(float scale) {
  if (!std::isfinite(scale)) {
    throw InvalidArgument("AttentionOptions::scale is " + std::to_string(scale) +
                          ": it must be a finite number (0 means 1 / sqrt(head_dim))");
  }
}

inline void check_size(const char* what, std::size_t got, std::size_t want) {
  if (got != want) {
    throw InvalidArgument(std::string(what) + " has " + std::to_string(got) +
                          " elements, expected " + std::to_string(want));
  }
}

}  // namespace detail

// Writes new K/V rows: token i of entry b goes to position cache_length(b) + i.
// The fetch that produced the views must have reserved room for them
// (checked: InvalidArgument when an entry's rows pass reserved_length(b)).
template <KVCacheT Cache>
void store_kv_reference(const Cache& k_cache, const Cache& v_cache, std::span<const float> k_new,
                        std::span<const float> v_new, std::span<const std::uint32_t> row_offsets) {
  using T = typename Cache::element_type;
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
        for (std::uint32_t d = 0; d < k_cache.head_dim(); ++d) {
          const std::size_t src = r * row + std::size_t{h} * k_cache.head_dim() + d;
          *k_cache.ptr(b, h, pos, d) = from_float<T>(k_new[src]);
          *v_cache.ptr(b, h, pos, d) = from_float<T>(v_new[src]);
        }
      }
    }
  }
}

// Causal attention of the new queries over history + new tokens, fp32
// accumulation with a two-pass (max, then sum) softmax.
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
          const float p = (bf16_inputs ? round_bf16(scores[t]) : scores[t]) / sum;
          for (std::uint32_t d = 0; d < dim; ++d) o[d] += p * to_float(v[d]);
        }
      }
    }
  }
}

}  // namespace kvcache
