// store_kv byte for byte against store_kv_reference on the inputs that take
// the non-default paths: calls large enough to use non-temporal stores, and
// special values (NaN, infinities, signed zeros, subnormals, rounding ties)
// that the bf16 vector converter hands to the exact scalar one (NaN) or must
// round like it (everything else), on every compiled SIMD target.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kernel_test_util.h"
#include "kernels/cpu/kernel_common.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/isa.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/thread_pool.h"

namespace kvcache {
namespace {

using test::Entry;
using test::OwnedCache;

// Random values in [-1, 1], with every 7th element replaced by one of the
// special patterns (all of them appear in every 64-element vector pair).
std::vector<float> special_floats(std::size_t n, std::mt19937& rng) {
  const float specials[] = {
      std::numeric_limits<float>::quiet_NaN(),
      -std::numeric_limits<float>::quiet_NaN(),
      std::numeric_limits<float>::signaling_NaN(),
      std::bit_cast<float>(0x7f800001u),  // NaN whose payload is all in the low half
      std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(),
      0.0f,
      -0.0f,
      std::numeric_limits<float>::denorm_min(),
      -std::bit_cast<float>(0x007fffffu),  // largest subnormal, negative
      std::numeric_limits<float>::max(),   // rounds to infinity in bf16 and f16
      std::bit_cast<float>(0x3f808000u),   // bf16 tie, even neighbour below
      std::bit_cast<float>(0x3f818000u),   // bf16 tie, odd: rounds up
      std::bit_cast<float>(0x7f7f8000u),   // bf16 tie that overflows to infinity
      65520.0f,                            // f16 overflow threshold
      5.9604645e-08f,                      // f16 smallest subnormal
  };
  auto v = test::random_floats(n, -1, 1, rng);
  std::size_t s = 0;
  for (std::size_t i = 0; i < n; i += 7) v[i] = specials[s++ % std::size(specials)];
  return v;
}

template <CacheElement T>
void check_store(const std::vector<Entry>& entries, std::uint32_t n_kv, std::uint32_t dim,
                 std::uint32_t page, std::size_t threads, bool special, std::mt19937& rng,
                 StorePrefetch prefetch = StorePrefetch::automatic,
                 PageLayout layout = PageLayout::nhd,
                 PoolArrangement arrangement = PoolArrangement::interleaved) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of_v<T>)) + " threads " + std::to_string(threads) +
               (special ? " special values" : " random values"));
  OwnedCache<T> ref(entries, true, page, n_kv, dim, rng, layout, arrangement);
  OwnedCache<T> fast(ref);
  const std::size_t n = std::size_t{ref.total_rows()} * n_kv * dim;
  const auto k_new = special ? special_floats(n, rng) : test::random_floats(n, -1, 1, rng);
  const auto v_new = special ? special_floats(n, rng) : test::random_floats(n, -1, 1, rng);
  const auto L = OwnedCache<T>::kLayer;
  ThreadPool pool(threads);
  test::with_collection(ref, [&](const auto& col) {
    store_kv_reference(col.get_key_cache(L), col.get_value_cache(L), std::span(k_new),
                       std::span(v_new), std::span<const std::uint32_t>(ref.row_offsets));
  });
  test::with_collection(fast, [&](const auto& col) {
    store_kv(col.get_key_cache(L), col.get_value_cache(L), std::span(k_new), std::span(v_new),
             std::span<const std::uint32_t>(fast.row_offsets), {.prefetch = prefetch}, &pool);
  });
  ASSERT_EQ(0, std::memcmp(ref.blocks.data(), fast.blocks.data(), ref.blocks.size() * sizeof(T)))
      << "store_kv differs from store_kv_reference";
}

template <class F>
void for_dtypes(F&& f) {
  f(float{});
  f(Half{});
  f(BFloat16{});
}

// 2,200 rows of 8 x 128 elements: K + V is 9 MB in bf16 / f16 and 18 MB in
// f32, above kStoreStreamingBytes, so these calls take the streaming path
// (the test cache is 64-byte aligned like the managers' arenas).
TEST(StoreKv, LargeCallsStreamAndMatchReference) {
  std::mt19937 rng(5);
  const std::vector<Entry> entries{{0, 1500}, {37, 700}};
  static_assert(2 * std::size_t{2200} * 8 * 128 * 2 >= kStoreStreamingBytes);
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    check_store<T>(entries, 8, 128, 16, 2, false, rng);
    check_store<T>(entries, 8, 128, 16, 1, true, rng);
  });
}

