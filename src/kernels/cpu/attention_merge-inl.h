// The merge of split decode items and the worker fan-out shared by the CPU
// attention driver (attention_cpu-inl.h), per Highway
// target. Partials of an item: [total] maxima, [total] sums, [total][dim]
// unnormalised accumulators, total = heads x rows x group query vectors.
#if defined(KVCACHE_KERNELS_CPU_ATTENTION_MERGE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ATTENTION_MERGE_INL_H_
#undef KVCACHE_KERNELS_CPU_ATTENTION_MERGE_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ATTENTION_MERGE_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "hwy/highway.h"
#include "kernels/cpu/kernel_common.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {

// Combines a group's partials (max, sum, acc per query vector) into out.
inline void MergeGroupOutput(const AttentionCtx& c, const MergeGroup& g, const float* partials,
                             std::size_t stride) {
  const WorkItem& it = c.plan->items[g.first];
  const std::uint32_t dim = c.dim;
  const std::size_t total = std::size_t{it.h1 - it.h0} * (it.r1 - it.r0) * c.group;
  const std::size_t q_row = std::size_t{c.n_q} * dim;
  std::size_t idx = 0;
  for (std::uint32_t h = it.h0; h < it.h1; ++h) {
    for (std::uint32_t r = it.r0; r < it.r1; ++r) {
      for (std::uint32_t gq = 0; gq < c.group; ++gq, ++idx) {
        float m = -std::numeric_limits<float>::infinity();
        for (std::uint32_t s = 0; s < g.count; ++s)
          m = std::max(m, partials[(g.first + s) * stride + idx]);
        float* dst = c.out + r * q_row + std::size_t{h * c.group + gq} * dim;
        std::fill(dst, dst + dim, 0.0f);
        float l = 0.0f;
        for (std::uint32_t s = 0; s < g.count; ++s) {
          const float* p = partials + (g.first + s) * stride;
          if (p[idx] == -std::numeric_limits<float>::infinity()) continue;
          const float w = std::exp(p[idx] - m);
          l += w * p[total + idx];
          const float* a = p + 2 * total + idx * dim;
          for (std::uint32_t d = 0; d < dim; ++d) dst[d] += w * a[d];
        }
        const float inv = 1.0f / l;
        for (std::uint32_t d = 0; d < dim; ++d) dst[d] *= inv;
      }
    }
  }
}

// Runs fn(worker) on up to `want` workers of the pool (or inline).
template <class F>
void OnWorkers(ThreadPool* pool, std::size_t want, const F& fn) {
  const std::size_t workers = pool == nullptr ? 1 : std::min(pool->num_threads(), want);
  if (workers <= 1) {
    fn(0);
    return;
  }
  pool->parallel_for(workers, fn);
}

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_ATTENTION_MERGE_INL_H_ (per target)
