// Shared helpers for the kvcache test suite: deterministic random data that is
// never zero, exception/message checks, strong-guarantee checks, raw buffer
// snapshots and a float64 attention oracle.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvcache/kvcache.h"

namespace kvtest {

using kvcache::SeqId;
using U32 = std::vector<std::uint32_t>;
using Ids = std::vector<kvcache::SeqId>;

// ---- random data -------------------------------------------------------------

// Uniform in +-[lo, hi]: never zero, random sign.
inline float nonzero(std::mt19937_64& rng, float lo = 0.05f, float hi = 1.0f) {
  std::uniform_real_distribution<float> mag(lo, hi);
  std::bernoulli_distribution neg(0.5);
  const float m = mag(rng);
  return neg(rng) ? -m : m;
}

inline std::vector<float> random_vec(std::mt19937_64& rng, std::size_t n, float lo = 0.05f,
                                     float hi = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = nonzero(rng, lo, hi);
  return v;
}

// Rounds a float through element type T and back (what the cache will hold).
template <class T>
float quantize(float v) {
  return kvcache::to_float(kvcache::from_float<T>(v));
}

// Value stored in the cache for (tag, layer, kv, head, pos, d) in the
// pattern tests: distinct for distinct arguments within small ranges, exactly
// representable in f32, f16 and bf16 (only 8 significant bits).
inline float pattern_value(std::uint64_t tag, std::uint32_t layer, std::uint32_t kv,
                           std::uint32_t head, std::uint32_t pos, std::uint32_t d) {
  const std::uint64_t h = (tag * 0x9E3779B97F4A7C15ull) ^ (std::uint64_t{layer} << 40) ^
                          (std::uint64_t{kv} << 36) ^ (std::uint64_t{head} << 28) ^
                          (std::uint64_t{pos} << 8) ^ d;
  std::uint64_t z = h + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  // 1..255 with sign, scaled: never zero, exact in every dtype.
  const int mag = static_cast<int>(z % 255) + 1;
  const float v = static_cast<float>(mag) / 64.0f;
  return (z >> 32) & 1 ? -v : v;
}

// ---- params -----------------------------------------------------------------

inline kvcache::KVCacheParams make_params(kvcache::CacheStrategy strategy,
                                          std::uint32_t num_layers, std::uint32_t n_kv_heads,
                                          std::uint32_t head_dim, std::uint32_t page_size = 0,
                                          kvcache::DType dtype = kvcache::DType::f32,
                                          std::uint32_t n_devices = 1) {
  kvcache::KVCacheParams p;
  p.dtype = dtype;
  p.num_layers = num_layers;
  p.n_kv_heads = n_kv_heads;
  p.head_dim = head_dim;
  p.cache_strategy = strategy;
  p.page_size = page_size;
  p.n_devices = n_devices;
  return p;
}

inline kvcache::KVCacheParams paged_params(std::uint32_t num_layers, std::uint32_t n_kv_heads,
                                           std::uint32_t head_dim, std::uint32_t page_size,
                                           kvcache::DType dtype = kvcache::DType::f32) {
  return make_params(kvcache::CacheStrategy::paged, num_layers, n_kv_heads, head_dim, page_size,
                     dtype);
}

inline kvcache::KVCacheParams continuous_params(std::uint32_t num_layers,
                                                std::uint32_t n_kv_heads, std::uint32_t head_dim,
                                                kvcache::DType dtype = kvcache::DType::f32) {
  return make_params(kvcache::CacheStrategy::continuous, num_layers, n_kv_heads, head_dim, 0,
                     dtype);
}

// ---- exceptions -------------------------------------------------------------

inline std::string str(std::uint64_t v) { return std::to_string(v); }

// Runs f, which must throw E (exactly that type or a subclass, not some other
// kvcache::Error); checks that the message contains every string in `needles`.
// Returns the message ("" if the check failed).
template <class E, class F>
std::string expect_throw(F&& f, std::initializer_list<std::string> needles, const char* what,
                         int line) {
  std::string msg;
  try {
    f();
  } catch (const E& e) {
    msg = e.what();
    for (const auto& n : needles) {
      EXPECT_NE(msg.find(n), std::string::npos)
          << "line " << line << ": message of " << what << " is '" << msg << "', lacks '" << n
          << "'";
    }
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "line " << line << ": " << what << " threw the wrong type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "line " << line << ": " << what << " did not throw";
  return "";
}

}  // namespace kvtest

// KV_EXPECT_THROW(statement, ExceptionType, "needle", ...): statement throws
// ExceptionType and its message contains every needle.
#define KV_EXPECT_THROW(stmt, ExType, ...)                                                     \
  ::kvtest::expect_throw<ExType>([&] { (void)(stmt); }, {__VA_ARGS__}, #stmt " -> " #ExType, \
                                 __LINE__)

namespace kvtest {

// ---- strong guarantee ---------------------------------------------------------

// Byte copy of a manager's whole block buffer (all devices) obtained from a batch.
inline std::size_t buffer_bytes(const kvcache::KVCacheManager& m) {
  const auto shape = m.block_shape(m.total_blocks());
  std::size_t n = 1;
  for (auto s : shape) n *= s;
  return n * kvcache::dtype_size(m.params().dtype);
}

inline std::vector<std::vector<unsigned char>> copy_buffers(const kvcache::KVCacheManager& m,
                                                            const kvcache::KVCacheBatch& any) {
  std::vector<std::vector<unsigned char>> out;
  const std::size_t bytes = buffer_bytes(m);
  for (std::uint32_t dev = 0; dev < m.params().n_devices; ++dev) {
    const auto* p = static_cast<const unsigned char*>(any.blocks(dev));
    out.emplace_back(p, p + bytes);
  }
  return out;
}

// ---- float64 attention oracle -------------------------------------------------

// History + new K/V of one batch entry, as the cache holds them (already
// quantized to the cache dtype), [pos][head][dim].
struct SeqKV {
  std::vector<float> k, v;
  std::uint32_t length(std::uint32_t n_kv, std::uint32_t dim) const {
    return static_cast<std::uint32_t>(k.size() / (std::size_t{n_kv} * dim));
  }
};

// Causal GQA attention in double: new query row i of entry b sits at position
// cache_len[b] + i and attends to positions 0..=that position.
inline std::vector<double> attention_f64(const std::vector<SeqKV>& seqs, const U32& cache_len,
                                         const U32& row_offsets, const std::vector<float>& q,
                                         std::uint32_t n_q_heads, std::uint32_t n_kv,
                                         std::uint32_t dim, double scale = 0.0) {
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(dim));
  const std::uint32_t group = n_q_heads / n_kv;
  const std::size_t q_row = std::size_t{n_q_heads} * dim;
  const std::size_t kv_row = std::size_t{n_kv} * dim;
  std::vector<double> out(q.size(), 0.0);
  for (std::size_t b = 0; b + 1 < row_offsets.size(); ++b) {
    for (std::uint32_t r = row_offsets[b]; r < row_offsets[b + 1]; ++r) {
      const std::uint32_t ctx = cache_len[b] + (r - row_offsets[b]) + 1;
      for (std::uint32_t h = 0; h < n_q_heads; ++h) {
        const std::uint32_t kvh = h / group;
        std::vector<double> s(ctx);
        double mx = -1e300;
        for (std::uint32_t t = 0; t < ctx; ++t) {
          double acc = 0;
          for (std::uint32_t d = 0; d < dim; ++d)
            acc += double(q[r * q_row + h * dim + d]) * double(seqs[b].k[t * kv_row + kvh * dim + d]);
          s[t] = acc * scale;
          mx = std::max(mx, s[t]);
        }
        double sum = 0;
        for (auto& x : s) {
          x = std::exp(x - mx);
          sum += x;
        }
        for (std::uint32_t t = 0; t < ctx; ++t) {
          const double p = s[t] / sum;
          for (std::uint32_t d = 0; d < dim; ++d)
            out[r * q_row + h * dim + d] += p * double(seqs[b].v[t * kv_row + kvh * dim + d]);
        }
      }
    }
  }
  return out;
}

// Row offsets from per-entry counts.
inline U32 offsets_of(const U32& counts) {
  U32 off(counts.size() + 1, 0);
  for (std::size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

// Distinct-id check.
template <class C>
bool all_distinct(const C& c) {
  std::set<typename C::value_type> s(c.begin(), c.end());
  return s.size() == c.size();
}

}  // namespace kvtest
