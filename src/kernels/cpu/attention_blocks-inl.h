// Building blocks of the CPU attention kernel, per Highway target (included
// through attention_cpu-inl.h): the tile size, lane and chunk constants,
// loads of K/V chunks as f32 vectors (bf16 in the even/odd split layout,
// masked or zero-padded tails), the query/accumulator layout conversions,
// and the transpose-add tree that turns kN partial-product vectors into one
// vector of scores.
#if defined(KVCACHE_KERNELS_CPU_ATTENTION_BLOCKS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ATTENTION_BLOCKS_INL_H_
#undef KVCACHE_KERNELS_CPU_ATTENTION_BLOCKS_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ATTENTION_BLOCKS_INL_H_
#endif

#include <cstring>
#include <type_traits>

#include "hwy/highway.h"
#include "kernels/cpu/code_types.h"
#include "kernels/cpu/kernel_common.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr std::uint32_t kTile = 32;  // max KV tokens per tile (multiple of any lane count)

HWY_INLINE VF LoadF(DF df, const float* p) { return hn::LoadU(df, p); }
HWY_INLINE VF LoadF(DF df, const hwy::bfloat16_t* p) {
  const hn::Rebind<hwy::bfloat16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, p));
}
HWY_INLINE VF LoadF(DF df, const hwy::float16_t* p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, p));
}

HWY_INLINE float ToF(float x) { return x; }
HWY_INLINE float ToF(hwy::bfloat16_t x) { return hwy::F32FromBF16(x); }
HWY_INLINE float ToF(hwy::float16_t x) {
  Half h;
  std::memcpy(&h, &x, sizeof(h));
  return to_float(h);
}

HWY_INLINE float ReduceSum(DF df, VF v) { return hn::GetLane(hn::SumOfLanes(df, v)); }

// Lanes per f32 vector, known at compile time for every x86 target.
constexpr std::size_t kN = HWY_LANES(float);
// Elements per chunk: a K or V row is consumed 2 * kN elements at a time as
// two f32 vectors (lo, hi).
constexpr std::size_t kC = 2 * kN;
static_assert(kTile % kN == 0, "a tile must hold whole score vectors");

// 64-byte cache lines a chunk of kC elements of T spans (at least 1): what the
// prefetch stream is told each time the loops consume one chunk of a row.
// Lines the loops read between reports to the stream, at least.
constexpr std::uint32_t kStreamReportLines = 16;

template <class T>
constexpr std::uint32_t kChunkLines = kC * sizeof(T) / 64 > 0 ? kC * sizeof(T) / 64 : 1;

// Lines of `chunks` chunks of a row, what the loops report to the stream:
// kChunkLines each, but 8-bit codes (half a line a chunk on AVX-512) count
// their bytes, so that the stream keeps pace with the rows actually read.
template <class T>
constexpr std::uint32_t ChunksLines(std::size_t chunks) {
  if constexpr (sizeof(T) == 1) {
    const std::size_t lines = chunks * kC / 64;
    return lines > 0 ? static_cast<std::uint32_t>(lines) : 1;
  } else {
    return static_cast<std::uint32_t>(chunks) * kChunkLines<T>;
  }
}

// bf16 chunks are split into even elements (lo) and odd elements (hi): one
// 32-bit load, a shift and a mask, no lane shuffles. Query and accumulator
// rows use the same element order ("layout"); outputs are put back in order.
template <class T>
constexpr bool kSplitLayout = std::is_same_v<T, hwy::bfloat16_t>;

// Position of element e of a row in the layout of T.
template <class T>
HWY_INLINE std::size_t LayoutPos(std::size_t e) {
  if constexpr (kSplitLayout<T>) {
    const std::size_t r = e % kC;
    return e - r + (r % 2) * kN + r / 2;
  } else {
    return e;
  }
}

