// store_kv into 8-bit caches, per Highway target (included by
// store_kv_cpu.cpp after quantize-inl.h, which gives EncodeFp8 and AbsMax).
// Each (token, head) row is quantised exactly as the views' store_row does:
//  - int8: scale = absmax / 127 written beside the page's values, codes
//    nearest_even(x * (127 / absmax)) clamped to [-127, 127]. The rounding is
//    the float add of 1.5 * 2^23 (ties to even, exact for |v| <= 2^22), whose
//    low byte is the code's two's complement: no integer conversion, no
//    saturating packs. Clamping the float to [-127, 127] first is the same as
//    clamping the rounded value (both bounds are integers);
//  - fp8: codes of x * (1 / the head's static scale) (EncodeFp8).
// K is rotated into a float row first when RoPE is on. Calls writing at least
// kStoreStreamingBytes into 64-byte-aligned rows on targets whose code
// vector is 16 bytes (AVX-512) write the codes with non-temporal stores, as
// the 16/32-bit store does (no read for ownership of the destination lines).
#if defined(KVCACHE_KERNELS_CPU_STORE_Q8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_STORE_Q8_INL_H_
#undef KVCACHE_KERNELS_CPU_STORE_Q8_INL_H_
#else
#define KVCACHE_KERNELS_CPU_STORE_Q8_INL_H_
#endif

#include <atomic>
#include <cstring>
#include <vector>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/cpu/kernel_common.h"
#include "kernels/cpu/quantize-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DQ = hn::ScalableTag<float>;
using D8 = hn::Rebind<std::uint8_t, DQ>;

// Whether this target streams codes: one float vector's codes fill a whole
// 16-byte vector (a partial vector's Stream would write past it).
constexpr bool kStreamQ8 = HWY_TARGET != HWY_SCALAR && hn::MaxLanes(DQ()) == 16;

template <bool kStream>
HWY_INLINE void PutCodes(hn::Vec<D8> codes, std::uint8_t* dst) {
  if constexpr (kStream) {
    hn::Stream(codes, D8(), dst);
  } else {
    hn::StoreU(codes, D8(), dst);
  }
}

// The low byte of each 32-bit lane.
HWY_INLINE hn::Vec<D8> LowBytes(hn::Vec<hn::RebindToUnsigned<DQ>> v) {
#if HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(DQ()) == 16) return hn::Vec<D8>{_mm512_cvtepi32_epi8(v.raw)};
#endif
  return hn::TruncateTo(D8(), v);
}

// int8 codes of n values of src times `inverse` (see the file comment).
template <bool kStream>
HWY_INLINE void EncodeInt8(const float* src, std::uint8_t* dst, std::size_t n, float inverse) {
  const DQ df;
  const hn::RebindToUnsigned<DQ> du;
  const std::size_t lanes = hn::Lanes(df);
  const auto vinv = hn::Set(df, inverse);
  const auto hi = hn::Set(df, 127.0f), lo = hn::Set(df, -127.0f);
  const auto magic = hn::Set(df, 12582912.0f);  // 1.5 * 2^23
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::Min(hn::Max(hn::Mul(hn::LoadU(df, src + i), vinv), lo), hi);
    PutCodes<kStream>(LowBytes(hn::BitCast(du, hn::Add(v, magic))), dst + i);
  }
  for (; i < n; ++i) dst[i] = static_cast<std::uint8_t>(f32_to_int8(src[i] * inverse));
}

// fp8 codes of n values of src times `inverse`.
template <DType kType, bool kStream>
HWY_INLINE void EncodeFp8Row(const float* src, std::uint8_t* dst, std::size_t n, float inverse) {
  const DQ df;
  const std::size_t lanes = hn::Lanes(df);
  const auto vinv = hn::Set(df, inverse);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto q = EncodeFp8<kType>(df, hn::Mul(hn::LoadU(df, src + i), vinv));
    PutCodes<kStream>(hn::DemoteTo(D8(), q), dst + i);
  }
  for (; i < n; ++i) {
    dst[i] = kType == DType::fp8_e4m3 ? f32_to_e4m3_bits(src[i] * inverse)
                                      : f32_to_e5m2_bits(src[i] * inverse);
  }
}

