// Fast store_kv (Highway, runtime dispatch): each new token's row of
// n_kv_heads * head_dim floats is contiguous in the input and, with the NHD
// layout, in the cache, so a row is one conversion loop (f32 copy, f16 via
// the hardware converter, bf16 with integer round-to-nearest-even,
// bit-identical to from_float); with HND it is one loop per head.
// With rope_k, the cos/sin of kernels/rope.h (shared by the token's heads,
// read from a RopeTable when the caller gave one) rotate each K head in
// registers on its way to the conversion where the rotated pairs fill whole
// vector pairs (RotateConvertHead), else into a per-thread float row first.
// 8-bit caches quantise each (token, head) row (store_q8-inl.h), exactly as
// the views' store_row does, K rotated into a float row first.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/kernel_common.h"
#include "kvcache/error.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/rope.h"
#include "kvcache/kernels/rope_table.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/store_kv_cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/cpu/quantize-inl.h"
#include "kernels/cpu/store_q8-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Stores one converted vector: a non-temporal (streaming) store when kStream
// (dst is then aligned to the vector size), a plain store otherwise.
template <bool kStream, class D, class V>
HWY_INLINE void PutVec(V v, D d, hn::TFromD<D>* dst) {
  if constexpr (kStream) {
    hn::Stream(v, d, dst);
  } else {
    hn::StoreU(v, d, dst);
  }
}

// StorePrefetch::next_row_l1: while a conversion loop reads src[i], it
// prefetches src[i + kPrefetchAheadFloats] into L1, one line per 64 bytes
// read. The input rows of a token and of the next token are contiguous, so
// the prefetches run on into the next row. This replaced one burst of the
// whole next row (2 x 4 KiB at head dim 128 x 8 heads) at each row's start,
// which the L1's miss buffers cannot take at once: alternated rounds on the
// Zen 3 VM (DRAM, 16 x 4,096 tokens, 2 threads), bf16 1.13x (8 rounds, every
// one faster), f16 1.10x over no prefetch, f32 0.94x.
constexpr std::size_t kPrefetchAheadFloats = 2048 / sizeof(float);
constexpr std::size_t kFloatsPerLine = 64 / sizeof(float);

// For a loop step reading src[i, i + step): prefetches src[j + pf] for each
// j in it that starts a 64-byte line's worth of floats (pf: 0 for none).
HWY_INLINE void PrefetchAhead(const float* src, std::size_t i, std::size_t step, std::size_t pf) {
  if (pf == 0) return;
  for (std::size_t j = (i + kFloatsPerLine - 1) / kFloatsPerLine * kFloatsPerLine; j < i + step;
       j += kFloatsPerLine) {
    prefetch_l1(src + j + pf);
  }
}

template <bool kStream>
HWY_INLINE void ConvertRow(const float* src, float* dst, std::size_t n, std::size_t pf = 0) {
  if (!kStream && pf == 0) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const DF df;
  const std::size_t lanes = hn::Lanes(df);
  std::size_t i = 0;
  if (pf == 0) {  // a plain copy loop (the check inside the loop cost f32 ~6 % here)
    for (; i + lanes <= n; i += lanes) PutVec<kStream>(hn::LoadU(df, src + i), df, dst + i);
  } else {
    for (; i + lanes <= n; i += lanes) {
      PrefetchAhead(src, i, lanes, pf);
      PutVec<kStream>(hn::LoadU(df, src + i), df, dst + i);
    }
  }
  std::memcpy(dst + i, src + i, (n - i) * sizeof(float));
}

template <bool kStream>
HWY_INLINE void ConvertRow(const float* src, hwy::float16_t* dst, std::size_t n,
                           std::size_t pf = 0) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const std::size_t lanes = hn::Lanes(df);
  std::size_t i = 0;
#if HWY_TARGET <= HWY_AVX2
  // F16C hardware conversion: round-to-nearest-even, bit-identical to f32_to_f16_bits.
  // Highway's software DemoteTo on older / non-x86 targets rounds differently, so
  // those take the exact scalar path below.
  for (; i + lanes <= n; i += lanes) {
    PrefetchAhead(src, i, lanes, pf);
    PutVec<kStream>(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, dst + i);
  }
#else
  (void)dh;
  (void)lanes;
  (void)pf;
#endif
  for (; i < n; ++i) {
    const std::uint16_t bits = f32_to_f16_bits(src[i]);
    std::memcpy(dst + i, &bits, sizeof(bits));
  }
}