// dst[0, dim rounded up to kC) = src[0, dim) * scale in the layout of T,
// zero padded. Whole chunks are plain loops over the even / odd elements
// (vectorized by the compiler: with the LayoutPos index table this scatter
// was a third of a short decode call).
template <class T>
HWY_INLINE void ToLayout(const float* src, std::size_t dim, float scale, float* dst) {
  const std::size_t full = dim / kC * kC;
  if constexpr (kSplitLayout<T>) {
    for (std::size_t c = 0; c < full; c += kC) {
      for (std::size_t i = 0; i < kN; ++i) {
        dst[c + i] = src[c + 2 * i] * scale;
        dst[c + kN + i] = src[c + 2 * i + 1] * scale;
      }
    }
  } else {
    for (std::size_t d = 0; d < full; ++d) dst[d] = src[d] * scale;
  }
  if (full < dim) {
    std::fill(dst + full, dst + full + kC, 0.0f);
    for (std::size_t d = full; d < dim; ++d) dst[full + LayoutPos<T>(d - full)] = src[d] * scale;
  }
}

// dst[0, dim) = acc (layout of T) * scale, back in element order.
template <class T>
HWY_INLINE void FromLayout(const float* acc, std::size_t dim, float scale, float* dst) {
  const std::size_t full = dim / kC * kC;
  if constexpr (kSplitLayout<T>) {
    for (std::size_t c = 0; c < full; c += kC) {
      for (std::size_t i = 0; i < kN; ++i) {
        dst[c + 2 * i] = acc[c + i] * scale;
        dst[c + 2 * i + 1] = acc[c + kN + i] * scale;
      }
    }
  } else {
    for (std::size_t d = 0; d < full; ++d) dst[d] = acc[d] * scale;
  }
  for (std::size_t d = full; d < dim; ++d) dst[d] = acc[full + LayoutPos<T>(d - full)] * scale;
}

// GCC 12 stored a loaded bf16 chunk to the stack and read it back twice (as
// the memory operands of the shift and the mask) in every unrolled PV and
// score loop; an empty asm that takes the vector in a register keeps it
// there (MHA decode from L2 +11 %).
template <class V>
HWY_INLINE void KeepInRegister(V& v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3 && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG)
  asm("" : "+v"(v.raw));
#else
  (void)v;
#endif
}

HWY_INLINE void LoadChunk(DF df, const float* p, VF& lo, VF& hi) {
  lo = hn::LoadU(df, p);
  hi = hn::LoadU(df, p + kN);
}
HWY_INLINE void LoadChunk(DF df, const hwy::float16_t* p, VF& lo, VF& hi) {
  lo = LoadF(df, p);
  hi = LoadF(df, p + kN);
}
// On AVX-512 the bf16 chunk is loaded by an asm statement: with
// KeepInRegister GCC still stored every loaded chunk to the stack (a dead
// store per chunk). From L2, 1 thread: MHA 1.02-1.03x, GQA 4 1.035-1.04x;
// DRAM 0.99-1.01x, noise there.
// Sanitizer builds keep the intrinsic load, which they can check.
HWY_INLINE void LoadChunk(DF df, const hwy::bfloat16_t* p, VF& lo, VF& hi) {
  const hn::RebindToUnsigned<DF> du;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG) && \
    !HWY_IS_ASAN && !HWY_IS_MSAN
  hn::Vec<decltype(du)> w;
  asm("vmovdqu64 %1, %0" : "=v"(w.raw) : "m"(*reinterpret_cast<const __m512i*>(p)));
#else
  auto w = hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(p));
  KeepInRegister(w);
#endif
  lo = hn::BitCast(df, hn::ShiftLeft<16>(w));
  hi = hn::BitCast(df, hn::And(w, hn::Set(du, 0xFFFF0000u)));
}

