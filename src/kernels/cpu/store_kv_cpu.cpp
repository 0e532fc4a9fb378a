// Fast store_kv (Highway, runtime dispatch): each new token's row of
// n_kv_heads * head_dim floats is contiguous in both the input and the cache,
// so a row is one conversion loop (f32 copy, f16 via the hardware converter,
// bf16 with integer round-to-nearest-even, bit-identical to from_float).
// With rope_k, K is rotated into a per-thread float row first, using the
// cos/sin of kernels/rope.h (shared by the token's heads).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/kernel_common.h"
#include "kvcache/error.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/rope.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/store_kv_cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

HWY_INLINE void ConvertRow(const float* src, float* dst, std::size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

HWY_INLINE void ConvertRow(const float* src, hwy::float16_t* dst, std::size_t n) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const std::size_t lanes = hn::Lanes(df);
  std::size_t i = 0;
#if HWY_TARGET <= HWY_AVX2
  // F16C hardware conversion: round-to-nearest-even, bit-identical to f32_to_f16_bits.
  // Highway's software DemoteTo on older / non-x86 targets rounds differently, so
  // those take the exact scalar path below.
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, dst + i);
#else
  (void)dh;
  (void)lanes;
#endif
  for (; i < n; ++i) {
    const std::uint16_t bits = f32_to_f16_bits(src[i]);
    std::memcpy(dst + i, &bits, sizeof(bits));
  }
}

HWY_INLINE void ConvertRow(const float* src, hwy::bfloat16_t* dst, std::size_t n) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<std::uint16_t, DF> du16;
  const std::size_t lanes = hn::Lanes(df);
  const auto one = hn::Set(du, 1u);
  const auto bias = hn::Set(du, 0x7fffu);
  const auto quiet = hn::Set(du, 0x40u);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto f = hn::LoadU(df, src + i);
    const auto x = hn::BitCast(du, f);
    const auto rounded = hn::ShiftRight<16>(hn::Add(x, hn::Add(bias, hn::And(hn::ShiftRight<16>(x), one))));
    const auto nan = hn::Or(hn::ShiftRight<16>(x), quiet);
    const auto bits = hn::IfThenElse(hn::RebindMask(du, hn::Ne(f, f)), nan, rounded);
    const auto packed = hn::DemoteTo(du16, hn::BitCast(di, bits));
    hn::StoreU(packed, du16, reinterpret_cast<std::uint16_t*>(dst + i));
  }
  for (; i < n; ++i) {
    const std::uint16_t bits = f32_to_bf16_bits(src[i]);
    std::memcpy(dst + i, &bits, sizeof(bits));
  }
}

// Rotates one token's K row (all heads) for position pos into dst.
void RopeRow(const StoreCtx& c, const float* src, float* dst, std::uint32_t pos, float* cs) {
  const std::uint32_t half = c.rotary_dim / 2;
  for (std::uint32_t i = 0; i < half; ++i) rope_cos_sin(pos, c.inv_freq[i], cs[i], cs[half + i]);
  const std::size_t row = std::size_t{c.n_kv} * c.dim;
  std::memcpy(dst, src, row * sizeof(float));
  for (std::uint32_t h = 0; h < c.n_kv; ++h) {
    const float* x = src + std::size_t{h} * c.dim;
    float* y = dst + std::size_t{h} * c.dim;
    for (std::uint32_t i = 0; i < half; ++i) {
      rope_rotate_pair(x[i], x[i + half], cs[i], cs[half + i], y[i], y[i + half]);
    }
  }
}