// bf16: round to nearest even on the integer pattern (x + 0x7fff + lsb),
// then the high halves of two vectors are gathered by ConcatOdd (one lane
// permute for 2 * lanes elements). Vector pairs holding a NaN (rare) take the
// exact scalar converter, which quiets them.
#if HWY_TARGET != HWY_SCALAR
template <bool kStream>
HWY_INLINE void PutPair(VF f0, VF f1, hwy::bfloat16_t* dst) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Repartition<std::uint16_t, DF> du16;
  const std::size_t lanes = hn::Lanes(df);
  auto* out = reinterpret_cast<std::uint16_t*>(dst);
  if (HWY_UNLIKELY(!hn::AllFalse(df, hn::Or(hn::IsNaN(f0), hn::IsNaN(f1))))) {
    HWY_ALIGN float buf[2 * hn::MaxLanes(df)];
    hn::StoreU(f0, df, buf);
    hn::StoreU(f1, df, buf + lanes);
    for (std::size_t j = 0; j < 2 * lanes; ++j) out[j] = f32_to_bf16_bits(buf[j]);
    return;
  }
  const auto one = hn::Set(du, 1u);
  const auto bias = hn::Set(du, 0x7fffu);
  const auto x0 = hn::BitCast(du, f0);
  const auto x1 = hn::BitCast(du, f1);
  const auto r0 = hn::Add(x0, hn::Add(bias, hn::And(hn::ShiftRight<16>(x0), one)));
  const auto r1 = hn::Add(x1, hn::Add(bias, hn::And(hn::ShiftRight<16>(x1), one)));
  PutVec<kStream>(hn::ConcatOdd(du16, hn::BitCast(du16, r1), hn::BitCast(du16, r0)), du16, out);
}
#endif

template <bool kStream>
HWY_INLINE void ConvertRow(const float* src, hwy::bfloat16_t* dst, std::size_t n,
                           std::size_t pf = 0) {
  std::size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const DF df;
  const std::size_t lanes = hn::Lanes(df);
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    PrefetchAhead(src, i, 2 * lanes, pf);
    PutPair<kStream>(hn::LoadU(df, src + i), hn::LoadU(df, src + i + lanes), dst + i);
  }
#else
  (void)pf;
#endif
  for (; i < n; ++i) {
    const std::uint16_t bits = f32_to_bf16_bits(src[i]);
    std::memcpy(dst + i, &bits, sizeof(bits));
  }
}

// The fused rotation below writes its results with PutPair: 2 * lanes
// floats (f0 then f1) converted to T at dst (vector-aligned when kStream).
template <bool kStream>
HWY_INLINE void PutPair(VF f0, VF f1, float* dst) {
  const DF df;
  PutVec<kStream>(f0, df, dst);
  PutVec<kStream>(f1, df, dst + hn::Lanes(df));
}

template <bool kStream>
HWY_INLINE void PutPair(VF f0, VF f1, hwy::float16_t* dst) {
  const DF df;
  const std::size_t lanes = hn::Lanes(df);
#if HWY_TARGET <= HWY_AVX2
  const hn::Rebind<hwy::float16_t, DF> dh;
  PutVec<kStream>(hn::DemoteTo(dh, f0), dh, dst);
  PutVec<kStream>(hn::DemoteTo(dh, f1), dh, dst + lanes);
#else
  HWY_ALIGN float buf[2 * hn::MaxLanes(df)];
  hn::StoreU(f0, df, buf);
  hn::StoreU(f1, df, buf + lanes);
  ConvertRow<false>(buf, dst, 2 * lanes);
#endif
}

// Lanes e .. e + lanes of the pairs (i, i + half) of head vector x, with
// cos/sin cs[i] / cs[half + i]: y0 = fma(x0, c, -(x1 * s)),
// y1 = fma(x0, s, x1 * c), rope_rotate_pair's expression with one rounding
// per fma, so only targets with a native FMA use it (elsewhere Highway's
// MulAdd rounds twice).
HWY_INLINE void RotateVec(const float* x, const float* cs, std::size_t half, std::size_t e, VF& y0,
                          VF& y1) {
  const DF df;
  const VF x0 = hn::LoadU(df, x + e);
  const VF x1 = hn::LoadU(df, x + half + e);
  const VF c = hn::LoadU(df, cs + e);
  const VF s = hn::LoadU(df, cs + half + e);
  y0 = hn::MulSub(x0, c, hn::Mul(x1, s));
  y1 = hn::MulAdd(x0, s, hn::Mul(x1, c));
}

