// CPU attention (Highway, runtime dispatch): argument checks, the work plan
// and the dispatch to the per-element-type entry points. The kernel itself is
// kernels/cpu/attention_cpu-inl.h; see kvcache/kernels/attention.h for the
// contract and kernels/cpu/attention_plan.h for the work split.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cpu/kernel_common.h"
#include "kvcache/error.h"
#include "kvcache/kernels/attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention_cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"
// Must come after highway.h (per-target code of its own).
#include "kernels/cpu/attention_prefill-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {

// Query vectors per prefill item for this target: what the query-lanes path
// takes (4 vectors of lanes), or 32 for the row path where it has no lanes.
std::uint32_t PrefillQueryVectors() {
  const std::uint32_t v = prefill::max_query_vectors();
  return v == 0 ? 32 : v;
}

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache {
namespace kernels {
HWY_EXPORT(PrefillQueryVectors);

// Query vectors per prefill item on the best target. Dispatched from inside
// namespace kernels: with one target compiled, HWY_DYNAMIC_DISPATCH is a
// static call to N_<TARGET>::name, which only resolves here.
std::uint32_t prefill_query_vectors() { return HWY_DYNAMIC_DISPATCH(PrefillQueryVectors)(); }

namespace {
void check_same_shape(const CacheDesc& k, const CacheDesc& v) {
  if (k.batch_size != v.batch_size || k.n_kv_heads != v.n_kv_heads || k.head_dim != v.head_dim ||
      k.page_size != v.page_size || k.cache_lengths != v.cache_lengths ||
      k.lookup_table != v.lookup_table || k.layout != v.layout || k.dtype != v.dtype ||
      k.block_stride != v.block_stride) {
    throw InvalidArgument(
        "key and value caches differ in shape or batch (batch " + std::to_string(k.batch_size) +
        " vs " + std::to_string(v.batch_size) + ", heads " + std::to_string(k.n_kv_heads) + " vs " +
        std::to_string(v.n_kv_heads) + ", head_dim " + std::to_string(k.head_dim) + " vs " +
        std::to_string(v.head_dim) + ", layout " + std::string(layout_name(k.layout)) + " vs " +
        std::string(layout_name(v.layout)) + ", dtype " + std::string(dtype_name(k.dtype)) +
        " vs " + std::string(dtype_name(v.dtype)) + ")");
  }
  if (k.blocks == nullptr || v.blocks == nullptr || k.head_dim == 0 || k.n_kv_heads == 0 ||
      k.page_size == 0) {
    throw InvalidArgument("cache view is empty (null blocks or zero head_dim / heads / page size)");
  }
  if (is_fp8(k.dtype) && (k.head_scales == nullptr || v.head_scales == nullptr)) {
    throw InvalidArgument("an " + std::string(dtype_name(k.dtype)) +
                          " cache view has no head_scales (its static K / V scales)");
  }
  if (has_page_scales(k.dtype) && k.head_dim % 4 != 0) {
    throw InvalidArgument("an int8 cache view's head_dim " + std::to_string(k.head_dim) +
                          " is not a multiple of 4");
  }
  const CacheDesc resolved = k.with_strides();
  if (k.block_stride != resolved.block_stride || k.token_stride != resolved.token_stride ||
      k.head_stride != resolved.head_stride || !is_dtype(k.dtype)) {
    throw InvalidArgument("cache view's dtype or strides (block " + std::to_string(k.block_stride) +
                          ", token " + std::to_string(k.token_stride) + ", head " +
                          std::to_string(k.head_stride) +
                          ") are not those of its geometry: take it from CacheDesc::layer()");
  }
}
}  // namespace

// Checks that each entry's new rows fit in the room its fetch reserved
// (reserved_lengths, or the blocks its table row holds) and that every block
// they need is a real block, never the sentinel.
void check_rows_fit(const CacheDesc& k, std::span<const std::uint32_t> row_offsets) {
  detail::check_row_offsets(row_offsets, k.batch_size);
  const LayerCacheBase<float> view = table_view(k);
  detail::check_reserved_rows(view, row_offsets);  // the references' check, one message
  // A view built by hand may reserve more than its table holds: the rows'
  // blocks must lie in the table and be real blocks.
  const std::uint64_t table_tokens = std::uint64_t{k.lookup_stride} * k.page_size;
  for (std::uint32_t b = 0; b < k.batch_size; ++b) {
    const std::uint64_t end =
        std::uint64_t{k.cache_lengths[b]} + (row_offsets[b + 1] - row_offsets[b]);
    if (end > table_tokens) {
      throw InvalidArgument("entry " + std::to_string(b) + " needs " + std::to_string(end) +
                            " tokens but the lookup table holds " + std::to_string(table_tokens));
    }
    const std::uint64_t blocks = (end + k.page_size - 1) / k.page_size;
    for (std::uint32_t j = 0; j < blocks; ++j) {
      if (view.block_id(b, j) >= k.num_blocks && k.num_blocks != 0) {
        throw InvalidArgument("entry " + std::to_string(b) + " needs block " + std::to_string(j) +
                              " for " + std::to_string(end) + " tokens but its lookup_table " +
                              "entry is " + std::to_string(view.block_id(b, j)) +
                              " (the sentinel or past the " + std::to_string(k.num_blocks) +
                              " blocks)");
      }
    }
  }
}

void check_shapes(const CacheDesc& k, const CacheDesc& v,
                  std::span<const std::uint32_t> row_offsets) {
  check_same_shape(k, v);
  check_rows_fit(k, row_offsets);
}
}  // namespace kernels

AttentionPrefetch resolve_attention_prefetch(AttentionPrefetch requested, PageLayout layout) {
  if (requested > AttentionPrefetch::next_tile_l1) {
    throw InvalidArgument("AttentionOptions::prefetch value " +
                          std::to_string(static_cast<int>(requested)) +
                          " is not automatic, next_step_l1, next_tile_l2, none or next_tile_l1");
  }
  if (requested != AttentionPrefetch::automatic) return requested;
  if (!kernels::running_on_amd()) return AttentionPrefetch::next_step_l1;
  // AMD without AVX-512 (Zen 3 and older) on NHD pages: next_step_l1 read
  // 1.23x (MHA) and 1.11x (GQA 4) of next_tile_l2 in DRAM on a Zen 3; on HND
  // pages next_tile_l2 stayed ahead.
  if (layout == PageLayout::nhd && !kernels::cpu_has_avx512()) {
    return AttentionPrefetch::next_step_l1;
  }
  // The prefetch stream's instruction: prefetcht0 read 1.02-1.10x of prefetcht1 on a
  // Zen 5, but 0.50-0.79x on a Zen 4
  //. Zen 3 (family 19h too, HND pages here) is taken to be
  // like Zen 4; not measured.
  return kernels::cpu_family() >= 0x1A ? AttentionPrefetch::next_tile_l1
                                       : AttentionPrefetch::next_tile_l2;
}

void attention(const CacheDesc& k, const CacheDesc& v, std::span<const float> q,
               std::uint32_t n_q_heads, std::span<const std::uint32_t> row_offsets,
               std::span<float> out, const AttentionOptions& options, ThreadPool* pool) {
  const DType dtype = k.dtype;
  kernels::check_shapes(k, v, row_offsets);
  detail::check_precision(options.precision);
  detail::check_scale(options.scale);
  if (n_q_heads == 0 || n_q_heads % k.n_kv_heads != 0) {
    throw InvalidArgument("n_q_heads " + std::to_string(n_q_heads) +
                          " must be a positive multiple of n_kv_heads " +
                          std::to_string(k.n_kv_heads));
  }
  const std::size_t q_row = std::size_t{n_q_heads} * k.head_dim;
  detail::check_size("q", q.size(), row_offsets[k.batch_size] * q_row);
  detail::check_size("out", out.size(), row_offsets[k.batch_size] * q_row);
  if (row_offsets[k.batch_size] == 0) return;

  kernels::AttentionShape shape{k.batch_size, k.n_kv_heads, n_q_heads / k.n_kv_heads,
                                k.head_dim,   k.page_size,  kernels::prefill_query_vectors()};
  const kernels::AttentionPlan plan = kernels::make_attention_plan(
      shape, k.cache_lengths, row_offsets, pool == nullptr ? 1 : pool->num_threads());
  kernels::AttentionCtx c;
  c.k = {k.blocks, k.block_stride};
  c.v = {v.blocks, v.block_stride};
  c.cache_lengths = k.cache_lengths;
  c.lookup = k.lookup_table;
  c.lookup_stride = k.lookup_stride;
  c.page = k.page_size;
  c.n_kv = k.n_kv_heads;
  c.group = shape.group;
  c.dim = k.head_dim;
  c.token_stride = k.token_stride;
  c.head_stride = k.head_stride;
  c.q = q.data();
  c.out = out.data();
  c.n_q = n_q_heads;
  c.scale = options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(float(k.head_dim));
  c.row_offsets = row_offsets.data();
  c.plan = &plan;
  c.pool = pool;
  c.prefetch = resolve_attention_prefetch(options.prefetch, k.layout);
  // The residency probe where automatic was measured with it: on AMD.
  c.probe_residency = options.prefetch == AttentionPrefetch::automatic && kernels::running_on_amd();
  c.bf16_inputs = options.precision == AttentionPrecision::bf16 && dtype == DType::bf16;
  c.k_head_scales = k.head_scales;
  c.v_head_scales = v.head_scales;
  c.scales_offset = k.block_values();
  switch (dtype) {
    case DType::f32:
      kernels::attention_f32(c);
      break;
    case DType::f16:
      kernels::attention_f16(c);
      break;
    case DType::bf16:
      kernels::attention_bf16(c);
      break;
    case DType::fp8_e4m3:
      kernels::attention_e4m3(c);
      break;
    case DType::fp8_e5m2:
      kernels::attention_e5m2(c);
      break;
    case DType::int8:
      kernels::attention_i8(c);
      break;
    default:
      break;
  }
}

}  // namespace kvcache
#endif  // HWY_ONCE
