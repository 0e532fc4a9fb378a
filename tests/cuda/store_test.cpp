// cuda::store_kv on its own against the host references, with and without
// RoPE on K (StoreOptions::rope_k).
//
// Without RoPE the whole device pool must equal, byte for byte, the host pool
// after store_kv_reference (both layers, K and V, every page: nothing else
// written), on random data and on special values (NaN payloads, infinities,
// subnormals, f16 overflow and rounding ties).
//
// With RoPE the host reference is apply_rope_reference on each token's K row
// at its position, then store_kv_reference. V must be bit-identical. K is
// bit-identical unless a cos / sin differs: both sides compute angle =
// double(pos) * double(inv_freq) (the same inverse frequencies: the device
// gets the host's rope_inv_freqs; the product is exact below 2^29) and
// cos / sin in double rounded once to float, but the device's double sincos
// (CUDA: <= 2 ulp of double) is not the host's libm (glibc: < 1 ulp), so
// where the exact value lies within ~3 double ulps of a float rounding
// boundary (probability ~2^-28 per value) the two floats are neighbours:
// |dc|, |ds| <= 2^-24 (|cos|, |sin| <= 1). Inputs are in [-1, 1]; y0 =
// fma(x0, c, -(x1 * s)) then moves by <= |x0| 2^-24 + |x1| 2^-24 + one
// rounding of x1 * s (<= 2^-24) + one rounding of y (<= 2^-23, |y| <= 2):
// <= 2^-21 in fp32, likewise y1. Converting to T rounds once more, monotone:
// the stored values differ by at most that plus one ulp of T at the larger
// value. Bound used: |k_cuda - k_ref| <= 2^-20 + 2 ulp_T(|k_ref|). A wrong
// position (angle off by inv_freq >= theta^-1 ~ 1e-6 rad at the lowest
// frequency pair, 1 rad at pair 0) or a wrong pair moves values by far more
// than that at some element of every row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kvcache/kernels/rope.h"
#include "kvcache/kernels/rope_table.h"
#include "test_util.h"

namespace kvcache::cuda::test {
namespace {

// Spacing of T's values at |x| (normal or subnormal).
template <CacheElement T>
float ulp_of(float x) {
  x = std::fabs(x);
  int e = 0;
  std::frexp(x, &e);  // x = m 2^e, m in [0.5, 1)
  if constexpr (std::is_same_v<T, float>) {
    return std::ldexp(1.0f, std::max(e, -125) - 24);
  } else if constexpr (std::is_same_v<T, Half>) {
    return std::ldexp(1.0f, std::max(e, -13) - 11);
  } else {
    return std::ldexp(1.0f, std::max(e, -125) - 8);
  }
}

template <CacheElement T>
void store(Mirrored<T>& m, const StoreOptions& options = {}) {
  cuda::store_kv(m.key(), m.value(), std::span<const float>(m.k_new_d.span()),
                 std::span<const float>(m.v_new_d.span()),
                 std::span<const std::uint32_t>(m.offsets_d.span()), options);
}

// store_kv_reference into the host pool, K rotated first when `rope`.
template <CacheElement T>
void reference_store(Mirrored<T>& m, const Case& c, const RopeOptions* rope) {
  std::vector<float> k = m.k_new;
  const std::size_t row = std::size_t{c.n_kv} * c.dim;
  const auto& offsets = m.host.row_offsets;
  if (rope != nullptr) {
    for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
      for (std::uint32_t r = offsets[b]; r < offsets[b + 1]; ++r) {
        apply_rope_reference(std::span<float>(k).subspan(std::size_t{r} * row, row), c.n_kv, c.dim,
                             m.host.cache_lengths[b] + (r - offsets[b]), *rope);
      }
    }
  }
  kvcache::test::with_collection(m.host, [&](const auto& col) {
    store_kv_reference(col.get_key_cache(OwnedCache<T>::kLayer),
                       col.get_value_cache(OwnedCache<T>::kLayer), std::span<const float>(k),
                       std::span<const float>(m.v_new), std::span<const std::uint32_t>(offsets));
  });
}

template <CacheElement T>
void check_plain(const Case& c, std::uint32_t seed) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of_v<T>)) + " " + c.name());
  std::mt19937 rng(seed);
  Mirrored<T> m(c, rng);
  store(m);
  synchronize();
  reference_store(m, c, nullptr);
  EXPECT_TRUE(m.pools_equal()) << "store_kv differs from store_kv_reference";
}

