// Work decomposition for the CPU attention kernel (no SIMD here).
//
// A WorkItem is a rectangle of the problem: query rows [r0, r1) of entry b,
// KV heads [h0, h1), KV tokens [t0, t1). Decode entries (few new rows) get all
// heads per item, so every K/V row read serves every query head, and their
// context is cut into page-aligned splits merged by log-sum-exp. Prefill
// entries get one KV head and a block of rows per item, unsplit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/kernels/attention.h"

namespace kvcache::kernels {

struct WorkItem {
  std::uint32_t b = 0;
  std::uint32_t r0 = 0, r1 = 0;  // global query rows
  std::uint32_t h0 = 0, h1 = 0;  // KV heads
  std::uint32_t t0 = 0, t1 = 0;  // KV tokens
  std::uint32_t group = 0;       // merge group index, or kNoMerge
  std::uint64_t cost = 0;
  bool prefill = false;  // a block of prefill rows of one KV head
};

// Items that cover the same (b, rows, heads) and must be merged.
struct MergeGroup {
  std::uint32_t first = 0;  // index of the first item (items of a group are adjacent)
  std::uint32_t count = 0;
};

inline constexpr std::uint32_t kNoMerge = 0xffffffffu;

struct AttentionPlan {
  std::vector<WorkItem> items;  // split items first (grouped), then direct items
  std::vector<MergeGroup> groups;
  std::size_t split_items = 0;  // items [0, split_items) write partials
};

struct AttentionShape {
  std::uint32_t batch = 0;
  std::uint32_t n_kv = 0;
  std::uint32_t group = 0;  // query heads per KV head
  std::uint32_t dim = 0;
  std::uint32_t page = 0;
  std::uint32_t prefill_vectors = 32;  // query vectors per prefill item (target's best)
};

// Entries with at most this many new rows use the decode decomposition.
inline constexpr std::uint32_t kDecodeRows = 4;

AttentionPlan make_attention_plan(const AttentionShape& s, const std::uint32_t* cache_lengths,
                                  std::span<const std::uint32_t> row_offsets, std::size_t threads);

// Query rows per prefill item: about `vectors` query vectors (rows x group),
// at least one row.
inline std::uint32_t prefill_rows(std::uint32_t group, std::uint32_t vectors) {
  const std::uint32_t r = vectors / group;
  return r == 0 ? 1 : r;
}

}  // namespace kvcache::kernels