// Every input-prefetch choice writes the same bytes, in small (cached) and
// large (streaming) calls.
TEST(StoreKv, EveryPrefetchChoiceMatchesReference) {
  std::mt19937 rng(12);
  for (const StorePrefetch pf :
       {StorePrefetch::automatic, StorePrefetch::next_row_l1, StorePrefetch::none}) {
    SCOPED_TRACE("prefetch " + std::to_string(static_cast<int>(pf)));
    StoreOptions opt;
    opt.prefetch = pf;
    StoreOptions with_rope = opt;
    with_rope.rope_k.enabled = true;
    for (const DType dt : {DType::f32, DType::f16, DType::bf16}) {
      const StorePrefetch plain = resolve_store_prefetch(opt, dt);
      EXPECT_NE(plain, StorePrefetch::automatic);
      if (pf != StorePrefetch::automatic) {
        EXPECT_EQ(plain, pf);
        EXPECT_EQ(resolve_store_prefetch(with_rope, dt), pf);  // an explicit choice stands
      } else {
        EXPECT_EQ(resolve_store_prefetch(with_rope, dt), StorePrefetch::next_row_l1);
        // Without RoPE only f32 on AMD processors without AVX-512 goes without.
        const bool zen3_f32 =
            dt == DType::f32 && kernels::running_on_amd() && !kernels::cpu_has_avx512();
        EXPECT_EQ(plain, zen3_f32 ? StorePrefetch::none : StorePrefetch::next_row_l1);
      }
    }
    for_dtypes([&](auto tag) {
      using T = decltype(tag);
      check_store<T>({{5, 33}, {0, 1}, {17, 2}}, 3, 72, 7, 2, true, rng, pf);
      check_store<T>({{0, 1500}, {37, 700}}, 8, 128, 16, 2, false, rng, pf);
    });
  }
}

// HND pages: the per-head runs, cached and streaming (9 MB), odd shapes.
TEST(StoreKv, HndLayoutMatchesReference) {
  std::mt19937 rng(13);
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    check_store<T>({{5, 33}, {0, 1}, {17, 2}}, 3, 72, 7, 2, true, rng, StorePrefetch::automatic,
                   PageLayout::hnd);
    check_store<T>({{0, 1500}, {37, 700}}, 8, 128, 16, 2, false, rng, StorePrefetch::none,
                   PageLayout::hnd);
    check_store<T>({{3, 1300}, {0, 900}}, 9, 100, 16, 1, true, rng, StorePrefetch::next_row_l1,
                   PageLayout::hnd);
  });
}

// PoolArrangement::per_layer: both layouts, cached and streaming stores.
TEST(StoreKv, PerLayerArrangementMatchesReference) {
  std::mt19937 rng(41);
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    for (const PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
      check_store<T>({{5, 33}, {0, 1}, {17, 2}}, 3, 72, 7, 2, true, rng, StorePrefetch::automatic,
                     layout, PoolArrangement::per_layer);
      check_store<T>({{0, 1500}, {37, 700}}, 8, 128, 16, 2, false, rng, StorePrefetch::none, layout,
                     PoolArrangement::per_layer);
    }
  });
}

// Misaligned rows (a head_dim whose rows are not a multiple of 64 bytes)
// must fall back to ordinary stores even in a large call.
TEST(StoreKv, LargeCallWithUnalignedRowsMatchesReference) {
  std::mt19937 rng(6);
  const std::vector<Entry> entries{{3, 1300}, {0, 900}};
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    check_store<T>(entries, 9, 100, 16, 2, true, rng);
  });
}

TEST(StoreKv, SpecialValuesOnEveryCompiledSimdTarget) {
  std::mt19937 rng(8);
  for (const std::string& isa : available_isas()) {
    SCOPED_TRACE(isa);
    select_isa(isa);
    for_dtypes([&](auto tag) {
      using T = decltype(tag);
      check_store<T>({{5, 40}, {0, 3}, {70, 1}}, 3, 64, 16, 1, true, rng);
      check_store<T>({{5, 40}, {0, 3}}, 2, 36, 7, 2, true, rng);
    });
  }
  select_isa("auto");
}

}  // namespace
}  // namespace kvcache