// 8-bit codes (code_types.h), Lanes(df) of them in the u8 vector `u`,
// widened to f32 exactly, in units of kCodeUnit:
//  - int8: sign-extended and converted.
//  - fp8_e5m2: the code in the top byte is binary16, widened by the
//    hardware converter (infinities and NaN kept).
//  - fp8_e4m3: sign-extended to 16 bits and shifted left by 7, its sign
//    copy at bit 14 cleared, it is the binary16 of value / 256 (S, 0EEEE,
//    MMM: normals and subnormals line up), widened by the converter; the
//    NaN code S.1111.111 reads as +-480 (stores never write it from finite
//    input). Three operations a vector, against seven for masking the
//    sign and the magnitude apart.
template <DType kType>
HWY_INLINE VF DecodeCodes(DF df, hn::Vec<hn::Rebind<std::uint8_t, DF>> u) {
  if constexpr (kType == DType::int8) {
    const hn::Rebind<std::int8_t, DF> d8;
    const hn::Rebind<std::int32_t, DF> d32;
    return hn::ConvertTo(df, hn::PromoteTo(d32, hn::BitCast(d8, u)));
  } else {
    const hn::Rebind<hwy::float16_t, DF> dh;
    const hn::Rebind<std::uint16_t, DF> d16;
    if constexpr (kType == DType::fp8_e5m2) {
      return hn::PromoteTo(df, hn::BitCast(dh, hn::ShiftLeft<8>(hn::PromoteTo(d16, u))));
    } else {
      const hn::Rebind<std::int8_t, DF> d8;
      const hn::Rebind<std::int16_t, DF> di16;
      const auto w = hn::ShiftLeft<7>(hn::PromoteTo(di16, hn::BitCast(d8, u)));
      return hn::PromoteTo(
          df, hn::BitCast(dh, hn::And(hn::BitCast(d16, w), hn::Set(d16, std::uint16_t{0xBFFF}))));
    }
  }
}

template <DType kType>
HWY_INLINE void LoadChunk(DF df, const Code8<kType>* p, VF& lo, VF& hi) {
  const hn::Rebind<std::uint8_t, DF> d8;
  const auto* b = reinterpret_cast<const std::uint8_t*>(p);
  lo = DecodeCodes<kType>(df, hn::LoadU(d8, b));
  hi = DecodeCodes<kType>(df, hn::LoadU(d8, b + kN));
}

// Whether partial chunks use masked loads: AVX-512, where lanes masked off
// are neither read nor able to fault, for every lane size.
constexpr bool kMaskedTail = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3;

// The first t < kC elements of a chunk at p, the rest zero, with masked loads
// (only instantiated where kMaskedTail).
template <class D, class T>
HWY_INLINE void LoadChunkPart(D df, const T* p, std::size_t t, VF& lo, VF& hi) {
  const std::size_t t_hi = t > kN ? t - kN : 0;
  if constexpr (std::is_same_v<T, float>) {
    lo = hn::MaskedLoad(hn::FirstN(df, t), df, p);
    hi = hn::MaskedLoad(hn::FirstN(df, t_hi), df, p + kN);
  } else if constexpr (std::is_same_v<T, hwy::float16_t>) {
    const hn::Rebind<hwy::float16_t, D> dh;
    lo = hn::PromoteTo(df, hn::MaskedLoad(hn::FirstN(dh, t), dh, p));
    hi = hn::PromoteTo(df, hn::MaskedLoad(hn::FirstN(dh, t_hi), dh, p + kN));
  } else if constexpr (kIsCode<T>) {
    const hn::Rebind<std::uint8_t, D> d8;
    const auto* b = reinterpret_cast<const std::uint8_t*>(p);
    lo = DecodeCodes<CodeOf<T>::kType>(df, hn::MaskedLoad(hn::FirstN(d8, t), d8, b));
    hi = DecodeCodes<CodeOf<T>::kType>(df, hn::MaskedLoad(hn::FirstN(d8, t_hi), d8, b + kN));
  } else {
    // bf16 in 16-bit lanes, so that an odd t reads nothing past the row.
    const hn::RebindToUnsigned<D> du;
    const hn::Repartition<std::uint16_t, D> d16;
    const auto w = hn::BitCast(
        du, hn::MaskedLoad(hn::FirstN(d16, t), d16, reinterpret_cast<const std::uint16_t*>(p)));
    lo = hn::BitCast(df, hn::ShiftLeft<16>(w));
    hi = hn::BitCast(df, hn::And(w, hn::Set(du, 0xFFFF0000u)));
  }
}