// Rotates the first 2 * half elements of one head vector x into y.
HWY_INLINE void RotateHead(const float* x, float* y, const float* cs, std::uint32_t half) {
  std::uint32_t i = 0;
#if HWY_NATIVE_FMA
  const DF df;
  const std::uint32_t lanes = static_cast<std::uint32_t>(hn::Lanes(df));
  for (; i + lanes <= half; i += lanes) {
    VF y0, y1;
    RotateVec(x, cs, half, i, y0, y1);
    hn::StoreU(y0, df, y + i);
    hn::StoreU(y1, df, y + half + i);
  }
#endif
  for (; i < half; ++i) rope_rotate_pair(x[i], x[i + half], cs[i], cs[half + i], y[i], y[i + half]);
}

// cos/sin of position pos (rotary_dim floats: cos half, sin half): from the
// RopeTable when it covers pos, else computed into `scratch`.
HWY_INLINE const float* RopeCosSin(const StoreCtx& c, std::uint32_t pos, float* scratch) {
  if (pos < c.rope_positions) return c.rope_cos_sin + std::size_t{pos} * c.rotary_dim;
  const std::uint32_t half = c.rotary_dim / 2;
  for (std::uint32_t i = 0; i < half; ++i)
    rope_cos_sin(pos, c.inv_freq[i], scratch[i], scratch[half + i]);
  return scratch;
}

// Rotates one token's K row (all heads) for position pos into dst.
void RopeRow(const StoreCtx& c, const float* src, float* dst, std::uint32_t pos, float* scratch) {
  const std::uint32_t half = c.rotary_dim / 2;
  const float* cs = RopeCosSin(c, pos, scratch);
  const std::size_t row = std::size_t{c.n_kv} * c.dim;
  if (c.rotary_dim != c.dim) std::memcpy(dst, src, row * sizeof(float));  // the unrotated tails
  for (std::uint32_t h = 0; h < c.n_kv; ++h) {
    const std::size_t head = std::size_t{h} * c.dim;
    RotateHead(src + head, dst + head, cs, half);
  }
}

// Whether this target rotates K heads in registers and converts the results
// on the way to the cache (RotateConvertHead) where the pairs come in whole
// vector pairs; elsewhere RopeRow writes the rotated row to a buffer first.
// The fused form skips that buffer's store and reload: with a RopeTable,
// DRAM, fast memory state, bf16 1.07-1.13x, f16 1.09-1.14x, f32 1.09-1.13x
//.
constexpr bool kFusedRope = HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR;

// Head vector x rotated (pairs (i, i + half), half a multiple of 2 * lanes)
// and written as T at dst; the elements from 2 * half on are copied.
template <bool kStream, class T>
HWY_INLINE void RotateConvertHead(const float* x, T* dst, const float* cs, std::uint32_t half,
                                  std::uint32_t dim, std::size_t pf) {
  if constexpr (kFusedRope) {
    const DF df;
    const std::size_t lanes = hn::Lanes(df);
    for (std::size_t i = 0; i < half; i += 2 * lanes) {
      PrefetchAhead(x, i, 2 * lanes, pf);
      PrefetchAhead(x + half, i, 2 * lanes, pf);
      VF y0[2], y1[2];
      RotateVec(x, cs, half, i, y0[0], y1[0]);
      RotateVec(x, cs, half, i + lanes, y0[1], y1[1]);
      PutPair<kStream>(y0[0], y0[1], dst + i);
      PutPair<kStream>(y1[0], y1[1], dst + half + i);
    }
    ConvertRow<kStream>(x + 2 * half, dst + 2 * half, dim - 2 * half, pf);
  }
}

// Calls writing at least kStoreStreamingBytes use non-temporal stores where
// the rows are aligned: such data is not read again before it leaves the
// caches, and streaming avoids reading every destination line first (RFO).

// Whether every destination row of this call starts on a vector boundary.
template <class T>
bool RowsAligned(const StoreCtx& c, std::size_t row) {
  // Streaming stores write whole vectors: at most one f32 vector's bytes
  // (bf16 packs two f32 vectors into one), so f32-vector alignment suffices.
  const std::size_t vec_bytes = hn::Lanes(DF()) * sizeof(float);
  const auto aligned = [&](const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % vec_bytes == 0;
  };
  // Every run written starts at block + token * token_stride (+ head *
  // head_stride for HND) and is `row` (NHD) or head_dim (HND) long.
  const std::size_t run = c.head_stride == c.dim ? row : c.dim;
  return aligned(c.k_blocks) && aligned(c.v_blocks) && (run * sizeof(T)) % vec_bytes == 0 &&
         (c.token_stride * sizeof(T)) % vec_bytes == 0 &&
         (c.head_stride * sizeof(T)) % vec_bytes == 0 &&
         (c.block_stride * sizeof(T)) % vec_bytes == 0;
}

