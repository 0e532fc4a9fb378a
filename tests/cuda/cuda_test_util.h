// Helpers of the CUDA kernel tests: a host cache (kernels/kernel_test_util.h)
// mirrored into a device pool, run through the reference on the host and the
// CUDA kernels on the device, and compared.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/decode_tuning.h"
#include "kernels/kernel_test_util.h"
#include "kvcache/cuda/device.h"
#include "kvcache/cuda/device_buffer.h"
#include "kvcache/cuda/device_collection.h"
#include "kvcache/cuda/kernels.h"
#include "kvcache/cuda/workspace.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/params.h"

namespace kvcache::cuda::test {

using kvcache::test::Entry;
using kvcache::test::OwnedCache;

struct Case {
  std::vector<Entry> entries;
  bool paged = true;
  std::uint32_t page = 16;
  std::uint32_t n_kv = 2;
  std::uint32_t group = 1;
  std::uint32_t dim = 64;
  PageLayout layout = PageLayout::nhd;
  // Paged only: every entry's history starts this many pages later (the
  // pages in front all map to the entry's first page): positions past 100k
  // without a pool that large (store tests; attention would walk them all).
  std::uint32_t far_pages = 0;
  std::string name() const {
    return std::string(paged ? "paged" : "continuous") + " page " + std::to_string(page) + " kv " +
           std::to_string(n_kv) + " group " + std::to_string(group) + " dim " +
           std::to_string(dim) + " " + std::string(layout_name(layout)) + " entries " +
           std::to_string(entries.size()) + " first context " +
           std::to_string(entries[0].cache_length + entries[0].new_tokens) +
           (far_pages != 0 ? " far_pages " + std::to_string(far_pages) : std::string());
  }
};

// `pages` more pages of history in front of every entry (Case::far_pages).
// Each entry must hold at least one token.
template <CacheElement T>
void push_history_back(OwnedCache<T>& h, std::uint32_t pages) {
  if (pages == 0) return;
  const std::uint32_t batch = h.desc.batch_size, old_stride = h.desc.lookup_stride;
  const std::uint32_t stride = old_stride + pages;
  std::vector<std::uint32_t> lookup(std::size_t{batch} * stride);
  for (std::uint32_t b = 0; b < batch; ++b) {
    for (std::uint32_t j = 0; j < stride; ++j) {
      lookup[std::size_t{b} * stride + j] =
          h.lookup[std::size_t{b} * old_stride + (j < pages ? 0 : j - pages)];
    }
    h.cache_lengths[b] += pages * h.desc.page_size;
    h.reserved[b] += pages * h.desc.page_size;
  }
  h.lookup = std::move(lookup);
  h.desc.lookup_table = h.lookup.data();
  h.desc.lookup_stride = stride;
  h.desc.max_cache_length += pages * h.desc.page_size;
  h.desc.max_full_context_length += pages * h.desc.page_size;
}

// The paged bf16 manager shape of the manager-flow tests.
inline KVCacheParams bf16_paged_params(std::uint32_t layers, std::uint32_t kv_heads,
                                       std::uint32_t dim, std::uint32_t page) {
  return {.dtype = DType::bf16,
          .num_layers = layers,
          .n_kv_heads = kv_heads,
          .head_dim = dim,
          .cache_strategy = CacheStrategy::paged,
          .page_size = page};
}

template <CacheElement T>
OwnedCache<T> make_host(const Case& c, std::mt19937& rng) {
  OwnedCache<T> h(c.entries, c.paged, c.page, c.n_kv, c.dim, rng, c.layout);
  push_history_back(h, c.far_pages);
  return h;
}

// One case's host data and its device mirror.
template <CacheElement T>
struct Mirrored {
  OwnedCache<T> host;
  DeviceBuffer<T> pool;
  DeviceCollection<T> dev;
  std::vector<float> k_new, v_new, q;
  DeviceBuffer<float> k_new_d, v_new_d, q_d, out_d;
  DeviceBuffer<std::uint32_t> offsets_d;
  std::uint32_t n_q;

  Mirrored(const Case& c, std::mt19937& rng)
      : host(make_host<T>(c, rng)),
        pool(DeviceBuffer<T>::from_host({host.blocks.data(), host.blocks.size()})),
        dev(host.desc, pool.data()),
        n_q(c.n_kv * c.group) {
    const std::size_t rows = host.total_rows();
    k_new = kvcache::test::random_floats(rows * c.n_kv * c.dim, -1.0f, 1.0f, rng);
    v_new = kvcache::test::random_floats(rows * c.n_kv * c.dim, -1.0f, 1.0f, rng);
    q = kvcache::test::random_floats(rows * n_q * c.dim, -1.0f, 1.0f, rng);
    k_new_d = DeviceBuffer<float>::from_host(k_new);
    v_new_d = DeviceBuffer<float>::from_host(v_new);
    q_d = DeviceBuffer<float>::from_host(q);
    out_d = DeviceBuffer<float>(q.size());
    out_d.fill_bytes(0xff);  // poison: every float a NaN
    offsets_d = DeviceBuffer<std::uint32_t>::from_host(host.row_offsets);
  }