// V (and every byte outside the new K rows) bit-identical; K within the bound.
template <CacheElement T>
void check_rope(const Case& c, const RopeOptions& rope, std::uint32_t seed) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of_v<T>)) + " " + c.name() + " rope theta " +
               std::to_string(rope.theta) + " rotary_dim " + std::to_string(rope.rotary_dim));
  std::mt19937 rng(seed);
  Mirrored<T> m(c, rng);
  store(m, StoreOptions{rope});
  synchronize();
  reference_store(m, c, &rope);
  const std::vector<T> got = m.pool.to_host();
  const auto& want = m.host.blocks;
  ASSERT_EQ(got.size(), want.size());
  // Pool layout [block][K, V][layer][page_size][heads][dim].
  const std::size_t layer_elems = std::size_t{m.host.desc.page_size} * c.n_kv * c.dim;
  const std::size_t kv_elems = layer_elems * m.host.desc.num_layers;
  std::size_t k_diffs = 0, failures = 0;
  for (std::size_t i = 0; i < got.size() && failures < 5; ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) == 0) continue;
    const bool is_v = (i / kv_elems) % 2 == 1;
    const float g = to_float(got[i]), w = to_float(want[i]);
    const float bound = std::ldexp(1.0f, -20) + 2 * ulp_of<T>(w);
    if (is_v || !(std::fabs(g - w) <= bound)) {
      ADD_FAILURE() << (is_v ? "V" : "K") << " element " << i << " is " << g << ", reference " << w
                    << (is_v ? " (V must be bit-identical)" : " (bound ") << bound << ")";
      ++failures;
    }
    ++k_diffs;
  }
  if (k_diffs != 0 && failures == 0) {
    std::printf("  [rope] %zu K elements within the bound but not bit-identical\n", k_diffs);
  }
}

template <class F>
void for_each_dtype(F&& f) {
  f(float{});
  f(Half{});
  f(BFloat16{});
}

// History, fresh prefill, chunked prefill, decodes, and an entry with no new
// tokens (its neighbours' rows must not be attributed to it).
std::vector<Entry> ragged() { return {{1531, 1}, {0, 37}, {61, 7}, {5, 0}, {3, 1}, {33, 2}}; }

TEST(CudaStore, HeadDimsLayoutsAndCaches) {
  for (std::uint32_t dim : {128u, 64u, 256u, 80u, 72u, 40u, 33u, 6u}) {
    for (PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
      for_each_dtype([&](auto tag) {
        using T = decltype(tag);
        check_plain<T>({ragged(), true, 16, 2, 1, dim, layout}, 1000 + dim);
        check_plain<T>({ragged(), false, 0, 3, 1, dim, layout}, 2000 + dim);
      });
    }
  }
}

TEST(CudaStore, PagesHeadsAndSmallRows) {
  // Pages of 1 and 128 tokens; 1 and 8 KV heads; rows of fewer than 32
  // units (several tokens per warp: 1 head x 8 or 16 elements).
  for_each_dtype([&](auto tag) {
    using T = decltype(tag);
    check_plain<T>({ragged(), true, 1, 8, 1, 128, PageLayout::hnd}, 3000);
    check_plain<T>({ragged(), true, 128, 1, 1, 64}, 3001);
    check_plain<T>({ragged(), true, 16, 1, 1, 8}, 3002);
    check_plain<T>({ragged(), true, 16, 1, 1, 16, PageLayout::hnd}, 3003);
  });
}

TEST(CudaStore, ManyEntriesManyTokensPerWarp) {
  // ~9.6k tokens over 300 entries (some with no new tokens): more tokens
  // than the grid has warps on any current GPU, so warps walk runs of
  // tokens across entry boundaries.
  std::vector<Entry> entries;
  for (std::uint32_t b = 0; b < 300; ++b) entries.push_back({(b * 37) % 97, (b * 13) % 61});
  check_plain<BFloat16>({entries, true, 16, 2, 1, 128}, 4000);
  check_plain<Half>({entries, true, 16, 2, 1, 128, PageLayout::hnd}, 4001);
}

