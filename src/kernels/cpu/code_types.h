// The 8-bit caches' codes as element types of the CPU attention kernel's
// tile loops (attention_cpu-inl.h): one byte each, widened to f32 in
// registers by LoadChunk (attention_codes-inl.h). Plain data, no SIMD code:
// included once per Highway target.
#pragma once

#include <cstdint>

#include "kvcache/dtype.h"

namespace kvcache::kernels {

// One code of a cache of type kType (fp8_e4m3, fp8_e5m2 or int8).
template <DType kType>
struct Code8 {
  std::uint8_t bits;
};
using CodeE4M3 = Code8<DType::fp8_e4m3>;
using CodeE5M2 = Code8<DType::fp8_e5m2>;
using CodeI8 = Code8<DType::int8>;

template <class T>
struct CodeOf {
  static constexpr bool kCode = false;
  static constexpr DType kType = DType::f32;
};
template <DType kT>
struct CodeOf<Code8<kT>> {
  static constexpr bool kCode = true;
  static constexpr DType kType = kT;
};

// Whether T is an 8-bit code, and whether its scales are in the page
// (int8: one float per (token, KV head); fp8 has static per-head scales).
template <class T>
constexpr bool kIsCode = CodeOf<T>::kCode;
template <class T>
constexpr bool kPageScales = kIsCode<T>&& CodeOf<T>::kType == DType::int8;

// Factor from the f32 the kernel widens a code to to the code's value:
// e4m3 is widened through binary16 as value / 256 (attention_codes-inl.h).
template <class T>
constexpr float kCodeUnit = kIsCode<T>&& CodeOf<T>::kType == DType::fp8_e4m3 ? 256.0f : 1.0f;

}  // namespace kvcache::kernels