// Chunk at element d of a row of dim elements; past the row end (head dims
// that are not a multiple of kC) the missing elements read as zero. With
// masked loads where they cannot fault; elsewhere through a zeroed copy
// (which stalls on store forwarding: AVX-512 head dim 80 decode from L2
// computed at 0.4 of head dim 96's rate that way).
template <bool kTail, class T>
HWY_INLINE void LoadChunkAt(DF df, const T* row, std::size_t d, std::size_t dim, VF& lo, VF& hi) {
  if constexpr (kTail && kMaskedTail) {
    LoadChunkPart(df, row + d, dim - d, lo, hi);
  } else if constexpr (kTail) {
    HWY_ALIGN T tmp[kC];
    std::memset(static_cast<void*>(tmp), 0, sizeof(tmp));
    std::memcpy(static_cast<void*>(tmp), row + d, (dim - d) * sizeof(T));
    LoadChunk(df, tmp, lo, hi);
  } else {
    (void)dim;
    LoadChunk(df, row + d, lo, hi);
  }
}

// Reduces kN per-(query, token) partial-product vectors a[u] to one vector
// whose lane u is the horizontal sum of a[u] (a transpose-add tree: about
// 3 * kN shuffles and adds instead of kN horizontal sums).
HWY_INLINE VF ReduceTokens(DF df, VF* a) {
#if HWY_TARGET == HWY_SCALAR
  (void)df;
  return a[0];
#else
  if constexpr (kN % 4 == 0 && kN <= 16) {
    const hn::Repartition<std::uint64_t, DF> du;
    // Within each 128-bit block: lane j of c[g] = block sum of a[4g + j].
    VF c[kN / 4];
    for (std::size_t g = 0; g < kN / 4; ++g) {
      const VF* x = a + 4 * g;
      const VF s01 =
          hn::Add(hn::InterleaveLower(df, x[0], x[1]), hn::InterleaveUpper(df, x[0], x[1]));
      const VF s23 =
          hn::Add(hn::InterleaveLower(df, x[2], x[3]), hn::InterleaveUpper(df, x[2], x[3]));
      const auto w01 = hn::BitCast(du, s01);
      const auto w23 = hn::BitCast(du, s23);
      c[g] = hn::Add(hn::BitCast(df, hn::InterleaveLower(du, w01, w23)),
                     hn::BitCast(df, hn::InterleaveUpper(du, w01, w23)));
    }
    if constexpr (kN == 4) {
      return c[0];
    } else if constexpr (kN == 8) {
      return hn::Add(hn::ConcatLowerLower(df, c[1], c[0]), hn::ConcatUpperUpper(df, c[1], c[0]));
    } else {
      // kN == 16 (AVX-512): halve, then pick blocks across the two halves.
      const VF f01 =
          hn::Add(hn::ConcatLowerLower(df, c[1], c[0]), hn::ConcatUpperUpper(df, c[1], c[0]));
      const VF f23 =
          hn::Add(hn::ConcatLowerLower(df, c[3], c[2]), hn::ConcatUpperUpper(df, c[3], c[2]));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
      const __m512 x = _mm512_shuffle_f32x4(f01.raw, f23.raw, _MM_SHUFFLE(2, 0, 2, 0));
      const __m512 y = _mm512_shuffle_f32x4(f01.raw, f23.raw, _MM_SHUFFLE(3, 1, 3, 1));
      return VF{_mm512_add_ps(x, y)};
#else
      HWY_ALIGN float buf[2][kN];
      hn::Store(f01, df, buf[0]);
      hn::Store(f23, df, buf[1]);
      HWY_ALIGN float r[kN];
      for (std::size_t blk = 0; blk < 4; ++blk)
        for (std::size_t j = 0; j < 4; ++j)
          r[4 * blk + j] = buf[blk / 2][8 * (blk % 2) + j] + buf[blk / 2][8 * (blk % 2) + 4 + j];
      return hn::Load(df, r);
#endif
    }
  } else {
    HWY_ALIGN float r[kN];
    for (std::size_t u = 0; u < kN; ++u) r[u] = ReduceSum(df, a[u]);
    return hn::Load(df, r);
  }
#endif
}

// Where the query vectors of key row u start: the same for every row (the
// rows are tokens of one KV head), or one pointer per row (rows of several
// heads). Query j of row u is at that pointer + j * dimp.
struct SharedQuery {
  const float* q;
  HWY_INLINE const float* operator()(int) const { return q; }
};
struct QueryPerRow {
  const float* const* q;
  HWY_INLINE const float* operator()(int u) const { return q[u]; }
};

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_ATTENTION_BLOCKS_INL_H_ (per target)
