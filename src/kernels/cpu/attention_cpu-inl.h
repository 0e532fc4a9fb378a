// Per-target driver of the CPU attention kernel: everything but the entry points,
// which live one element type per translation unit (attention_f32.cpp,
// attention_f16.cpp, attention_bf16.cpp) so that a parallel build compiles
// the three instantiations at once. Included once per Highway target.
//
//
// Per work item: query vectors are pre-scaled into scratch; KV tokens are
// walked in tiles of at most kTile tokens (rows addressed through the page
// table one by one, so tiles span pages). Within a tile every KV head of the
// item is processed together, token-major: the tile's K rows are scored a
// few tokens at a time across all heads (blocks of kQ queries x kT tokens of
// one head, kQ * kT = kN lanes, or with one query per head kN (token, head)
// pairs, each row read whole), so the reads walk each page in address order.
// On HND pages the tile goes head by head instead (each head's rows are
// adjacent there; with one or two query vectors per head V over the whole
// tile per accumulator load);
// each K load feeds 2 * kQ FMAs and one transpose-add tree turns the kN
// partial-product vectors into one vector of kN scores. The online softmax
// runs on whole score vectors per (head, query), then V rows are accumulated
// a few tokens at a time across the heads (up to 8 query vectors per V
// load; with one query per head, two heads' accumulators in registers).
// bf16 rows are read as u32 and split into even/odd f32 vectors (shift /
// mask, no shuffles); query and accumulator rows use that element order and
// are put back in order on output. While one tile runs, rows ahead are
// prefetched (AttentionPrefetch: the next block into L1, or the next whole
// tile into L2 at the rate the loops read, chosen per processor). Split
// items write (max, sum, acc) partials merged afterwards. Prefill items (one
// KV head, a block of query rows) take the query-lanes path of
// attention_prefill-inl.h instead where the target has the lanes for it.
#if defined(KVCACHE_KERNELS_CPU_ATTENTION_CPU_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_KERNELS_CPU_ATTENTION_CPU_INL_H_
#undef KVCACHE_KERNELS_CPU_ATTENTION_CPU_INL_H_
#else
#define KVCACHE_KERNELS_CPU_ATTENTION_CPU_INL_H_
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "hwy/highway.h"
#include "kernels/cpu/attention_item_runner-inl.h"
#include "kernels/cpu/attention_merge-inl.h"
#include "kernels/cpu/attention_prefill-inl.h"
#include "kernels/cpu/kernel_common.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache::kernels::HWY_NAMESPACE {

template <class T>
void RunAttention(const AttentionCtx& c) {
  const AttentionPlan& plan = *c.plan;
  const std::size_t n_items = plan.items.size();
  std::size_t max_total = 0;
  for (std::size_t i = 0; i < plan.split_items; ++i) {
    const WorkItem& it = plan.items[i];
    max_total =
        std::max<std::size_t>(max_total, std::size_t{it.h1 - it.h0} * (it.r1 - it.r0) * c.group);
  }
  const std::size_t stride = max_total * (c.dim + 2);
  std::vector<float> partials(plan.split_items * stride);
  std::atomic<std::size_t> next{0};
  OnWorkers(c.pool, n_items, [&](std::size_t) {
    Scratch s;
    prefill::Buffers pb;
    ItemRunner<T> runner(c);
    std::size_t i = next.fetch_add(1);
    while (i < n_items) {
      const WorkItem& it = plan.items[i];
      // The runner may claim its next item early, to prefetch into it.
      std::size_t following = n_items;
      bool claimed = false;
      const auto claim_next = [&]() -> const WorkItem* {
        claimed = true;
        following = next.fetch_add(1);
        return following < n_items ? &plan.items[following] : nullptr;
      };
      // 8-bit codes run every item in the tile loops (prefill items too).
      if (!kIsCode<T> && it.prefill && (it.r1 - it.r0) * c.group <= prefill::max_query_vectors()) {
        if constexpr (!kIsCode<T>) prefill::RunItem<T>(c, it, pb);
      } else {
        runner.run(it, s, i < plan.split_items ? partials.data() + i * stride : nullptr,
                   claim_next);
      }
      i = claimed ? following : next.fetch_add(1);
    }
  });
  if (plan.groups.empty()) return;
  std::atomic<std::size_t> next_group{0};
  OnWorkers(c.pool, plan.groups.size(), [&](std::size_t) {
    for (std::size_t g = next_group.fetch_add(1); g < plan.groups.size();
         g = next_group.fetch_add(1)) {
      MergeGroupOutput(c, plan.groups[g], partials.data(), stride);
    }
  });
}

}  // namespace kvcache::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_KERNELS_CPU_ATTENTION_CPU_INL_H_ (per target)