TEST(CudaStore, SpecialValuesRoundLikeTheReference) {
  const float nan_payload = [] {
    const std::uint32_t bits = 0x7fa01234u;  // signalling NaN with a payload
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }();
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            nan_payload,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -1e-40f,
                            1e-8f,          // an f16 subnormal
                            2.9802322e-8f,  // 2^-25: f16 subnormal tie
                            5.9604645e-8f,  // 2^-24: smallest f16 subnormal
                            6.1035156e-5f,  // smallest f16 normal
                            65504.0f,
                            65519.996f,
                            65520.0f,  // rounds to f16 infinity
                            -70000.0f,
                            3.4028235e38f,
                            1.0009766f,   // 1 + 2^-10: f16 exact
                            1.00048828f,  // 1 + 2^-11: f16 tie to even
                            1.00390625f,  // 1 + 2^-8: bf16 tie to even
                            1.01171875f,  // 1 + 3 * 2^-8: bf16 tie to even (up)
                            0.0f,
                            -0.0f};
  for_each_dtype([&](auto tag) {
    using T = decltype(tag);
    for (std::uint32_t dim : {128u, 36u, 33u}) {
      const Case c{ragged(), true, 16, 2, 1, dim};
      SCOPED_TRACE(std::string(dtype_name(dtype_of_v<T>)) + " special values dim " +
                   std::to_string(dim));
      std::mt19937 rng(5000 + dim);
      Mirrored<T> m(c, rng);
      for (std::size_t i = 0; i < m.k_new.size(); i += 3) {
        m.k_new[i] = specials[(i / 3) % std::size(specials)];
        m.v_new[i] = specials[(i / 3 + 7) % std::size(specials)];
      }
      m.k_new_d.upload(m.k_new);
      m.v_new_d.upload(m.v_new);
      store(m);
      synchronize();
      reference_store(m, c, nullptr);
      EXPECT_TRUE(m.pools_equal()) << "store_kv differs from store_kv_reference";
    }
  });
}

TEST(CudaStore, StreamOverloadWithoutOptions) {
  std::mt19937 rng(5500);
  const Case c{ragged(), true, 16, 2, 1, 64};
  Mirrored<BFloat16> m(c, rng);
  cuda::store_kv(m.key(), m.value(), std::span<const float>(m.k_new_d.span()),
                 std::span<const float>(m.v_new_d.span()),
                 std::span<const std::uint32_t>(m.offsets_d.span()),
                 static_cast<CUstream_st*>(nullptr));
  synchronize();
  reference_store(m, c, nullptr);
  EXPECT_TRUE(m.pools_equal());
}

RopeOptions rope(float theta, std::uint32_t rotary_dim) {
  RopeOptions r;
  r.enabled = true;
  r.theta = theta;
  r.rotary_dim = rotary_dim;
  return r;
}

TEST(CudaStore, RopeFullAndPartial) {
  struct Shape {
    std::uint32_t dim, rotary_dim, n_kv;
    PageLayout layout;
  };
  // rotary_dim 0 = head_dim. Units of 8 (128 / 64 / 32 rotary), 4 (80: half
  // 20; 72: half 36) and 1 (odd head dim; rotary 6: half 3); 1 KV head x 32
  // elements puts several tokens in a warp (one cos / sin table each).
  const Shape shapes[] = {
      {128, 0, 2, PageLayout::nhd}, {128, 64, 2, PageLayout::hnd}, {64, 32, 3, PageLayout::nhd},
      {80, 40, 2, PageLayout::hnd}, {72, 0, 2, PageLayout::nhd},   {33, 32, 2, PageLayout::nhd},
      {64, 6, 2, PageLayout::hnd},  {32, 0, 1, PageLayout::nhd},   {256, 0, 1, PageLayout::hnd}};
  std::uint32_t seed = 6000;
  for (const Shape& s : shapes) {
    for (float theta : {10000.0f, 500000.0f}) {
      for_each_dtype([&](auto tag) {
        using T = decltype(tag);
        check_rope<T>({ragged(), true, 16, s.n_kv, 1, s.dim, s.layout}, rope(theta, s.rotary_dim),
                      ++seed);
      });
    }
  }
  // Continuous caches, another theta.
  for_each_dtype([&](auto tag) {
    using T = decltype(tag);
    check_rope<T>({ragged(), false, 0, 2, 1, 128}, rope(1e6f, 0), ++seed);
    check_rope<T>({ragged(), false, 0, 2, 1, 96, PageLayout::hnd}, rope(100.0f, 48), ++seed);
  });
}