// Rotates one token's K row for position pos into dst (store_kv_cpu.cpp).
void RopeRow(const StoreCtx& c, const float* src, float* dst, std::uint32_t pos, float* scratch);

template <DType kType, bool kStream>
void StoreRowsQ8(const StoreCtx& c, std::uint32_t r0, std::uint32_t r1, std::vector<float>& tmp) {
  const std::size_t row = std::size_t{c.n_kv} * c.dim;
  std::uint32_t b = 0;
  for (std::uint32_t r = r0; r < r1; ++r) {
    while (r >= c.row_offsets[b + 1]) ++b;
    const std::uint32_t pos = c.cache_lengths[b] + (r - c.row_offsets[b]);
    const std::uint32_t row_in_page = pos % c.page;
    const std::size_t block =
        std::size_t{c.lookup[std::size_t{b} * c.lookup_stride + pos / c.page]} * c.block_stride;
    const float* k_src = c.k_new + std::size_t{r} * row;
    if (c.rope) {
      RopeRow(c, k_src, tmp.data(), pos, tmp.data() + row);
      k_src = tmp.data();
    }
    for (std::uint32_t kv = 0; kv < 2; ++kv) {
      const float* src = kv == 0 ? k_src : c.v_new + std::size_t{r} * row;
      auto* base = static_cast<std::uint8_t*>(kv == 0 ? c.k_blocks : c.v_blocks) + block;
      const float* head_scales = kv == 0 ? c.k_head_scales : c.v_head_scales;
      for (std::uint32_t h = 0; h < c.n_kv; ++h) {
        const std::size_t at = std::size_t{row_in_page} * c.token_stride + h * c.head_stride;
        const float* x = src + std::size_t{h} * c.dim;
        if constexpr (kType == DType::int8) {
          const float absmax = AbsMax(x, c.dim);
          const float scale = int8_scale(absmax);
          std::memcpy(base + c.scales_offset + at / c.dim * sizeof(float), &scale, sizeof(float));
          EncodeInt8<kStream>(x, base + at, c.dim, int8_inverse_scale(absmax));
        } else {
          EncodeFp8Row<kType, kStream>(x, base + at, c.dim, 1.0f / head_scales[h]);
        }
      }
    }
  }
  if constexpr (kStream) hwy::FlushStream();
}

// Whether a call streams: big enough, and every run of codes it writes
// starts on a 64-byte line (block, row and head offsets, head_dim).
inline bool StreamQ8(const StoreCtx& c) {
  if (!kStreamQ8) return false;
  const std::size_t written = 2 * std::size_t{c.total_rows} * c.n_kv * c.dim;
  const auto line = [](std::size_t v) { return v % 64 == 0; };
  return written >= kStoreStreamingBytes && line(reinterpret_cast<std::uintptr_t>(c.k_blocks)) &&
         line(reinterpret_cast<std::uintptr_t>(c.v_blocks)) && line(c.block_stride) &&
         line(c.token_stride) && line(c.head_stride) && line(c.dim);
}

template <DType kType>
void RunStoreQ8(const StoreCtx& c) {
  constexpr std::uint32_t kRowsPerChunk = 16;
  const std::uint32_t n_chunks = (c.total_rows + kRowsPerChunk - 1) / kRowsPerChunk;
  const std::size_t tmp_size = c.rope ? std::size_t{c.n_kv} * c.dim + c.rotary_dim : 0;
  const std::size_t workers =
      c.pool == nullptr ? 1 : std::min<std::size_t>(c.pool->num_threads(), n_chunks);
  const bool stream = StreamQ8(c);
  std::atomic<std::uint32_t> next{0};
  const auto work = [&](std::size_t) {
    std::vector<float> tmp(tmp_size);
    for (std::uint32_t ch = next.fetch_add(1); ch < n_chunks; ch = next.fetch_add(1)) {
      const std::uint32_t r0 = ch * kRowsPerChunk;
      const std::uint32_t r1 = std::min(c.total_rows, (ch + 1) * kRowsPerChunk);
      if (stream) {
        StoreRowsQ8<kType, true>(c, r0, r1, tmp);
      } else {
        StoreRowsQ8<kType, false>(c, r0, r1, tmp);
      }
    }
  };
  if (workers <= 1) {
    work(0);
  } else {
    c.pool->parallel_for(workers, work);
  }
}

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_STORE_Q8_INL_H_ (per target)
