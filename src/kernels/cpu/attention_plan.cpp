#include "kernels/cpu/attention_plan.h"

#include <algorithm>

namespace kvcache::kernels {

namespace {

constexpr std::uint32_t kMinSplitTokens = 512;
constexpr std::uint32_t kItemsPerThread = 8;

std::uint32_t split_tokens(std::uint64_t decode_tokens, std::size_t threads, std::uint32_t page) {
  if (threads <= 1) return 0xffffffffu;
  const std::uint64_t want = decode_tokens / (threads * kItemsPerThread);
  std::uint64_t chunk = std::max<std::uint64_t>(kMinSplitTokens, want);
  if (page <= chunk) chunk = (chunk + page - 1) / page * page;  // page aligned
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, 0xffffffffu));
}

}  // namespace

AttentionPlan make_attention_plan(const AttentionShape& s, const std::uint32_t* cache_lengths,
                                  std::span<const std::uint32_t> row_offsets, std::size_t threads) {
  AttentionPlan plan;
  std::uint64_t decode_tokens = 0;
  for (std::uint32_t b = 0; b < s.batch; ++b) {
    const std::uint32_t n = row_offsets[b + 1] - row_offsets[b];
    if (n > 0 && n <= kDecodeRows) decode_tokens += cache_lengths[b] + n;
  }
  const std::uint32_t chunk = split_tokens(decode_tokens, threads, s.page);
  std::vector<WorkItem> direct;
  for (std::uint32_t b = 0; b < s.batch; ++b) {
    const std::uint32_t r0 = row_offsets[b];
    const std::uint32_t n = row_offsets[b + 1] - r0;
    if (n == 0) continue;
    const std::uint32_t cl = cache_lengths[b];
    if (n <= kDecodeRows) {
      const std::uint32_t ctx = cl + n;
      const std::uint64_t cost = std::uint64_t{ctx} * s.n_kv;
      if (ctx <= chunk) {
        direct.push_back({b, r0, r0 + n, 0, s.n_kv, 0, ctx, kNoMerge, cost});
        continue;
      }
      const auto g = static_cast<std::uint32_t>(plan.groups.size());
      MergeGroup mg{static_cast<std::uint32_t>(plan.items.size()), 0};
      for (std::uint32_t t = 0; t < ctx; t += chunk) {
        const std::uint32_t t1 = std::min(ctx, t + chunk);
        plan.items.push_back({b, r0, r0 + n, 0, s.n_kv, t, t1, g, std::uint64_t{t1 - t} * s.n_kv});
        ++mg.count;
      }
      plan.groups.push_back(mg);
      continue;
    }
    const std::uint32_t rows = prefill_rows(s.group, s.prefill_vectors);
    for (std::uint32_t i = 0; i < n; i += rows) {
      const std::uint32_t i1 = std::min(n, i + rows);
      const std::uint32_t t1 = cl + i1;  // last row sees tokens < cl + i1
      for (std::uint32_t h = 0; h < s.n_kv; ++h) {
        direct.push_back(
            {b, r0 + i, r0 + i1, h, h + 1, 0, t1, kNoMerge, std::uint64_t{t1} * (i1 - i), true});
      }
    }
  }
  plan.split_items = plan.items.size();
  // Longest first balances the dynamic schedule (causal blocks grow with rows).
  std::stable_sort(direct.begin(), direct.end(),
                   [](const WorkItem& a, const WorkItem& c) { return a.cost > c.cost; });
  plan.items.insert(plan.items.end(), direct.begin(), direct.end());
  return plan;
}

}  // namespace kvcache::kernels