  CacheDesc key() const { return dev.key(OwnedCache<T>::kLayer); }
  CacheDesc value() const { return dev.value(OwnedCache<T>::kLayer); }

  void store_on_device() {
    cuda::store_kv(key(), value(), std::span<const float>(k_new_d.span()),
                   std::span<const float>(v_new_d.span()),
                   std::span<const std::uint32_t>(offsets_d.span()));
  }
  void attend_on_device(AttentionWorkspace* ws = nullptr) { attend_into(out_d, ws); }
  void attend_into(DeviceBuffer<float>& out, AttentionWorkspace* ws = nullptr) {
    cuda::attention(key(), value(), std::span<const float>(q_d.span()), n_q,
                    std::span<const std::uint32_t>(offsets_d.span()), out.span(), {}, nullptr, ws);
  }
  // attention through the generic kernel whatever the shape
  // (detail::DecodeTuning::generic), with `options`.
  void attend_generic(const AttentionOptions& options = {}, AttentionWorkspace* ws = nullptr) {
    detail::DecodeTuning t;
    t.generic = true;
    const CacheDesc k = key(), v = value();
    detail::attention_cuda_tuned(dtype_of_v<T>, k, v, std::span<const float>(q_d.span()), n_q,
                                 std::span<const std::uint32_t>(offsets_d.span()), out_d.span(),
                                 options, nullptr, ws, t);
  }
  // The references on the host cache (store_kv_reference into the host
  // pool, then attention_reference with `options`); returns the output.
  // round_q: the reference sees q rounded to T (what the prefill kernel
  // feeds its tensor cores).
  std::vector<float> reference(const AttentionOptions& options = {}, bool round_q = false) {
    std::vector<float> q_ref = q;
    if (round_q) {
      for (float& x : q_ref) x = to_float(from_float<T>(x));
    }
    std::vector<float> out(q.size());
    kvcache::test::with_collection(host, [&](const auto& col) {
      const auto k = col.get_key_cache(OwnedCache<T>::kLayer);
      const auto v = col.get_value_cache(OwnedCache<T>::kLayer);
      store_kv_reference(k, v, std::span<const float>(k_new), std::span<const float>(v_new),
                         std::span<const std::uint32_t>(host.row_offsets));
      attention_reference(k, v, std::span<const float>(q_ref), n_q,
                          std::span<const std::uint32_t>(host.row_offsets), std::span<float>(out),
                          options);
    });
    return out;
  }
  // Whether the device pool equals the host pool byte for byte.
  bool pools_equal() const {
    const std::vector<T> d = pool.to_host();
    return std::memcmp(d.data(), host.blocks.data(), d.size() * sizeof(T)) == 0;
  }
};

// Absolute bound of the prefill kernel (f16 / bf16 caches) against
// attention_reference on q rounded to T (docs/CUDA.md derives it): the
// softmax weights p (<= 1, relative to the running max) are rounded to T for
// the P.V mma while the row sum l is kept in f32, so an output moves by at
// most sum_j |round(p_j) - p_j| |v_j| / l <= u max|v| (u: T's unit
// roundoff, 2^-8 bf16, 2^-11 f16; |v| <= 1 here); f16 weights below 2^-14
// are subnormal with an absolute error up to 2^-25 each, at most
// context x 2^-25 more (l >= 1); plus the fp32 bound 1e-5 of the other
// kernels (the relative 1e-5 is applied on top by the caller).
template <CacheElement T>
float prefill_abs_tol(std::uint32_t max_context) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return 1e-5f + 0x1p-8f;
  } else {
    return 1e-5f + 0x1p-11f + static_cast<float>(max_context) * 0x1p-25f;
  }
}

// Every element finite (written: the poison is NaN) and within
// abs_tol + rel_tol * |ref|. Reports the first few failures.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref,
                         float abs_tol, float rel_tol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int failures = 0;
  for (std::size_t i = 0; i < got.size() && failures < 5; ++i) {
    const float bound = abs_tol + rel_tol * std::fabs(ref[i]);
    if (!std::isfinite(got[i]) || std::fabs(got[i] - ref[i]) > bound) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", reference " << ref[i]
                    << " (bound " << bound << ")";
      ++failures;
    }
  }
}

}  // namespace kvcache::cuda::test
