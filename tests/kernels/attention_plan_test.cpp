// The CPU attention's work decomposition (src/kernels/cpu/attention_plan.*):
// which items a call is cut into. Correctness of the results is covered by
// attention_test.cpp; these tests pin the shape of the plan.
#include "kernels/cpu/attention_plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace kvcache::kernels {
namespace {

struct Decode {
  std::vector<std::uint32_t> cache_lengths;
  std::vector<std::uint32_t> row_offsets;
};

// Entries of one new row each over the given contexts (history + 1).
Decode decode_entries(const std::vector<std::uint32_t>& contexts) {
  Decode d;
  d.row_offsets.push_back(0);
  for (const std::uint32_t ctx : contexts) {
    d.cache_lengths.push_back(ctx - 1);
    d.row_offsets.push_back(d.row_offsets.back() + 1);
  }
  return d;
}

AttentionPlan plan_for(const std::vector<std::uint32_t>& contexts, std::uint32_t page,
                       std::size_t threads) {
  const Decode d = decode_entries(contexts);
  const AttentionShape shape{static_cast<std::uint32_t>(contexts.size()), 8, 4, 128, page, 32};
  return make_attention_plan(shape, d.cache_lengths.data(), d.row_offsets, threads);
}

// Token ranges [t0, t1) of the items of entry b, in plan order.
std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges_of(const AttentionPlan& plan,
                                                               std::uint32_t b) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> r;
  for (const WorkItem& it : plan.items) {
    if (it.b == b) r.emplace_back(it.t0, it.t1);
  }
  return r;
}

using Ranges = std::vector<std::pair<std::uint32_t, std::uint32_t>>;

TEST(AttentionPlan, ShortBatchOneIsSplitEvenlyOverTheThreads) {
  // 512 tokens would be one item under the 512-token minimum: 2 threads get 256 each.
  const AttentionPlan two = plan_for({512}, 16, 2);
  EXPECT_EQ(ranges_of(two, 0), (Ranges{{0, 256}, {256, 512}}));
  ASSERT_EQ(two.groups.size(), 1u);
  EXPECT_EQ(two.groups[0].count, 2u);
  EXPECT_EQ(two.split_items, 2u);
  // Page aligned: 300 / 2 = 150 rounds up to 160 on 16-token pages.
  EXPECT_EQ(ranges_of(plan_for({300}, 16, 2), 0), (Ranges{{0, 160}, {160, 300}}));
  // No more pieces than 128-token ones would make: 200 tokens are 2 pieces
  // (112 + 88, even and page aligned) on 2 threads and still 2 on 4.
  EXPECT_EQ(ranges_of(plan_for({200}, 16, 2), 0), (Ranges{{0, 112}, {112, 200}}));
  EXPECT_EQ(ranges_of(plan_for({200}, 16, 4), 0), (Ranges{{0, 112}, {112, 200}}));
  // 16 threads, 4096 tokens: 16 pieces of 256 rather than 8 of 512.
  EXPECT_EQ(plan_for({4096}, 16, 16).items.size(), 16u);
}

TEST(AttentionPlan, SplitPiecesAreEvenAndSpreadOverTheThreads) {
  // 600 tokens were 512 + 88 (one thread did nearly all of it): now 304 + 296.
  EXPECT_EQ(ranges_of(plan_for({600}, 16, 2), 0), (Ranges{{0, 304}, {304, 600}}));
  // 1100 tokens were 3 pieces of up to 512 (2 on one thread): now 4 of 288 or less.
  EXPECT_EQ(ranges_of(plan_for({1100}, 16, 2), 0),
            (Ranges{{0, 288}, {288, 576}, {576, 864}, {864, 1100}}));
  // On 3 threads the 3 pieces are one per thread already: 368, 368, 364.
  EXPECT_EQ(ranges_of(plan_for({1100}, 16, 3), 0), (Ranges{{0, 368}, {368, 736}, {736, 1100}}));
  // Pieces larger than pages round to whole pages; smaller ones may not.
  EXPECT_EQ(ranges_of(plan_for({600}, 128, 2), 0), (Ranges{{0, 384}, {384, 600}}));
  // A batch keeps its per-entry pieces even too.
  const AttentionPlan p = plan_for({600, 3000}, 16, 2);
  EXPECT_EQ(ranges_of(p, 0), (Ranges{{0, 304}, {304, 600}}));
  for (const auto& [t0, t1] : ranges_of(p, 1)) EXPECT_LE(t1 - t0, 512u);
}

TEST(AttentionPlan, ShortContextsStayWhole) {
  // 128 tokens or fewer: one item, no merge, on any number of threads.
  for (const std::size_t threads : {2u, 4u, 64u}) {
    const AttentionPlan p = plan_for({128}, 16, threads);
    EXPECT_EQ(ranges_of(p, 0), (Ranges{{0, 128}})) << threads;
    EXPECT_TRUE(p.groups.empty());
  }
  // One thread never splits.
  EXPECT_EQ(ranges_of(plan_for({100000}, 16, 1), 0), (Ranges{{0, 100000}}));
}

TEST(AttentionPlan, EnoughEntriesAreNotSplit) {
  // Two entries on two threads already make an item each: no merges added.
  const AttentionPlan p = plan_for({512, 512}, 16, 2);
  EXPECT_EQ(p.items.size(), 2u);
  EXPECT_TRUE(p.groups.empty());
  // Long contexts keep the 512-token minimum and ~8 items per thread.
  const AttentionPlan longer = plan_for({4096}, 16, 2);
  EXPECT_EQ(longer.items.size(), 8u);
  EXPECT_EQ(ranges_of(longer, 0).front(), (std::pair<std::uint32_t, std::uint32_t>{0, 512}));
}

TEST(AttentionPlan, ItemsCoverEveryTokenOnceOnPageBoundaries) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const std::uint32_t page = std::vector<std::uint32_t>{1, 16, 128, 100}[trial % 4];
    const std::size_t threads = 1 + rng() % 8;
    std::vector<std::uint32_t> contexts(1 + rng() % 4);
    for (auto& ctx : contexts) ctx = 1 + rng() % 3000;
    const AttentionPlan p = plan_for(contexts, page, threads);
    for (std::uint32_t b = 0; b < contexts.size(); ++b) {
      const Ranges r = ranges_of(p, b);
      ASSERT_FALSE(r.empty());
      std::uint32_t at = 0;
      for (const auto& [t0, t1] : r) {
        ASSERT_EQ(t0, at) << "entry " << b << " trial " << trial;
        ASSERT_LT(t0, t1);
        // Split points fall on page boundaries where a split is at least a page.
        if (t1 != contexts[b] && p.items.size() > 1) {
          const std::uint32_t len = t1 - t0;
          if (len >= page) {
            ASSERT_EQ(t1 % page, 0u) << "page " << page << " trial " << trial;
          }
        }
        at = t1;
      }
      ASSERT_EQ(at, contexts[b]) << "entry " << b << " trial " << trial;
    }
    std::uint32_t grouped = 0;
    for (const MergeGroup& g : p.groups) {
      ASSERT_GE(g.count, 2u);
      grouped += g.count;
    }
    ASSERT_EQ(grouped, p.split_items);
  }
}

}  // namespace
}  // namespace kvcache::kernels
