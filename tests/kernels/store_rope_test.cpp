// Fused RoPE-on-K store == apply_rope_reference + store_kv_reference, bit for
// bit (same angles from rope_cos_sin, same float expression, same rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernel_test_util.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/kernels/rope.h"
#include "kvcache/thread_pool.h"

namespace kvcache {
namespace {

using test::Entry;
using test::OwnedCache;

template <CacheElement T>
void check_rope(std::uint32_t dim, std::uint32_t rotary_dim, std::uint32_t page, bool paged,
                std::size_t threads, std::mt19937& rng) {
  SCOPED_TRACE("dim " + std::to_string(dim) + " rotary " + std::to_string(rotary_dim));
  const std::uint32_t n_kv = 3;
  OwnedCache<T> ref({{41, 3}, {0, 50}, {7, 1}, {1000, 1}}, paged, page, n_kv, dim, rng);
  OwnedCache<T> fast(ref);
  const std::uint32_t rows = ref.total_rows();
  const std::size_t row = std::size_t{n_kv} * dim;
  auto k_new = test::random_floats(rows * row, -1, 1, rng);
  const auto v_new = test::random_floats(rows * row, -1, 1, rng);
  StoreOptions opt;
  opt.rope_k = {true, 500000.0f, rotary_dim};
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
  EXPECT_THROW(apply_rope_reference(std::span(y), 2, 6, 0, rope), InvalidArgument);
}

}  // namespace
}  // namespace kvcache
