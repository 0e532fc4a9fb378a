// Plain-data contexts shared by the per-target (Highway) kernel code and the
// type-erased entry points. Included once per Highway target: keep it free of
// SIMD code.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cpu/attention_plan.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/kv_cache.h"
#include "kvcache/thread_pool.h"

namespace kvcache::kernels {

// Software prefetch of the cache line holding p into L1 (prefetch_l1) or L2
// (prefetch_l2). Written as asm statements on x86: GCC 12's IPA pure-const
// pass treats a function whose only effect is __builtin_prefetch as free of
// side effects and deletes calls to it at -O2 and above, so prefetch loops
// in helper functions silently vanished.
inline void prefetch_l1(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

inline void prefetch_l2(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

// Prefetches [p, p + bytes) line by line into L1.
inline void prefetch_range_l1(const void* p, std::size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (std::size_t o = 0; o < bytes; o += 64) prefetch_l1(c + o);
}

// A cheap monotonic tick count: the time-stamp counter on x86 (~40 cycles a
// read on the Zen 5 VM), elsewhere steady_clock. For ratios of times only.
inline std::uint64_t ticks() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_ia32_rdtsc();
#else
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

// Nanoseconds that loads of lines issued together may take beyond an empty
// timed interval for the lines to count as cache-resident, and the longest
// empty interval trusted. On the Zen 5 VM:
// 16 lines hit in a warm L3 in 40-70 ns; from DRAM they took 150-350 ns with
// their TLB entries warm, and 300 ns to over 1 us without.
inline constexpr std::int64_t kResidentProbeNs = 90;
inline constexpr std::int64_t kProbeEmptyMaxNs = 100;

// Whether the lines at lines[0, n) all answer from a cache: their loads,
// issued together, finish within kResidentProbeNs of an empty interval timed
// the same way. x86 only (lfence holds the second clock read until the loads
// are done); elsewhere, and when the empty interval itself was slow (an
// interrupt), false. Costs three clock reads, and about one memory latency
// when the lines are in DRAM.
inline bool lines_resident(const void* const* lines, std::size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  __builtin_ia32_lfence();
  const auto t1 = Clock::now();
  __builtin_ia32_lfence();
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += *static_cast<const volatile std::uint8_t*>(lines[i]);
  __builtin_ia32_lfence();
  const auto t2 = Clock::now();
  asm volatile("" : : "r"(sum));
  const auto empty = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
  const auto probe = std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t1).count();
  return empty <= kProbeEmptyMaxNs && probe - empty <= kResidentProbeNs;
#else
  (void)lines;
  (void)n;
  return false;
#endif
}

// One layer's K or V memory, element type erased.
struct LayerRef {
  const void* blocks = nullptr;
  std::size_t block_stride = 0;  // elements
};

struct AttentionCtx {
  LayerRef k, v;
  const std::uint32_t* cache_lengths = nullptr;
  const std::uint32_t* lookup = nullptr;
  std::uint32_t lookup_stride = 0;
  std::uint32_t page = 0;
  std::uint32_t n_kv = 0;
  std::uint32_t group = 0;
  std::uint32_t dim = 0;
  std::size_t token_stride = 0;  // elements between tokens of a head (NHD n_kv * dim, HND dim)
  std::size_t head_stride = 0;   // elements between heads of a token (NHD dim, HND page * dim)
  const float* q = nullptr;
  float* out = nullptr;
  std::uint32_t n_q = 0;
  float scale = 1.0f;
  const std::uint32_t* row_offsets = nullptr;
  const AttentionPlan* plan = nullptr;
  ThreadPool* pool = nullptr;
  // Resolved (never automatic): see AttentionPrefetch in kernels/options.h.
  AttentionPrefetch prefetch = AttentionPrefetch::next_step_l1;
  // `automatic` on AMD: decode items whose rows a probe finds in the caches
  // run without prefetches (ItemRunner::rows_resident).
  bool probe_residency = false;
  // AttentionPrecision::bf16 on a bf16 cache: the scaled queries and the
  // probabilities are rounded to bf16 before they multiply K and V.
  bool bf16_inputs = false;
  // 8-bit caches: fp8's static K / V scales [n_kv], int8's offset (bytes)
  // from a block's start to its (row, head) scales.
  const float* k_head_scales = nullptr;
  const float* v_head_scales = nullptr;
  std::size_t scales_offset = 0;
};

// Runs the planned attention on the best target the processor has, one entry
// per cache element type (attention_f32.cpp, attention_f16.cpp,
// attention_bf16.cpp, and for the 8-bit caches attention_e4m3.cpp,
// attention_e5m2.cpp, attention_i8.cpp: separate translation units so a
// parallel build compiles the instantiations at once).
void attention_f32(const AttentionCtx& c);
void attention_f16(const AttentionCtx& c);
void attention_bf16(const AttentionCtx& c);
void attention_e4m3(const AttentionCtx& c);
void attention_e5m2(const AttentionCtx& c);
void attention_i8(const AttentionCtx& c);

// out[i] = ExpScores(x[i]) (kernels/cpu/exp_scores-inl.h: the softmax's e^x)
// on the target the kernels dispatch to now (select_isa), so that tests can
// hold each target's exponential against std::exp. Throws InvalidArgument
// when the sizes differ.
void exp_scores(std::span<const float> x, std::span<float> out);

// Whether the processor has AVX512-BF16 (vdpbf16ps), which the AVX-512
// targets use for AttentionPrecision::bf16.
inline bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    // CPUID leaf 7, subleaf 1: EAX bit 5 is AVX512_BF16. (The AVX-512
    // targets that use it run only where the OS saves the zmm state.)
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0) return false;
    return ((a >> 5) & 1u) != 0;
  }();
  return has;
