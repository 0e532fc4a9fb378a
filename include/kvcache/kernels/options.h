// kvcache/kernels/options.h — the kernels' options: attention (scale,
// prefetch strategy, precision), store_kv (RoPE on K, a RopeTable, prefetch)
// and their names as the command line and Python spell them.
//
// Plain values; the kernels validate them once per call (InvalidArgument for
// a value outside its enum, a non-finite scale, a RoPE table that does not
// match rope_k). Results never depend on a prefetch strategy, only speed
// does; the precision is part of the result contract (stated below).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvcache/dtype.h"
#include "kvcache/error.h"
#include "kvcache/params.h"

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

// Optional rotary position embedding applied to K on the way into the cache
// (and nowhere else). Rotates pairs (i, i + rotary_dim/2) ("NeoX" / HF Llama
// style) by angle pos * theta^(-2i/rotary_dim) for i < rotary_dim/2, pos =
// the token's position; see kernels/rope.h for the reference.
struct RopeOptions {
  bool enabled = false;
  float theta = 10000.0f;
  std::uint32_t rotary_dim = 0;  // 0 => head_dim
};

inline constexpr std::size_t kStoreStreamingBytes = std::size_t{8} << 20;

// Whether store_kv prefetches its input ahead into L1: with next_row_l1 the
// conversion loops prefetch 2 KiB ahead of what they read, one line per line
// read, running on into the next token's K and V rows (one burst of the
// whole next row per row is more than the L1's miss buffers take at once). Results never depend on
// it. automatic picks, from measurements (docs/PERFORMANCE.md):
// - next_row_l1 with RoPE on K, on every processor: the rotation reads each
//   K row in a pass of its own, whose loads the hardware prefetchers alone
//   leave waiting on DRAM (Zen 5 with a RopeTable, burst form: bf16 1.55x,
//   f16 1.35x);
// - next_row_l1 for bf16 and f16, none for f32 on AMD processors without
//   AVX-512 (Zen 3, running form, against none: bf16 1.13x, f16 1.10-1.26x,
//   f32 0.94x);
// - next_row_l1 on AMD processors with AVX-512 (Zen 4, running form, against
//   none, 2 threads: bf16 1.29x, f16 1.15x, f32 1.15x, bf16 with RoPE 1.14x;
//   the burst form had cost f16 on Zen 4 / 5, 0.79x / 0.94x; the running form
//   is not measured on Zen 5);
// - next_row_l1 elsewhere (a Sapphire Rapids Xeon, burst form: bf16 0.68 ->
//   0.77 of memcpy).
enum class StorePrefetch : std::uint8_t { automatic, next_row_l1, none };

class RopeTable;  // kernels/rope_table.h

struct StoreOptions {
  RopeOptions rope_k{};
  // Optional cos/sin of rope_k's angles per position, computed once
  // (kernels/rope_table.h): the same results without the per-token
  // trigonometry. It must match rope_k (same theta and rotary_dim in effect)
  // and rope_k must be enabled (InvalidArgument otherwise). Positions at or
  // past its max_positions are computed per token. Not owned.
  const RopeTable* rope_table = nullptr;
  StorePrefetch prefetch = StorePrefetch::automatic;
};

// The strategy options.prefetch stands for on the calling processor (never
// automatic), for a store of `dtype` with options.rope_k: what store_kv()
// uses. Throws InvalidArgument for a value outside the enum.
StorePrefetch resolve_store_prefetch(const StoreOptions& options, DType dtype);

// The strategy `requested` stands for on the calling processor for caches
// of page layout `layout` (never automatic): what attention() uses for
// AttentionOptions::prefetch. Throws InvalidArgument for a value outside the
// enum.
AttentionPrefetch resolve_attention_prefetch(AttentionPrefetch requested,
                                             PageLayout layout = PageLayout::nhd);

// The prefetch strategies by name, as `kvcache bench --prefetch` and the
// Python binding spell them: attention "auto", "step-l1", "tile-l2", "none";
// store "auto", "row-l1", "none". The parsers throw InvalidArgument naming
// the value and the accepted names; the name of a value outside the enum is
// "?".
std::string_view prefetch_name(AttentionPrefetch p);
std::string_view prefetch_name(StorePrefetch p);
AttentionPrefetch parse_attention_prefetch(std::string_view name);
StorePrefetch parse_store_prefetch(std::string_view name);

// AttentionPrecision by name, as `kvcache bench --precision` and the Python
// binding spell it: "fp32", "bf16". Parsing throws InvalidArgument naming
// the value and the accepted names; the name of a value outside the enum
// is "?".
std::string_view precision_name(AttentionPrecision p);
AttentionPrecision parse_attention_precision(std::string_view name);

namespace detail {

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

}  // namespace detail

}  // namespace kvcache