template <class T, bool kStream>
void StoreRows(const StoreCtx& c, std::uint32_t r0, std::uint32_t r1, std::vector<float>& tmp) {
  const std::size_t row = std::size_t{c.n_kv} * c.dim;
  // Entry of row r0 (row_offsets is sorted; rows of empty entries never occur).
  std::uint32_t b = static_cast<std::uint32_t>(
      std::upper_bound(c.row_offsets, c.row_offsets + c.batch + 1, r0) - c.row_offsets - 1);
  const bool fused = kFusedRope && c.rope && (c.rotary_dim / 2) % (2 * hn::Lanes(DF())) == 0;
  // The input is read as two interleaved streams (K and V rows), which a
  // Xeon's hardware prefetcher alone does not keep far enough ahead.
  const std::size_t pf = c.prefetch_next_row ? kPrefetchAheadFloats : 0;
  // K's prefetches where K is read from the input (not from RopeRow's tmp).
  const std::size_t k_pf = c.rope && !fused ? 0 : pf;
  for (std::uint32_t r = r0; r < r1; ++r) {
    while (r >= c.row_offsets[b + 1]) ++b;
    const std::uint32_t pos = c.cache_lengths[b] + (r - c.row_offsets[b]);
    const std::uint32_t block = c.lookup[std::size_t{b} * c.lookup_stride + pos / c.page];
    const std::size_t off =
        std::size_t{block} * c.block_stride + std::size_t{pos % c.page} * c.token_stride;
    const float* k_src = c.k_new + std::size_t{r} * row;
    // The conversion loops prefetch ahead within the input (PrefetchAhead),
    // except RopeRow (targets without a native FMA), whose K row gets the
    // next row's in one burst here.
    if (pf != 0 && c.rope && !fused && r + 1 < r1)
      prefetch_range_l1(k_src + row, row * sizeof(float));
    const float* v_src = c.v_new + std::size_t{r} * row;
    if (fused) {  // K rotated and written here; V below
      const float* cs = RopeCosSin(c, pos, tmp.data());
      for (std::uint32_t h = 0; h < c.n_kv; ++h) {
        RotateConvertHead<kStream>(k_src + std::size_t{h} * c.dim,
                                   static_cast<T*>(c.k_blocks) + off + h * c.head_stride, cs,
                                   c.rotary_dim / 2, c.dim, pf);
      }
    } else if (c.rope) {
      RopeRow(c, k_src, tmp.data(), pos, tmp.data() + row);
      k_src = tmp.data();
    }
    if (c.head_stride == c.dim) {  // the token's heads are contiguous (NHD): one run
      if (!fused) ConvertRow<kStream>(k_src, static_cast<T*>(c.k_blocks) + off, row, k_pf);
      ConvertRow<kStream>(v_src, static_cast<T*>(c.v_blocks) + off, row, pf);
    } else {  // HND: one run of head_dim per head
      for (std::uint32_t h = 0; h < c.n_kv; ++h) {
        const std::size_t src = std::size_t{h} * c.dim, dst = off + h * c.head_stride;
        if (!fused) {
          ConvertRow<kStream>(k_src + src, static_cast<T*>(c.k_blocks) + dst, c.dim, k_pf);
        }
        ConvertRow<kStream>(v_src + src, static_cast<T*>(c.v_blocks) + dst, c.dim, pf);
      }
    }
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <class T>
void RunStore(const StoreCtx& c) {
  const std::size_t row = std::size_t{c.n_kv} * c.dim;
  constexpr std::uint32_t kRowsPerChunk = 16;
  const std::uint32_t n_chunks = (c.total_rows + kRowsPerChunk - 1) / kRowsPerChunk;
  const bool stream = 2 * std::size_t{c.total_rows} * row * sizeof(T) >= kStoreStreamingBytes &&
                      RowsAligned<T>(c, row);
  auto store_rows = [&](std::uint32_t r0, std::uint32_t r1, std::vector<float>& tmp) {
    if (stream) {
      StoreRows<T, true>(c, r0, r1, tmp);
    } else {
      StoreRows<T, false>(c, r0, r1, tmp);
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

void StoreE4M3(const StoreCtx& c) { RunStoreQ8<DType::fp8_e4m3>(c); }
void StoreE5M2(const StoreCtx& c) { RunStoreQ8<DType::fp8_e5m2>(c); }
void StoreI8(const StoreCtx& c) { RunStoreQ8<DType::int8>(c); }

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
HWY_EXPORT(StoreE4M3);
HWY_EXPORT(StoreE5M2);
HWY_EXPORT(StoreI8);

// The store on the best target. Dispatched from inside namespace kernels:
// with one target compiled, HWY_DYNAMIC_DISPATCH is a static call to
// N_<TARGET>::name, which only resolves here.
void run_store(DType dtype, const StoreCtx& c) {
  switch (dtype) {
    case DType::f32:
      HWY_DYNAMIC_DISPATCH(StoreF32)(c);
      break;
    case DType::f16:
      HWY_DYNAMIC_DISPATCH(StoreF16)(c);
      break;
    case DType::bf16:
      HWY_DYNAMIC_DISPATCH(StoreBF16)(c);
      break;
    case DType::fp8_e4m3:
      HWY_DYNAMIC_DISPATCH(StoreE4M3)(c);
      break;
    case DType::fp8_e5m2:
      HWY_DYNAMIC_DISPATCH(StoreE5M2)(c);
      break;
    case DType::int8:
      HWY_DYNAMIC_DISPATCH(StoreI8)(c);
      break;
  }
}
}  // namespace kernels

StorePrefetch resolve_store_prefetch(const StoreOptions& options, DType dtype) {
  const StorePrefetch requested = options.prefetch;
  if (requested > StorePrefetch::none) {
    throw InvalidArgument("StoreOptions::prefetch value " +
                          std::to_string(static_cast<int>(requested)) +
                          " is not automatic, next_row_l1 or none");
  }
  if (requested != StorePrefetch::automatic) return requested;
  // f32 on AMD without AVX-512 (Zen 3): 0.94x with the running prefetch
  //, none. On Zen 4 it read 1.15x.
  const bool prefetch = options.rope_k.enabled || dtype != DType::f32 ||
                        !kernels::running_on_amd() || kernels::cpu_has_avx512();
  return prefetch ? StorePrefetch::next_row_l1 : StorePrefetch::none;
}

void store_kv(const CacheDesc& k, const CacheDesc& v, std::span<const float> k_new,
              std::span<const float> v_new, std::span<const std::uint32_t> row_offsets,
              const StoreOptions& options, ThreadPool* pool) {
  kernels::check_shapes(k, v, row_offsets);
  const DType dtype = k.dtype;
  const std::size_t row = std::size_t{k.n_kv_heads} * k.head_dim;
  const std::uint32_t total = row_offsets[k.batch_size];
  detail::check_size("k_new", k_new.size(), total * row);
  detail::check_size("v_new", v_new.size(), total * row);
  check_store_rope(options, k.head_dim);
  std::vector<float> inv_freq;
  kernels::StoreCtx c;
  if (options.rope_k.enabled) {
    c.rope = true;
    c.rotary_dim = rope_rotary_dim(options.rope_k, k.head_dim);
    inv_freq = rope_inv_freqs(c.rotary_dim, options.rope_k.theta);
    c.inv_freq = inv_freq.data();
    if (options.rope_table != nullptr) {
      c.rope_cos_sin = options.rope_table->cos_sin(0).data();
      c.rope_positions = options.rope_table->max_positions();
    }
  }
  if (total == 0) return;
  c.k_blocks = k.blocks;
  c.v_blocks = v.blocks;
  c.block_stride = k.block_stride;
  c.cache_lengths = k.cache_lengths;
  c.lookup = k.lookup_table;
  c.lookup_stride = k.lookup_stride;
  c.page = k.page_size;
  c.batch = k.batch_size;
  c.n_kv = k.n_kv_heads;
  c.dim = k.head_dim;
  c.token_stride = k.token_stride;
  c.head_stride = k.head_stride;
  c.k_new = k_new.data();
  c.v_new = v_new.data();
  c.row_offsets = row_offsets.data();
  c.total_rows = total;
  c.prefetch_next_row = resolve_store_prefetch(options, dtype) == StorePrefetch::next_row_l1;
  c.pool = pool;
  c.k_head_scales = k.head_scales;
  c.v_head_scales = v.head_scales;
  c.scales_offset = k.block_values();
  kernels::run_store(dtype, c);
}

}  // namespace kvcache
#endif  // HWY_ONCE
