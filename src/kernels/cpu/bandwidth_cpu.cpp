// Bandwidth / FMA probes (Highway, runtime dispatch); see kernels/bandwidth.h.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kvcache/error.h"
#include "kvcache/kernels/bandwidth.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/bandwidth_cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float ReadSlice(const float* p, std::size_t n) {
  const hn::ScalableTag<float> df;
  const std::size_t lanes = hn::Lanes(df);
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  std::size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    a0 = hn::Add(a0, hn::LoadU(df, p + i));
    a1 = hn::Add(a1, hn::LoadU(df, p + i + lanes));
    a2 = hn::Add(a2, hn::LoadU(df, p + i + 2 * lanes));
    a3 = hn::Add(a3, hn::LoadU(df, p + i + 3 * lanes));
  }
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n; ++i) s += p[i];
  return s;
}

std::uint64_t FmaSlice(std::uint64_t iterations, float* sink) {
  const hn::ScalableTag<float> df;
  constexpr int kChains = 12;  // > latency x ports, fits in 16 registers
  hn::Vec<decltype(df)> a[kChains];
  for (int c = 0; c < kChains; ++c) a[c] = hn::Set(df, 1.0f + 1e-7f * c);
  const auto m = hn::Set(df, 0.999999f);
  const auto b = hn::Set(df, 1e-6f);
  for (std::uint64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) a[c] = hn::MulAdd(a[c], m, b);
  }
  auto s = a[0];
  for (int c = 1; c < kChains; ++c) s = hn::Add(s, a[c]);
  *sink += hn::GetLane(s);
  return iterations * kChains * hn::Lanes(df) * 2;
}

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache::kernels {
HWY_EXPORT(ReadSlice);
HWY_EXPORT(FmaSlice);

namespace {
std::size_t workers(ThreadPool* pool) { return pool == nullptr ? 1 : pool->num_threads(); }

// [begin, end) of slice i of n items split w ways, 4 KiB aligned.
std::pair<std::size_t, std::size_t> slice(std::size_t n, std::size_t w, std::size_t i,
                                          std::size_t align) {
  const std::size_t per = (n / w + align - 1) / align * align;
  const std::size_t b = std::min(n, per * i);
  return {b, i + 1 == w ? n : std::min(n, b + per)};
}

template <class F>
void on_threads(ThreadPool* pool, const F& f) {
  if (pool == nullptr || pool->num_threads() == 1) {
    f(0);
  } else {
    pool->parallel_for(pool->num_threads(), f);
  }
}
}  // namespace

float stream_read(const void* data, std::size_t bytes, ThreadPool* pool) {
  const std::size_t n = bytes / sizeof(float);
  const std::size_t w = workers(pool);
  std::vector<float> sums(w, 0.0f);
  on_threads(pool, [&](std::size_t i) {
    const auto [b, e] = slice(n, w, i, 1024);
    sums[i] = HWY_DYNAMIC_DISPATCH(ReadSlice)(static_cast<const float*>(data) + b, e - b);
  });
  float s = 0.0f;
  for (float x : sums) s += x;
  return s;
}

float paged_read(const CacheDesc& k, const CacheDesc& v, std::span<const std::uint32_t> tokens,
                 ThreadPool* pool) {
  if (tokens.size() != k.batch_size) {
    throw InvalidArgument("paged_read: " + std::to_string(tokens.size()) +
                          " token counts for a batch of " + std::to_string(k.batch_size));
  }
  k.validate();
  if (v.dtype != k.dtype || v.block_stride != k.block_stride || v.lookup_table != k.lookup_table ||
      v.batch_size != k.batch_size) {
    throw InvalidArgument("paged_read: the K and V descriptors differ in dtype, stride or batch");
  }
  const std::size_t element_bytes = dtype_size(k.dtype);
  CacheDesc table = k;  // the view reads only lengths and the page table
  table.dtype = DType::f32;
  const LayerCacheBase<float> view(table);
  // (entry, block index) of every block touched, in page-table order.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> blocks;
  for (std::uint32_t b = 0; b < k.batch_size; ++b) {
    const std::uint64_t limit = std::min<std::uint64_t>(
        std::uint64_t{k.lookup_stride} * k.page_size, view.reserved_length(b));
    if (tokens[b] > limit) {
      throw InvalidArgument("paged_read: entry " + std::to_string(b) + " asks for " +
                            std::to_string(tokens[b]) + " tokens, the view's limit is " +
                            std::to_string(limit));
    }
    for (std::uint32_t j = 0; std::uint64_t{j} * k.page_size < tokens[b]; ++j)
      blocks.emplace_back(b, j);
  }
  // NHD: a block's rows of tokens [0, rows) are one run of rows * n_kv * dim
  // elements; HND: one run of rows * dim per head, page_size * dim apart.
  const bool hnd = k.layout == PageLayout::hnd && k.n_kv_heads > 1;
  const std::size_t run_elems = hnd ? k.head_dim : std::size_t{k.n_kv_heads} * k.head_dim;
  const std::size_t runs = hnd ? k.n_kv_heads : 1;
  const std::size_t head_bytes = k.head_stride * element_bytes;
  const std::size_t w = workers(pool);
  std::vector<float> sums(w, 0.0f);
  on_threads(pool, [&](std::size_t i) {
    const auto [first, last] = slice(blocks.size(), w, i, 1);
    float s = 0.0f;
    for (std::size_t u = first; u < last; ++u) {
      const auto [b, j] = blocks[u];
      const std::uint32_t block = k.lookup_table[std::size_t{b} * k.lookup_stride + j];
      const std::uint32_t rows = std::min<std::uint32_t>(k.page_size, tokens[b] - j * k.page_size);
      const std::size_t n = rows * run_elems * element_bytes / sizeof(float);
      for (std::size_t r = 0; r < runs; ++r) {
        const std::size_t offset =
            std::size_t{block} * k.block_stride * element_bytes + r * head_bytes;
        s += HWY_DYNAMIC_DISPATCH(ReadSlice)(
            reinterpret_cast<const float*>(reinterpret_cast<const char*>(k.blocks) + offset), n);
        s += HWY_DYNAMIC_DISPATCH(ReadSlice)(
            reinterpret_cast<const float*>(reinterpret_cast<const char*>(v.blocks) + offset), n);
      }
    }
    sums[i] = s;
  });
  float s = 0.0f;
  for (float x : sums) s += x;
  return s;
}

void stream_copy(void* dst, const void* src, std::size_t bytes, ThreadPool* pool) {
  const std::size_t w = workers(pool);
  on_threads(pool, [&](std::size_t i) {
    const auto [b, e] = slice(bytes, w, i, 4096);
    std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, e - b);
  });
}

std::uint64_t fma_peak(std::uint64_t iterations, ThreadPool* pool, float* sink) {
  const std::size_t w = workers(pool);
  std::vector<std::uint64_t> flops(w, 0);
  std::vector<float> sinks(w, 0.0f);
  on_threads(pool, [&](std::size_t i) {
    flops[i] = HWY_DYNAMIC_DISPATCH(FmaSlice)(iterations, &sinks[i]);
  });
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < w; ++i) {
    total += flops[i];
    *sink += sinks[i];
  }
  return total;
}

}  // namespace kvcache::kernels
#endif  // HWY_ONCE