TEST(CudaStore, RopeAtFarPositions) {
  // Histories pushed back by 8,192 and 65,536 pages of 16: positions from
  // ~131k and ~1.05M (argument reduction of large angles: pair 0's angle is
  // the position in radians).
  for (std::uint32_t far : {8192u, 65536u}) {
    for_each_dtype([&](auto tag) {
      using T = decltype(tag);
      Case c{ragged(), true, 16, 2, 1, 128};
      c.far_pages = far;
      check_rope<T>(c, rope(10000.0f, 0), 7000 + far);
      c.layout = PageLayout::hnd;
      check_rope<T>(c, rope(1e6f, 64), 7100 + far);
    });
  }
}

TEST(CudaStore, RopeIsAppliedBeforeAttention) {
  // The fused store then attention: outputs from the rotated cache match the
  // references (kernels_test.cpp's bound), so attention sees the rotated K.
  // At most 4 new rows per entry: the decode kernel, whose bound is the f32
  // one (with more rows a bf16 cache takes the prefill kernel, which rounds
  // q and P to bf16: prefill_test.cpp; seen failing this bound on an H200).
  std::mt19937 rng(7500);
  const Case c{{{300, 1}, {0, 4}, {40, 3}}, true, 16, 2, 2, 128};
  Mirrored<BFloat16> m(c, rng);
  ASSERT_EQ(std::string(attention_kernel_name(m.key(), m.value())), "decode");
  const RopeOptions r = rope(10000.0f, 0);
  store(m, StoreOptions{r});
  m.attend_on_device();
  synchronize();
  reference_store(m, c, &r);
  std::vector<float> ref(m.q.size());
  kvcache::test::with_collection(m.host, [&](const auto& col) {
    attention_reference(col.get_key_cache(OwnedCache<BFloat16>::kLayer),
                        col.get_value_cache(OwnedCache<BFloat16>::kLayer),
                        std::span<const float>(m.q), m.n_q,
                        std::span<const std::uint32_t>(m.host.row_offsets), std::span<float>(ref));
  });
  expect_close(m.out_d.to_host(), ref, 2e-5f, 2e-5f, "attention after a rotated store");
}

struct BadStoreOptions : ::testing::Test {
  std::mt19937 rng{43};
  Mirrored<Half> m{Case{{{40, 1}, {0, 5}}, true, 16, 2, 1, 64}, rng};
  std::vector<Half> pool_before = m.pool.to_host();

  void expect_throws(const StoreOptions& o, const char* a, const char* b) {
    KV_EXPECT_THROW(store(m, o), InvalidArgument, a, b);
  }
  void expect_untouched() {
    synchronize();
    const std::vector<Half> pool = m.pool.to_host();
    EXPECT_EQ(std::memcmp(pool.data(), pool_before.data(), pool.size() * sizeof(Half)), 0)
        << "pool written by a call that threw";
  }
};

TEST_F(BadStoreOptions, RotaryDimAndTheta) {
  expect_throws(StoreOptions{rope(10000.0f, 63)}, "rope rotary_dim 63", "even");
  expect_throws(StoreOptions{rope(10000.0f, 66)}, "rope rotary_dim 66", "head_dim 64");
  expect_throws(StoreOptions{rope(0.0f, 0)}, "rope theta", "positive");
  expect_throws(StoreOptions{rope(-1.0f, 32)}, "rope theta", "positive");
  expect_throws(StoreOptions{rope(std::numeric_limits<float>::quiet_NaN(), 32)}, "rope theta",
                "positive");
  expect_untouched();
}

TEST_F(BadStoreOptions, RopeTableAndPrefetch) {
  const RopeOptions r = rope(10000.0f, 0);
  const RopeTable table(r, 64, 128);
  StoreOptions o{r};
  o.rope_table = &table;
  expect_throws(o, "rope_table", "nullptr");
  o = StoreOptions{};
  o.rope_table = &table;  // also without RoPE
  expect_throws(o, "rope_table", "nullptr");
  o = StoreOptions{};
  o.prefetch = static_cast<StorePrefetch>(7);
  expect_throws(o, "prefetch value 7", "automatic");
  expect_untouched();
}

TEST_F(BadStoreOptions, RejectedEvenWithNothingToStore) {
  // Validation comes first, as on the CPU: an empty call still rejects bad options.
  KV_EXPECT_THROW(
      cuda::store_kv(m.key(), m.value(), std::span<const float>(), std::span<const float>(),
                     std::span<const std::uint32_t>(m.offsets_d.span()),
                     StoreOptions{rope(10000.0f, 63)}),
      InvalidArgument, "rope rotary_dim 63");
  expect_untouched();
}

}  // namespace
}  // namespace kvcache::cuda::test