template <class T>
void RunStore(const StoreCtx& c) {
  const std::size_t row = std::size_t{c.n_kv} * c.dim;
  constexpr std::uint32_t kRowsPerChunk = 16;
  const std::uint32_t n_chunks = (c.total_rows + kRowsPerChunk - 1) / kRowsPerChunk;
  auto store_rows = [&](std::uint32_t r0, std::uint32_t r1, std::vector<float>& tmp) {
    // Entry of row r0 (row_offsets is sorted; rows of empty entries never occur).
    std::uint32_t b = static_cast<std::uint32_t>(
        std::upper_bound(c.row_offsets, c.row_offsets + c.batch + 1, r0) - c.row_offsets - 1);
    for (std::uint32_t r = r0; r < r1; ++r) {
      while (r >= c.row_offsets[b + 1]) ++b;
      const std::uint32_t pos = c.cache_lengths[b] + (r - c.row_offsets[b]);
      const std::uint32_t block = c.lookup[std::size_t{b} * c.lookup_stride + pos / c.page];
      const std::size_t off = std::size_t{block} * c.block_stride + std::size_t{pos % c.page} * row;
      const float* k_src = c.k_new + std::size_t{r} * row;
      if (c.rope) {
        RopeRow(c, k_src, tmp.data(), pos, tmp.data() + row);
        k_src = tmp.data();
      }
      ConvertRow(k_src, static_cast<T*>(c.k_blocks) + off, row);
      ConvertRow(c.v_new + std::size_t{r} * row, static_cast<T*>(c.v_blocks) + off, row);
    }
  };
  const std::size_t tmp_size = c.rope ? row + c.rotary_dim : 0;
  const std::size_t workers =
      c.pool == nullptr ? 1 : std::min<std::size_t>(c.pool->num_threads(), n_chunks);
  if (workers <= 1) {
    std::vector<float> tmp(tmp_size);
    store_rows(0, c.total_rows, tmp);
    return;
  }
  std::atomic<std::uint32_t> next{0};
  c.pool->parallel_for(workers, [&](std::size_t) {
    std::vector<float> tmp(tmp_size);
    for (std::uint32_t ch = next.fetch_add(1); ch < n_chunks; ch = next.fetch_add(1)) {
      store_rows(ch * kRowsPerChunk, std::min(c.total_rows, (ch + 1) * kRowsPerChunk), tmp);
    }
  });
}

void StoreF32(const StoreCtx& c) { RunStore<float>(c); }
void StoreF16(const StoreCtx& c) { RunStore<hwy::float16_t>(c); }
void StoreBF16(const StoreCtx& c) { RunStore<hwy::bfloat16_t>(c); }

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache {
namespace kernels {
HWY_EXPORT(StoreF32);
HWY_EXPORT(StoreF16);
HWY_EXPORT(StoreBF16);
}  // namespace kernels

namespace detail {

void store_kv_cpu(DType dtype, const LayerCacheDesc<float>& k, const LayerCacheDesc<float>& v,
                  std::span<const float> k_new, std::span<const float> v_new,
                  std::span<const std::uint32_t> row_offsets, const StoreOptions& options,
                  ThreadPool* pool) {
  kernels::check_shapes(k, v, row_offsets);
  const std::size_t row = std::size_t{k.n_kv_heads} * k.head_dim;
  const std::uint32_t total = row_offsets[k.batch_size];
  check_size("k_new", k_new.size(), total * row);
  check_size("v_new", v_new.size(), total * row);
  std::vector<float> inv_freq;
  kernels::StoreCtx c;
  if (options.rope_k.enabled) {
    c.rope = true;
    c.rotary_dim = rope_rotary_dim(options.rope_k, k.head_dim);
    inv_freq.resize(c.rotary_dim / 2);
    for (std::uint32_t i = 0; i < c.rotary_dim / 2; ++i)
      inv_freq[i] = rope_inv_freq(i, c.rotary_dim, options.rope_k.theta);
    c.inv_freq = inv_freq.data();
  }
  if (total == 0) return;
  c.k_blocks = k.blocks;
  c.v_blocks = v.blocks;
  c.block_stride = k.block_stride;
  c.cache_lengths = k.cache_lengths;
  c.lookup = k.lookup_table;
  c.lookup_stride = k.lookup_stride;
  c.page = k.block_tokens;
  c.batch = k.batch_size;
  c.n_kv = k.n_kv_heads;
  c.dim = k.head_dim;
  c.k_new = k_new.data();
  c.v_new = v_new.data();
  c.row_offsets = row_offsets.data();
  c.total_rows = total;
  c.pool = pool;
  switch (dtype) {
    case DType::f32: HWY_DYNAMIC_DISPATCH(kernels::StoreF32)(c); break;
    case DType::f16: HWY_DYNAMIC_DISPATCH(kernels::StoreF16)(c); break;
    case DType::bf16: HWY_DYNAMIC_DISPATCH(kernels::StoreBF16)(c); break;
  }
}

}  // namespace detail
}  // namespace kvcache
#endif  // HWY_ONCE
