#include "kernels/cpu/attention_plan.h"

#include <algorithm>

namespace kvcache::kernels {

namespace {

// Decode splits: about kItemsPerThread per thread, none under
// kMinSplitTokens (each split costs a partial, a merge and a pipeline start).
constexpr std::uint32_t kMinSplitTokens = 512;
constexpr std::uint32_t kItemsPerThread = 8;
// Where the decode entries would still be fewer items than threads (batch 1
// with a short context), they are split evenly over the threads instead,
// into no more pieces than kMinFewSplitTokens-token ones would make (a
// context of kMinFewSplitTokens or fewer stays whole): cache-resident, 2
// threads, batch 1, bf16, 8 KV heads, ctx 512 1.8x of one unsplit item
//.
constexpr std::uint32_t kMinFewSplitTokens = 128;

std::uint64_t round_up(std::uint64_t n, std::uint64_t m) { return (n + m - 1) / m * m; }

// Decode items `contexts` make when cut into chunks of `chunk` tokens.
std::uint64_t decode_items(std::span<const std::uint32_t> contexts, std::uint64_t chunk) {
  std::uint64_t items = 0;
  for (const std::uint32_t ctx : contexts) items += (ctx + chunk - 1) / chunk;
  return items;
}

// Tokens per decode split (0xffffffff: none) for entries of these contexts.
std::uint32_t split_tokens(std::span<const std::uint32_t> contexts, std::size_t threads,
                           std::uint32_t page) {
  if (threads <= 1 || contexts.empty()) return 0xffffffffu;
  std::uint64_t decode_tokens = 0;
  for (const std::uint32_t ctx : contexts) decode_tokens += ctx;
  const std::uint64_t want = decode_tokens / (threads * kItemsPerThread);
  std::uint64_t chunk = std::max<std::uint64_t>(kMinSplitTokens, want);
  if (page <= chunk) chunk = round_up(chunk, page);  // page aligned
  if (decode_items(contexts, chunk) < threads) {
    const std::uint64_t even = (decode_tokens + threads - 1) / threads;
    chunk = std::max<std::uint64_t>(kMinFewSplitTokens, even);
    if (page <= chunk) chunk = round_up(chunk, page);
  }
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, 0xffffffffu));
}

// Tokens per piece of a decode entry of `ctx` tokens that `chunk` splits:
// as many pieces as chunks (rounded up to a multiple of the threads where
// that leaves pieces of kMinFewSplitTokens or more and the pieces are few),
// of even length, page aligned. 512 + 88 tokens on 2 threads took as long as
// 512.
std::uint64_t piece_tokens(std::uint32_t ctx, std::uint64_t chunk, std::size_t threads,
                           std::uint32_t page) {
  std::uint64_t pieces = (ctx + chunk - 1) / chunk;
  const std::uint64_t spread = round_up(pieces, threads);
  if (pieces < threads * kItemsPerThread && ctx / spread >= kMinFewSplitTokens) pieces = spread;
  std::uint64_t len = (ctx + pieces - 1) / pieces;
  if (page <= len) len = round_up(len, page);
  return len;
}

}  // namespace

AttentionPlan make_attention_plan(const AttentionShape& s, const std::uint32_t* cache_lengths,
                                  std::span<const std::uint32_t> row_offsets, std::size_t threads) {
  AttentionPlan plan;
  std::vector<std::uint32_t> contexts;  // of the decode entries
  for (std::uint32_t b = 0; b < s.batch; ++b) {
    const std::uint32_t n = row_offsets[b + 1] - row_offsets[b];
    if (n > 0 && n <= kDecodeRows) contexts.push_back(cache_lengths[b] + n);
  }
  const std::uint32_t chunk = split_tokens(contexts, threads, s.page);
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
      const std::uint64_t len = piece_tokens(ctx, chunk, threads, s.page);
      for (std::uint32_t t = 0; t < ctx;) {
        const auto t1 = static_cast<std::uint32_t>(std::min<std::uint64_t>(ctx, t + len));
        plan.items.push_back({b, r0, r0 + n, 0, s.n_kv, t, t1, g, std::uint64_t{t1 - t} * s.n_kv});
        ++mg.count;
        t = t1;
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
