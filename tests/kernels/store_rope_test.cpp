// Fused RoPE-on-K store == apply_rope_reference + store_kv_reference, bit for
// bit (same angles from rope_cos_sin, same float expression, same rounding),
// with and without a RopeTable (including positions past its end).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>

#include "kernel_test_util.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/isa.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/kernels/rope.h"
#include "kvcache/kernels/rope_table.h"
#include "kvcache/thread_pool.h"

namespace kvcache {
namespace {

using test::Entry;
using test::OwnedCache;

// Entries {history, new tokens} and KV heads of one store call: by default a
// small call reaching positions 0 .. 1000.
struct RopeCall {
  std::vector<Entry> entries{{41, 3}, {0, 50}, {7, 1}, {1000, 1}};
  std::uint32_t n_kv = 3;
};

// table_positions > 0: the fused store reads cos/sin from a RopeTable of
// that many positions.
template <CacheElement T>
void check_rope(std::uint32_t dim, std::uint32_t rotary_dim, std::uint32_t page, bool paged,
                std::size_t threads, std::mt19937& rng, std::uint32_t table_positions = 0,
                const RopeCall& call = {}) {
  SCOPED_TRACE("dim " + std::to_string(dim) + " rotary " + std::to_string(rotary_dim) + " table " +
               std::to_string(table_positions));
  const std::uint32_t n_kv = call.n_kv;
  OwnedCache<T> ref(call.entries, paged, page, n_kv, dim, rng);
  OwnedCache<T> fast(ref);
  const std::uint32_t rows = ref.total_rows();
  const std::size_t row = std::size_t{n_kv} * dim;
  auto k_new = test::random_floats(rows * row, -1, 1, rng);
  const auto v_new = test::random_floats(rows * row, -1, 1, rng);
  StoreOptions opt;
  opt.rope_k = {true, 500000.0f, rotary_dim};
  std::optional<RopeTable> table;
  if (table_positions > 0) {
    table.emplace(opt.rope_k, dim, table_positions);
    opt.rope_table = &*table;
  }
  ThreadPool pool(threads);
  const auto L = OwnedCache<T>::kLayer;
  test::with_collection(fast, [&](const auto& col) {
    store_kv(col.get_key_cache(L), col.get_value_cache(L), std::span<const float>(k_new),
             std::span<const float>(v_new), std::span<const std::uint32_t>(fast.row_offsets), opt,
             &pool);
  });
  std::vector<float> rotated = k_new;
  for (std::uint32_t b = 0; b + 1 < ref.row_offsets.size(); ++b) {
    for (std::uint32_t r = ref.row_offsets[b]; r < ref.row_offsets[b + 1]; ++r) {
      const std::uint32_t pos = ref.cache_lengths[b] + (r - ref.row_offsets[b]);
      apply_rope_reference(std::span(rotated).subspan(r * row, row), n_kv, dim, pos, opt.rope_k);
    }
  }
  test::with_collection(ref, [&](const auto& col) {
    store_kv_reference(col.get_key_cache(L), col.get_value_cache(L),
                       std::span<const float>(rotated), std::span<const float>(v_new),
                       std::span<const std::uint32_t>(ref.row_offsets));
  });
  ASSERT_EQ(0, std::memcmp(ref.blocks.data(), fast.blocks.data(), ref.blocks.size() * sizeof(T)));
}

TEST(StoreKvRope, FusedEqualsReferenceRopeThenStore) {
  std::mt19937 rng(42);
  for (std::uint32_t dim : {64u, 80u, 128u}) {
    check_rope<float>(dim, 0, 16, true, 2, rng);
    check_rope<Half>(dim, dim / 2, 1, true, 1, rng);
    check_rope<BFloat16>(dim, 0, 128, false, 2, rng);
  }
}

TEST(StoreKvRope, TableGivesTheSameBitsAsComputedAngles) {
  std::mt19937 rng(43);
  // 45 positions: entry {41, 3} inside, {0, 50} across the end, {1000, 1} past it.
  for (std::uint32_t dim : {64u, 80u, 96u, 128u, 256u}) {
    check_rope<BFloat16>(dim, 0, 16, true, 2, rng, 45);
    check_rope<Half>(dim, dim / 2, 1, true, 1, rng, 45);
    check_rope<float>(dim, dim - 2, 128, false, 2, rng, 2000);
  }
}

// Large calls (>= kStoreStreamingBytes, aligned rows: non-temporal stores)
// and every compiled SIMD target: the rotation fused with the conversion
// where the pairs fill whole vector pairs (head dim 64, 128, 256 here),
// the buffered one elsewhere (80, 96; rotary_dim 48).
TEST(StoreKvRope, LargeCallsOnEveryCompiledSimdTarget) {
  std::mt19937 rng(45);
  const RopeCall large{{{0, 2100}, {5, 1500}}, 8};
  for (const std::string& isa : available_isas()) {
    SCOPED_TRACE(isa);
    select_isa(isa);
    check_rope<BFloat16>(128, 0, 16, true, 2, rng, 4000, large);
    check_rope<Half>(256, 0, 16, true, 2, rng, 0, large);
    check_rope<float>(64, 0, 128, false, 2, rng, 3000, large);
    check_rope<BFloat16>(96, 48, 16, true, 1, rng, 4000, large);
    check_rope<Half>(80, 0, 16, true, 2, rng, 100);
    check_rope<BFloat16>(128, 64, 1, true, 1, rng, 100);
  }
  select_isa("auto");
}

TEST(StoreKvRope, TableHoldsRopeCosSin) {
  const RopeOptions rope{true, 10000.0f, 48};
  const RopeTable table(rope, 64, 300);
  EXPECT_EQ(table.rotary_dim(), 48u);
  EXPECT_EQ(table.max_positions(), 300u);
  EXPECT_EQ(table.memory_bytes(), 300u * 48u * sizeof(float));
  for (std::uint32_t pos : {0u, 1u, 17u, 299u}) {
    const auto cs = table.cos_sin(pos);
    ASSERT_EQ(cs.size(), 48u);
    for (std::uint32_t i = 0; i < 24; ++i) {
      float c = 0.0f;
      float s = 0.0f;
      rope_cos_sin(pos, rope_inv_freq(i, 48, rope.theta), c, s);
      EXPECT_EQ(cs[i], c) << "pos " << pos << " pair " << i;
      EXPECT_EQ(cs[24 + i], s) << "pos " << pos << " pair " << i;
    }
  }
  EXPECT_THROW((void)table.cos_sin(300), InvalidArgument);
  EXPECT_TRUE(table.matches(rope, 64));
  EXPECT_TRUE(table.matches(RopeOptions{false, 10000.0f, 48}, 64));
  EXPECT_FALSE(table.matches(RopeOptions{true, 10000.0f, 0}, 64));  // 0 means 64 here
  EXPECT_FALSE(table.matches(RopeOptions{true, 500000.0f, 48}, 64));
  EXPECT_THROW(RopeTable(rope, 64, 0), InvalidArgument);
  // head_dim 0 (Python's RopeTable(0, 16)) was accepted as an empty table.
  EXPECT_THROW(RopeTable(RopeOptions{true, 10000.0f, 0}, 0, 16), InvalidArgument);
  EXPECT_THROW(RopeTable(RopeOptions{true, 10000.0f, 7}, 64, 10), InvalidArgument);
  EXPECT_THROW(RopeTable(RopeOptions{true, -1.0f, 0}, 64, 10), InvalidArgument);
  // 2^32 - 1 positions of head dim 2^30: more floats than a vector can hold
  // (std::length_error, never an allocation attempt, so sanitizers are fine).
  try {
    RopeTable(RopeOptions{true, 10000.0f, 0}, 1u << 30, 0xFFFFFFFFu);
    ADD_FAILURE() << "an impossible RopeTable was built";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("4294967295 positions"), std::string::npos) << e.what();
  }
}

TEST(StoreKvRope, MismatchedTableThrowsAndWritesNothing) {
  std::mt19937 rng(44);
  const std::uint32_t n_kv = 2;
  const std::uint32_t dim = 64;
  OwnedCache<BFloat16> cache({{5, 2}, {0, 3}}, true, 4, n_kv, dim, rng);
  const OwnedCache<BFloat16> before(cache);
  const std::size_t rows = cache.total_rows();
  const auto kv = test::random_floats(rows * n_kv * dim, -1, 1, rng);
  const RopeTable table(RopeOptions{true, 10000.0f, 0}, dim, 64);
  const auto L = OwnedCache<BFloat16>::kLayer;
  auto store = [&](const StoreOptions& opt) {
    test::with_collection(cache, [&](const auto& col) {
      store_kv(col.get_key_cache(L), col.get_value_cache(L), std::span<const float>(kv),
               std::span<const float>(kv), std::span<const std::uint32_t>(cache.row_offsets), opt);
    });
  };
  StoreOptions other_theta;
  other_theta.rope_k = {true, 500000.0f, 0};
  other_theta.rope_table = &table;
  EXPECT_THROW(store(other_theta), InvalidArgument);
  StoreOptions other_dim;
  other_dim.rope_k = {true, 10000.0f, 32};
  other_dim.rope_table = &table;
  EXPECT_THROW(store(other_dim), InvalidArgument);
  StoreOptions disabled;
  disabled.rope_table = &table;
  EXPECT_THROW(store(disabled), InvalidArgument);
  EXPECT_EQ(0, std::memcmp(before.blocks.data(), cache.blocks.data(),
                           cache.blocks.size() * sizeof(BFloat16)))
      << "a throwing store_kv wrote into the cache";
  // The matching table is accepted.
  StoreOptions ok;
  ok.rope_k = {true, 10000.0f, 0};
  ok.rope_table = &table;
  EXPECT_NO_THROW(store(ok));
}

TEST(StoreKvRope, ReferenceRotatesPairsAndKeepsNorm) {
  // Position 0 is the identity; any position preserves each pair's norm.
  std::vector<float> x = {0.5f, -1.0f, 2.0f, 0.25f, 3.0f, 4.0f};
  std::vector<float> y = x;
  RopeOptions rope{true, 10000.0f, 4};
  apply_rope_reference(std::span(y), 1, 6, 0, rope);
  EXPECT_EQ(x, y);
  apply_rope_reference(std::span(y), 1, 6, 17, rope);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(std::hypot(x[i], x[i + 2]), std::hypot(y[i], y[i + 2]), 1e-5);
  }
  EXPECT_EQ(y[4], 3.0f);  // past rotary_dim: untouched
  EXPECT_EQ(y[5], 4.0f);
  // Pair 0 turns by exactly pos radians (inv_freq 1).
  EXPECT_NEAR(y[0], 0.5f * std::cos(17.0f) - 2.0f * std::sin(17.0f), 1e-5);
  EXPECT_THROW(apply_rope_reference(std::span(y), 1, 6, 0, RopeOptions{true, 10000.0f, 3}),
               InvalidArgument);
  // A row of 13 floats for 2 heads of 6 (a row of 6, as y is, let GCC 12's
  // -Warray-bounds follow the inlined loop past the throwing size check).
  std::vector<float> odd(13, 1.0f);
  EXPECT_THROW(apply_rope_reference(std::span(odd), 2, 6, 0, rope), InvalidArgument);
  EXPECT_EQ(odd, std::vector<float>(13, 1.0f));
}

}  // namespace
}  // namespace kvcache