#else
  return false;
#endif
}

// Whether this is an AMD processor: the automatic prefetch choices depend on
// it (docs/PERFORMANCE.md: what is fastest on Zen 4 is slowest on
// a Sapphire Rapids Xeon and the other way round).
inline bool running_on_amd() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool amd = __builtin_cpu_is("amd");
  return amd;
#else
  return false;
#endif
}

// The processor's family as CPUID leaf 1 reports it (the base family plus,
// for base family 0Fh, the extended family): on AMD 19h is Zen 3 and Zen 4,
// 1Ah Zen 5. 0 where there is no CPUID.
inline unsigned cpu_family() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const unsigned family = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return 0u;
    const unsigned base = (a >> 8) & 0xFu;
    return base == 0xFu ? base + ((a >> 20) & 0xFFu) : base;
  }();
  return family;
#else
  return 0;
#endif
}

// Whether the processor and the OS support AVX-512 F: on AMD it tells Zen 4
// and later from Zen 3 and earlier for the automatic prefetch choice,
// whatever instruction set select_isa() pins.
inline bool cpu_has_avx512() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
#else
  return false;
#endif
}

// Tiles ahead that AttentionPrefetch::next_tile_l2 prefetches. Zen 4
//: 2 beat 1 and 3 for MHA, all equal for GQA 4. Zen 5 with the
// prefetch stream told of every row read: 1 is 1.04x of 2 for HND MHA and
// GQA 4 in DRAM, NHD 0.95-1.03x; 3 is 0.96x.
inline constexpr std::uint32_t kPrefetchTilesAhead = 1;

struct StoreCtx {
  void* k_blocks = nullptr;
  void* v_blocks = nullptr;
  std::size_t block_stride = 0;
  const std::uint32_t* cache_lengths = nullptr;
  const std::uint32_t* lookup = nullptr;
  std::uint32_t lookup_stride = 0;
  std::uint32_t page = 0;
  std::uint32_t batch = 0;
  std::uint32_t n_kv = 0;
  std::uint32_t dim = 0;
  std::size_t token_stride = 0;  // as in AttentionCtx
  std::size_t head_stride = 0;
  const float* k_new = nullptr;
  const float* v_new = nullptr;
  const std::uint32_t* row_offsets = nullptr;
  std::uint32_t total_rows = 0;
  bool rope = false;
  std::uint32_t rotary_dim = 0;
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  // RopeTable values [rope_positions][rotary_dim] (cos half, sin half), or null.
  const float* rope_cos_sin = nullptr;
  std::uint32_t rope_positions = 0;
  bool prefetch_next_row = true;  // StorePrefetch::next_row_l1
  ThreadPool* pool = nullptr;
  // 8-bit caches: as in AttentionCtx.
  const float* k_head_scales = nullptr;
  const float* v_head_scales = nullptr;
  std::size_t scales_offset = 0;
};

// Validation shared by attention and store_kv (implemented in attention_cpu.cpp):
// K and V views of one shape and batch, row_offsets well formed, and every
// entry's cache_length + new tokens within max_context_length and its page table.
void check_shapes(const CacheDesc& k, const CacheDesc& v,
                  std::span<const std::uint32_t> row_offsets);

// A view of d's lengths and page table (block_id, reserved_length) whatever
// its dtype: the checks read no elements.
inline LayerCacheBase<float> table_view(CacheDesc d) {
  d.dtype = DType::f32;
  return LayerCacheBase<float>(d);
}

}  // namespace kvcache::kernels
