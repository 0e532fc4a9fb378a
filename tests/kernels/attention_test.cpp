// Fast attention / store_kv against the scalar references on random data.
//
// Error bound (attention): |fast - reference| <= kAbsTol + kRelTol * |reference|
// per element, kAbsTol = kRelTol = 2e-6. Outputs are convex combinations of V
// values in [-1, 1]; the fast kernel sums the head_dim products and the
// softmax in a different order (SIMD lanes, tiles, split merges) and uses a
// polynomial exp within 1 ulp, so each output differs from the reference by
// a few tens of fp32 ulps of 1.0 (2^-23 ~ 1.2e-7): 2e-6 is ~17 ulps.
// store_kv must be bit-identical to store_kv_reference (same rounding).
// With AttentionPrecision::bf16 on a bf16 cache the kernel and the reference
// round each probability to bf16 against different maxima (the kernel's
// running one, the reference's final one), each within 2^-9 relative, so the
// bound gains 2^-8 times the largest |V| element (V in [-1, 1] here): the
// random cases check the bf16 paths compute attention at all; the crafted
// cases (Bf16Precision*) check the rounding itself within the fp32 bound.
#include "kvcache/kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/kernel_common.h"
#include "kvcache/error.h"
#include "kvcache/kernels/isa.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/thread_pool.h"

namespace kvcache {
namespace {

using test::Entry;
using test::OwnedCache;

constexpr float kAbsTol = 2e-6f;
constexpr float kRelTol = 2e-6f;
// AttentionPrecision::bf16: two independent bf16 roundings of a probability
// (2^-9 relative each) times max |V| = 1 (see the top of the file).
constexpr float kBf16ProbabilityTol = 1.0f / 256;

struct Case {
  std::vector<Entry> entries;
  bool paged = true;
  std::uint32_t page = 16;
  std::uint32_t n_kv = 2;
  std::uint32_t group = 1;
  std::uint32_t dim = 64;
  std::size_t threads = 1;
  std::string isa = "auto";  // instruction set the fast kernels run (select_isa)
  AttentionPrefetch prefetch = AttentionPrefetch::automatic;
  PageLayout layout = PageLayout::nhd;
  AttentionPrecision precision = AttentionPrecision::fp32;
  PoolArrangement arrangement = PoolArrangement::interleaved;
  std::string name() const {
    return std::string(paged ? "paged" : "continuous") + " page " + std::to_string(page) + " kv " +
           std::to_string(n_kv) + " group " + std::to_string(group) + " dim " +
           std::to_string(dim) + " threads " + std::to_string(threads) + " " +
           std::string(layout_name(layout)) + " " + std::string(arrangement_name(arrangement));
  }
};

// A mixed batch: a long decode (forces context splits with 2 threads), a
// fresh prefill, a chunked prefill over history, short decodes.
std::vector<Entry> mixed_batch() { return {{1500, 1}, {0, 19}, {61, 7}, {3, 1}, {33, 2}}; }

// Stores k_new / v_new into `ref` and `fast` (identical caches) and attends
// q there, by the references in `ref` and by the fast kernels (on `isa`, with
// `threads`) in `fast`; checks that the stores agree bit for bit and every
// output element within the bound above. Returns the reference's output.
template <CacheElement T>
std::vector<float> check_against_reference(const OwnedCache<T>& ref, const OwnedCache<T>& fast,
                                           const std::vector<float>& k_new,
                                           const std::vector<float>& v_new,
                                           const std::vector<float>& q, std::uint32_t n_q,
                                           AttentionOptions options, std::size_t threads,
                                           const std::string& isa = "auto",
                                           float extra_abs = 0.0f) {
  std::vector<float> out_ref(q.size(), 0.0f), out_fast(q.size(), -7.0f);
  ThreadPool pool(threads);
  const auto L = OwnedCache<T>::kLayer;
  test::with_collection(ref, [&](const auto& col) {
    store_kv_reference(col.get_key_cache(L), col.get_value_cache(L), std::span(k_new),
                       std::span(v_new), std::span<const std::uint32_t>(ref.row_offsets));
    attention_reference(col.get_key_cache(L), col.get_value_cache(L), std::span(q), n_q,
                        std::span<const std::uint32_t>(ref.row_offsets), std::span(out_ref),
                        options);
  });
  test::with_collection(fast, [&](const auto& col) {
    select_isa(isa);
    store_kv(col.get_key_cache(L), col.get_value_cache(L), std::span(k_new), std::span(v_new),
             std::span<const std::uint32_t>(fast.row_offsets), {}, &pool);
    attention(col.get_key_cache(L), col.get_value_cache(L), std::span(q), n_q,
              std::span<const std::uint32_t>(fast.row_offsets), std::span(out_fast), options,
              &pool);
    select_isa("auto");
  });
  EXPECT_EQ(0, std::memcmp(ref.blocks.data(), fast.blocks.data(), ref.blocks.size() * sizeof(T)))
      << "store_kv differs from store_kv_reference";
  float worst = 0.0f;
  for (std::size_t i = 0; i < out_ref.size(); ++i) {
    const float err = std::fabs(out_fast[i] - out_ref[i]);
    const float bound = kAbsTol + extra_abs + kRelTol * std::fabs(out_ref[i]);
    worst = std::max(worst, err / bound);
    EXPECT_LE(err, bound) << "element " << i << " fast " << out_fast[i] << " reference "
                          << out_ref[i];
    if (err > bound) break;
  }
  EXPECT_LE(worst, 1.0f);
  return out_ref;
}

template <CacheElement T>
void check_case(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(c.name() + " dtype " + std::string(dtype_name(dtype_of_v<T>)));
  OwnedCache<T> ref(c.entries, c.paged, c.page, c.n_kv, c.dim, rng, c.layout, c.arrangement);
  OwnedCache<T> fast(ref);
  const std::uint32_t rows = ref.total_rows();
  const std::uint32_t n_q = c.n_kv * c.group;
  const auto k_new = test::random_floats(std::size_t{rows} * c.n_kv * c.dim, -1, 1, rng);
  const auto v_new = test::random_floats(std::size_t{rows} * c.n_kv * c.dim, -1, 1, rng);
  const auto q = test::random_floats(std::size_t{rows} * n_q * c.dim, -2, 2, rng);
  const bool bf16_inputs = c.precision == AttentionPrecision::bf16 && std::is_same_v<T, BFloat16>;
  check_against_reference(ref, fast, k_new, v_new, q, n_q,
                          {.prefetch = c.prefetch, .precision = c.precision}, c.threads, c.isa,
                          bf16_inputs ? kBf16ProbabilityTol : 0.0f);
}

template <class F>
void for_dtypes(F&& f) {
  f(float{});
  f(Half{});
  f(BFloat16{});
}

TEST(AttentionFast, AllDtypesHeadDimsAndGqaRatios) {
  std::mt19937 rng(1234);
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    for (std::uint32_t dim : {64u, 80u, 96u, 128u, 256u}) {
      for (std::uint32_t group : {1u, 2u, 4u, 8u}) {
        Case c{mixed_batch(), true, 16, 2, group, dim, 2};
        check_case<T>(c, rng);
      }
    }
  });
}

// One query per KV head (MHA decode): heads are scored row by row and their
// V rows accumulated two heads at a time, with a single-head path for an odd
// last head and for head dims that are not whole chunks. Odd head counts,
// every dtype, both strategies, decodes only (one query row per entry) and
// the mixed batch.
TEST(AttentionFast, MhaDecodeHeadPairsAndOddHeadCounts) {
  std::mt19937 rng(5150);
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    for (std::uint32_t n_kv : {1u, 3u, 5u, 8u}) {
      for (std::uint32_t dim : {64u, 80u, 96u, 128u}) {
        for (bool paged : {true, false}) {
          Case c{{{300, 1}, {17, 1}, {1, 1}, {129, 1}}, paged, 16, n_kv, 1, dim, 1};
          check_case<T>(c, rng);
        }
        Case mixed{mixed_batch(), true, 7, n_kv, 1, dim, 2};
        check_case<T>(mixed, rng);
      }
    }
  });
}

TEST(AttentionFast, PageSizesStrategiesAndThreads) {
  std::mt19937 rng(99);
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    for (bool paged : {true, false}) {
      for (std::uint32_t page : {1u, 16u, 128u}) {
        if (!paged && page != 16) continue;  // continuous has one block per entry
        for (std::size_t threads : {1u, 2u}) {
          Case c{{{700, 1}, {0, 37}, {129, 3}, {15, 1}, {255, 2}}, paged, page, 3, 2, 80, threads};
          check_case<T>(c, rng);
        }
      }
    }
  });
}

// Head dims that are not multiples of any vector width (row padding in the
// kernel's scratch), pages that do not divide the kernel's tile, GQA decode.
// The last partial chunk of a row is read with masked loads on AVX-512: 57
// (odd) and 120 leave more than one vector's worth in it (the second masked
// load), 8 is nothing but a partial chunk.
TEST(AttentionFast, OddHeadDimsAndPagesWithGqa) {
  std::mt19937 rng(4242);
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    for (std::uint32_t dim : {8u, 36u, 57u, 72u, 100u, 120u}) {
      for (std::uint32_t page : {1u, 7u, 48u, 512u}) {
        Case c{{{600, 1}, {33, 4}, {0, 5}, {77, 2}}, true, page, 2, 4, dim, 2};
        check_case<T>(c, rng);
      }
    }
  });
}

// Every Highway target compiled in and supported here (AVX-512, AVX2, SSE4,
// emulated 128-bit, scalar) runs the same attention and store_kv code with its
// own vector width; check each against the reference, not just the best one
// (store_kv byte for byte: f16 must round exactly on every target).
TEST(AttentionFast, EveryCompiledSimdTarget) {
  std::mt19937 rng(31);
  const std::vector<std::string> isas = available_isas();
  ASSERT_GE(isas.size(), 1u);
  for (const std::string& isa : isas) {
    SCOPED_TRACE(isa);
    for_dtypes([&](auto tag) {
      using T = decltype(tag);
      // 64: whole chunks of every target's width (the register-held query
      // of the head-major score rows runs on AVX2 and AVX-512).
      for (std::uint32_t dim : {36u, 64u, 128u}) {
        Case c{{{300, 1}, {33, 3}, {0, 6}}, true, 7, 2, 4, dim, 2};
        c.isa = isa;
        check_case<T>(c, rng);
        // HND (the head-major loops) with one and two query vectors per head.
        Case h{{{300, 1}, {70, 2}, {0, 6}}, true, 7, 2, 1, dim, 2};
        h.isa = isa;
        h.layout = PageLayout::hnd;
        check_case<T>(h, rng);
      }
    });
  }
}

// PoolArrangement::per_layer (each layer's K and V an array of pages of its
// own): the same kernels on other strides, every dtype, both layouts, paged
// and continuous, GQA 1 and 4, 1 and 2 threads, a mixed batch.
TEST(AttentionFast, PerLayerArrangementMatchesReference) {
  std::mt19937 rng(4040);
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    for (bool paged : {true, false}) {
      for (const PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
        for (std::uint32_t group : {1u, 4u}) {
          for (std::size_t threads : {1u, 2u}) {
            Case c{mixed_batch(), paged, 16, 2, group, 64, threads};
            c.layout = layout;
            c.arrangement = PoolArrangement::per_layer;
            check_case<T>(c, rng);
          }
        }
      }
    }
  });
}

// AttentionPrecision::bf16 on random data: the pair-product paths where the
// processor has AVX512-BF16 (items with 2 or more query vectors per KV head
// whose rows are not pumped: prefetch `none` here, or `automatic` where the
// probe finds them cached; head dims of whole 32-element chunks: 64, 96,
// 128, 256) and the f32 loops on rounded values elsewhere (80, other
// targets, one query vector per KV head, pumped items), GQA 1-8 (3: single
// query vectors by pair products), both layouts, paged and continuous, page sizes 1, 16
// and 128, 1 and 2 threads, decode, prefill and mixed batches; f32 and f16
// caches ignore the option (the plain fp32 bound).
TEST(AttentionFast, Bf16PrecisionAgainstReference) {
  std::mt19937 rng(2026);
  for (std::uint32_t dim : {64u, 80u, 96u, 128u, 256u}) {
    for (std::uint32_t group : {1u, 2u, 3u, 4u, 8u}) {
      for (const PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
        for (const AttentionPrefetch pf : {AttentionPrefetch::automatic, AttentionPrefetch::none}) {
          Case c{mixed_batch(), true, 16, 2, group, dim, 2};
          c.layout = layout;
          c.prefetch = pf;
          c.precision = AttentionPrecision::bf16;
          check_case<BFloat16>(c, rng);
        }
      }
    }
  }
  for (bool paged : {true, false}) {
    for (std::uint32_t page : {1u, 16u, 128u}) {
      if (!paged && page != 16) continue;
      for (std::size_t threads : {1u, 2u}) {
        Case c{{{700, 1}, {0, 37}, {129, 3}, {15, 1}, {255, 2}}, paged, page, 3, 4, 128, threads};
        c.prefetch = AttentionPrefetch::none;
        c.precision = AttentionPrecision::bf16;
        check_case<BFloat16>(c, rng);
        Case mha{{{701, 1}, {2, 1}, {64, 1}}, paged, page, 3, 1, 64, threads};
        mha.precision = AttentionPrecision::bf16;
        check_case<BFloat16>(mha, rng);
      }
    }
  }
  for (const std::string& isa : available_isas()) {
    SCOPED_TRACE(isa);
    Case c{{{300, 1}, {33, 3}, {0, 6}}, true, 7, 2, 4, 64, 2};
    c.isa = isa;
    c.prefetch = AttentionPrefetch::none;
    c.precision = AttentionPrecision::bf16;
    check_case<BFloat16>(c, rng);
  }
  for (const AttentionPrefetch pf :
       {AttentionPrefetch::next_step_l1, AttentionPrefetch::next_tile_l1,
        AttentionPrefetch::next_tile_l2, AttentionPrefetch::none}) {
    Case c{{{2000, 1}, {600, 1}}, true, 16, 2, 4, 128, 2};
    c.prefetch = pf;
    c.precision = AttentionPrecision::bf16;
    check_case<BFloat16>(c, rng);
  }
  Case f32{mixed_batch(), true, 16, 2, 4, 64, 2};
  f32.precision = AttentionPrecision::bf16;
  check_case<float>(f32, rng);
  check_case<Half>(f32, rng);
}

// Two tokens with crafted K/V on a bf16 cache, scale 1, one KV head and
// n_q query heads with the same query (n_q 1: the f32 loops on rounded
// values; 2: the pair products where the processor has them, prefetch none
// so that no item is pumped): token 0 in history, token 1 the new one.
// Every input is exact in bf16, so only the option's roundings separate the
// outputs. Returns head 0's output (head 1's must equal it).
struct TwoTokenCase {
  std::vector<float> k0, v0, k1, v1, q;
};

std::vector<float> two_token_attention(const TwoTokenCase& t, std::uint32_t dim, std::uint32_t n_q,
                                       AttentionPrecision precision, bool fast,
                                       const std::string& isa) {
  std::mt19937 rng(5);
  OwnedCache<BFloat16> cache({{1, 1}}, true, 16, 1, dim, rng);
  std::vector<float> q;
  for (std::uint32_t h = 0; h < n_q; ++h) q.insert(q.end(), t.q.begin(), t.q.end());
  std::vector<float> out(std::size_t{n_q} * dim, -7.0f);
  const AttentionOptions options{
      .scale = 1.0f, .prefetch = AttentionPrefetch::none, .precision = precision};
  test::with_collection(cache, [&](const auto& col) {
    const auto k = col.get_key_cache(OwnedCache<BFloat16>::kLayer);
    const auto v = col.get_value_cache(OwnedCache<BFloat16>::kLayer);
    for (std::uint32_t d = 0; d < dim; ++d) {
      *k.ptr(0, 0, 0, d) = from_float<BFloat16>(t.k0[d]);
      *v.ptr(0, 0, 0, d) = from_float<BFloat16>(t.v0[d]);
    }
    std::span<const std::uint32_t> ro(cache.row_offsets);
    store_kv_reference(k, v, std::span(t.k1), std::span(t.v1), ro);
    select_isa(isa);
    if (fast) {
      attention(k, v, std::span(q), n_q, ro, std::span(out), options);
    } else {
      attention_reference(k, v, std::span(q), n_q, ro, std::span(out), options);
    }
    select_isa("auto");
  });
  for (std::uint32_t h = 1; h < n_q; ++h) {
    for (std::uint32_t d = 0; d < dim; ++d) EXPECT_EQ(out[std::size_t{h} * dim + d], out[d]) << d;
  }
  out.resize(dim);
  return out;
}

TwoTokenCase unit_case(std::uint32_t dim) {
  TwoTokenCase t;
  for (auto* x : {&t.k0, &t.v0, &t.k1, &t.v1, &t.q}) x->assign(dim, 0.0f);
  t.v0[0] = 1.0f;
  t.v1[1] = 1.0f;
  return t;
}

// The scaled query is rounded before it meets K: q[0] = 1 + 2^-9 rounds to
// 1, so against K rows 64 e_0 and 64 e_1 both scores are 64 and the output
// is (V0 + V1) / 2 exactly; unrounded, token 0 scores 0.125 higher.
TEST(AttentionFast, Bf16PrecisionRoundsTheQuery) {
  for (std::uint32_t dim : {64u, 80u, 128u}) {
    for (const std::string& isa : available_isas()) {
      for (std::uint32_t n_q : {1u, 2u}) {
        SCOPED_TRACE("dim " + std::to_string(dim) + " " + isa + " n_q " + std::to_string(n_q));
        TwoTokenCase t = unit_case(dim);
        t.k0[0] = 64.0f;
        t.k1[1] = 64.0f;
        t.q[0] = 1.0f + 1.0f / 512;
        t.q[1] = 1.0f;
        for (bool fast : {false, true}) {
          const auto out = two_token_attention(t, dim, n_q, AttentionPrecision::bf16, fast, isa);
          EXPECT_NEAR(out[0], 0.5f, kAbsTol) << (fast ? "fast" : "reference");
          EXPECT_NEAR(out[1], 0.5f, kAbsTol) << (fast ? "fast" : "reference");
          const auto exact = two_token_attention(t, dim, n_q, AttentionPrecision::fp32, fast, isa);
          const float p1 = std::exp(-0.125f);
          EXPECT_NEAR(exact[0], 1.0f / (1.0f + p1), kAbsTol) << (fast ? "fast" : "reference");
        }
      }
    }
  }
}

// A probability is rounded before it meets V, and the denominator sums the
// unrounded one: scores 1 and 0 give p = (1, bf16(e^-1)), l = 1 + e^-1.
TEST(AttentionFast, Bf16PrecisionRoundsTheProbabilities) {
  for (std::uint32_t dim : {64u, 80u, 128u}) {
    for (const std::string& isa : available_isas()) {
      for (std::uint32_t n_q : {1u, 2u}) {
        SCOPED_TRACE("dim " + std::to_string(dim) + " " + isa + " n_q " + std::to_string(n_q));
        TwoTokenCase t = unit_case(dim);
        t.k0[0] = 1.0f;
        t.q[0] = 1.0f;
        t.q[1] = 1.0f;
        const float e = std::exp(-1.0f);
        const float e_rounded = bf16_bits_to_f32(f32_to_bf16_bits(e));
        ASSERT_GT(std::fabs(e - e_rounded), 1e-4f);  // the rounding is visible
        for (bool fast : {false, true}) {
          const auto out = two_token_attention(t, dim, n_q, AttentionPrecision::bf16, fast, isa);
          EXPECT_NEAR(out[0], 1.0f / (1.0f + e), kAbsTol) << (fast ? "fast" : "reference");
          EXPECT_NEAR(out[1], e_rounded / (1.0f + e), kAbsTol) << (fast ? "fast" : "reference");
          for (std::uint32_t d = 2; d < dim; ++d) EXPECT_EQ(out[d], 0.0f) << d;
        }
      }
    }
  }
}

TEST(AttentionFast, PrecisionOutsideTheEnumThrows) {
  std::mt19937 rng(3);
  OwnedCache<BFloat16> cache({{5, 1}}, true, 16, 1, 64, rng);
  const auto q = test::random_floats(64, -1, 1, rng);
  std::vector<float> out(64, 3.0f);
  AttentionOptions bad;
  bad.precision = static_cast<AttentionPrecision>(7);
  test::with_collection(cache, [&](const auto& col) {
    const auto k = col.get_key_cache(OwnedCache<BFloat16>::kLayer);
    const auto v = col.get_value_cache(OwnedCache<BFloat16>::kLayer);
    std::span<const std::uint32_t> ro(cache.row_offsets);
    for (bool fast : {false, true}) {
      try {
        if (fast) {
          attention(k, v, std::span(q), 1, ro, std::span(out), bad);
        } else {
          attention_reference(k, v, std::span(q), 1, ro, std::span(out), bad);
        }
        ADD_FAILURE() << "no exception (" << (fast ? "fast" : "reference") << ")";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("precision value 7"), std::string::npos) << e.what();
      }
    }
  });
  for (float x : out) EXPECT_EQ(x, 3.0f);  // nothing written
}

// A NaN or infinite scale turned every output into NaN; now refused by the
// kernel entry (so C and Python get it too) and the reference, writing nothing.
TEST(AttentionFast, ScaleThatIsNotFiniteThrows) {
  std::mt19937 rng(3);
  OwnedCache<float> cache({{5, 1}}, true, 16, 1, 64, rng);
  const auto q = test::random_floats(64, -1, 1, rng);
  std::vector<float> out(64, 3.0f);
  test::with_collection(cache, [&](const auto& col) {
    const auto k = col.get_key_cache(OwnedCache<float>::kLayer);
    const auto v = col.get_value_cache(OwnedCache<float>::kLayer);
    std::span<const std::uint32_t> ro(cache.row_offsets);
    for (const float scale : {std::nanf(""), HUGE_VALF, -HUGE_VALF}) {
      AttentionOptions bad;
      bad.scale = scale;
      for (bool fast : {false, true}) {
        try {
          if (fast) {
            attention(k, v, std::span(q), 1, ro, std::span(out), bad);
          } else {
            attention_reference(k, v, std::span(q), 1, ro, std::span(out), bad);
          }
          ADD_FAILURE() << "scale " << scale << " accepted (" << (fast ? "fast" : "reference")
                        << ")";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("scale is"), std::string::npos) << e.what();
        }
      }
    }
  });
  for (float x : out) EXPECT_EQ(x, 3.0f);  // nothing written
}

// What `automatic` resolves to, per processor and page layout
// (kvcache/kernels/reference.h): next_step_l1 off AMD and for NHD pages on
// AMD processors without AVX-512, otherwise the pump: next_tile_l1 from
// family 1Ah (Zen 5) on, next_tile_l2 before.
TEST(AttentionFast, AutomaticPrefetchFollowsProcessorAndLayout) {
  const bool amd = kernels::running_on_amd();
  const bool avx512 = kernels::cpu_has_avx512();
  const AttentionPrefetch pump = kernels::cpu_family() >= 0x1A ? AttentionPrefetch::next_tile_l1
                                                               : AttentionPrefetch::next_tile_l2;
  const AttentionPrefetch nhd =
      resolve_attention_prefetch(AttentionPrefetch::automatic, PageLayout::nhd);
  const AttentionPrefetch hnd =
      resolve_attention_prefetch(AttentionPrefetch::automatic, PageLayout::hnd);
  if (!amd) {
    EXPECT_EQ(nhd, AttentionPrefetch::next_step_l1);
    EXPECT_EQ(hnd, AttentionPrefetch::next_step_l1);
  } else {
    EXPECT_EQ(nhd, avx512 ? pump : AttentionPrefetch::next_step_l1);
    EXPECT_EQ(hnd, pump);
  }
  // The layout's default is NHD.
  EXPECT_EQ(resolve_attention_prefetch(AttentionPrefetch::automatic), nhd);
  EXPECT_THROW(resolve_attention_prefetch(static_cast<AttentionPrefetch>(5), PageLayout::hnd),
               InvalidArgument);
}

// cpu_family(), which picks the pump's instruction, agrees with the
// compiler's own processor check where that check knows the family (AMD
// 17h: Zen 1/2; 19h: Zen 3/4), and is a real x86-64 family everywhere.
TEST(AttentionFast, CpuFamilyAgreesWithTheCompilersCheck) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const unsigned family = kernels::cpu_family();
  EXPECT_GE(family, 6u);  // Intel 6 and later, AMD 0Fh and later
  if (__builtin_cpu_is("amdfam17h")) {
    EXPECT_EQ(family, 0x17u);
  }
  if (__builtin_cpu_is("amdfam19h")) {
    EXPECT_EQ(family, 0x19u);
  }
  if (kernels::running_on_amd()) {
    EXPECT_GE(family, 0x0Fu);
  }
#else
  GTEST_SKIP() << "CPUID families are x86-64's";
#endif
}

// Every prefetch strategy computes the same attention (prefetches only move
// data): long contexts so that tiles ahead exist, pages smaller than, equal
// to and larger than the kernel's tile, split contexts on 2 threads.
TEST(AttentionFast, EveryPrefetchStrategy) {
  std::mt19937 rng(808);
  for (const AttentionPrefetch pf : {AttentionPrefetch::automatic, AttentionPrefetch::next_step_l1,
                                     AttentionPrefetch::next_tile_l1,
                                     AttentionPrefetch::next_tile_l2, AttentionPrefetch::none}) {
    SCOPED_TRACE("prefetch " + std::to_string(static_cast<int>(pf)));
    for (const PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
      EXPECT_NE(resolve_attention_prefetch(pf, layout), AttentionPrefetch::automatic);
      if (pf != AttentionPrefetch::automatic) {
        EXPECT_EQ(resolve_attention_prefetch(pf, layout), pf);
      }
    }
    for_dtypes([&](auto tag) {
      using T = decltype(tag);
      for (std::uint32_t page : {5u, 32u, 128u}) {
        Case c{{{1300, 1}, {97, 1}, {40, 9}, {0, 3}}, true, page, 3, 4, 72, 2};
        c.prefetch = pf;
        check_case<T>(c, rng);
      }
      // Token-major NHD items with 2, 3 and 6 query vectors per head (GQA 2,
      // 3 rows of MHA, 2 rows of GQA 3): the GQA steps of next_step_l1,
      // whose prefetches run past each tile's end into the next tile's rows,
      // with a tile (32 tokens) cut by pages of 7 and context ends that are
      // not multiples of the 4-token step.
      for (const auto& [group, rows] : {std::pair{2u, 1u}, {1u, 3u}, {3u, 2u}}) {
        Case g{{{1001, rows}, {70, rows}, {3, rows}}, true, 7, 2, group, 128, 2};
        g.prefetch = pf;
        check_case<T>(g, rng);
      }
    });
  }
}

// With next_tile_l2 (or next_tile_l1) a runner claims its next item during its last tile and
// the pump walks on into that item's first tile (ItemRunner::run). Many
// decode items per thread, of other sequences and shorter than a tile or
// just past one, with a prefill between them (the pump stops there), on
// both layouts and 2 threads, against the reference.
TEST(AttentionFast, PumpRunsOnAcrossItems) {
  std::mt19937 rng(4242);
  Case c{{{700, 1}, {5, 1}, {32, 1}, {33, 1}, {1, 1}, {30, 6}, {64, 2}, {95, 1}, {1, 4}},
         true,
         16,
         2,
         4,
         64,
         2};
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    for (const AttentionPrefetch pf :
         {AttentionPrefetch::next_tile_l2, AttentionPrefetch::next_tile_l1}) {
      c.prefetch = pf;
      for (const PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
        c.layout = layout;
        check_case<T>(c, rng);
      }
    }
  });
}

// HND pages ([heads][tokens][dim]): every dtype, page sizes 1 (where HND and
// NHD coincide), odd, smaller and larger than the kernel's tile, GQA 1/2/4,
// both strategies, 1 and 2 threads, every prefetch strategy, mixed batches
// with long decodes (gathered tiles) and prefills (query-lanes path).
TEST(AttentionFast, HndLayout) {
  std::mt19937 rng(2718);
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    for (bool paged : {true, false}) {
      for (std::uint32_t page : {1u, 7u, 16u, 128u}) {
        if (!paged && page != 16) continue;
        for (std::uint32_t group : {1u, 2u, 4u}) {
          for (std::size_t threads : {1u, 2u}) {
            Case c{{{900, 1}, {0, 37}, {129, 3}, {15, 1}, {300, 2}},
                   paged,
                   page,
                   3,
                   group,
                   80,
                   threads};
            c.layout = PageLayout::hnd;
            c.prefetch =
                threads == 1 ? AttentionPrefetch::next_step_l1 : AttentionPrefetch::next_tile_l2;
            check_case<T>(c, rng);
          }
        }
      }
    }
  });
  Case c{mixed_batch(), true, 16, 2, 8, 128, 2};
  c.layout = PageLayout::hnd;
  c.prefetch = AttentionPrefetch::none;
  check_case<BFloat16>(c, rng);
}

// The head-major loops (HND pages; 1, 2, 3, 4, 8 and 12 query vectors per
// head: from 8 the first block of 4 reports to the pump every 4 rows)
// under every prefetch strategy: contexts long enough for tiles ahead, pages that split
// the kernel's tile into several segments (5), fill it (16 / 32) or hold
// several tiles (48, 128), head dims with and without a padded chunk.
TEST(AttentionFast, HndHeadMajorEveryPrefetch) {
  std::mt19937 rng(1618);
  for (const AttentionPrefetch pf :
       {AttentionPrefetch::next_step_l1, AttentionPrefetch::next_tile_l1,
        AttentionPrefetch::next_tile_l2, AttentionPrefetch::none}) {
    SCOPED_TRACE("prefetch " + std::to_string(static_cast<int>(pf)));
    for_dtypes([&](auto tag) {
      using T = decltype(tag);
      for (std::uint32_t page : {5u, 16u, 48u}) {
        for (std::uint32_t dim : {72u, 128u}) {
          // m (query vectors per head) = rows x GQA: 1, 2, 3 here, then
          // 2, 4, 8 and (3 rows of GQA 4) 12.
          Case c{{{1300, 1}, {97, 2}, {611, 3}, {0, 2}}, true, page, 3, 1, dim, 2};
          c.layout = PageLayout::hnd;
          c.prefetch = pf;
          check_case<T>(c, rng);
          for (std::uint32_t group : {2u, 4u, 8u}) {
            const std::uint32_t rows = group == 4 ? 3 : 1;
            Case g{{{1031, 1}, {33, rows}}, true, page, 4, group, dim, 1};
            g.layout = PageLayout::hnd;
            g.prefetch = pf;
            check_case<T>(g, rng);
          }
        }
      }
    });
  }
}

// The same logical K/V stored into an NHD and an HND cache give the same
// attention, while the two caches' bytes differ (the layout is real).
TEST(AttentionFast, HndAndNhdAgree) {
  std::mt19937 rng(31415);
  const std::vector<Entry> entries{{500, 1}, {0, 20}, {63, 2}};
  OwnedCache<BFloat16> nhd(entries, true, 16, 4, 64, rng, PageLayout::nhd);
  OwnedCache<BFloat16> hnd(nhd);
  hnd.desc.layout = PageLayout::hnd;
  hnd.desc = hnd.desc.with_strides();
  const auto L = OwnedCache<BFloat16>::kLayer;
  const std::uint32_t rows = nhd.total_rows();
  // Fill every cached position of both caches with the same values per (tok, head, d).
  for (OwnedCache<BFloat16>* cache : {&nhd, &hnd}) {
    std::mt19937 fill(99);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    auto col = cache->paged_collection();
    for (std::uint32_t b = 0; b < entries.size(); ++b)
      for (std::uint32_t t = 0; t < entries[b].cache_length; ++t)
        for (std::uint32_t h = 0; h < 4; ++h)
          for (std::uint32_t d = 0; d < 64; ++d) {
            *col.get_key_cache(L).ptr(b, h, t, d) = from_float<BFloat16>(dist(fill));
            *col.get_value_cache(L).ptr(b, h, t, d) = from_float<BFloat16>(dist(fill));
          }
  }
  EXPECT_NE(
      0, std::memcmp(nhd.blocks.data(), hnd.blocks.data(), nhd.blocks.size() * sizeof(BFloat16)));
  const auto k_new = test::random_floats(std::size_t{rows} * 4 * 64, -1, 1, rng);
  const auto v_new = test::random_floats(std::size_t{rows} * 4 * 64, -1, 1, rng);
  const auto q = test::random_floats(std::size_t{rows} * 8 * 64, -2, 2, rng);
  std::vector<std::vector<float>> outs;
  ThreadPool pool(2);
  for (OwnedCache<BFloat16>* cache : {&nhd, &hnd}) {
    auto col = cache->paged_collection();
    std::vector<float> out(q.size());
    store_kv(col.get_key_cache(L), col.get_value_cache(L), std::span(k_new), std::span(v_new),
             std::span<const std::uint32_t>(cache->row_offsets), {}, &pool);
    attention(col.get_key_cache(L), col.get_value_cache(L), std::span(q), 8,
              std::span<const std::uint32_t>(cache->row_offsets), std::span(out), {}, &pool);
    outs.push_back(std::move(out));
  }
  for (std::size_t i = 0; i < q.size(); ++i)
    ASSERT_NEAR(outs[0][i], outs[1][i], kAbsTol + kRelTol * std::fabs(outs[0][i])) << i;
}

TEST(AttentionFast, LongSingleDecodeSplitsAcrossThreads) {
  std::mt19937 rng(7);
  Case c{{{4099, 1}}, true, 16, 2, 4, 128, 2};
  check_case<BFloat16>(c, rng);
  c.threads = 3;
  c.page = 128;
  check_case<Half>(c, rng);
}

// Batch 1 with a short context is split evenly over the threads (down to
// 128-token pieces) rather than run as one item: split points inside pages,
// pieces of unequal length, page sizes 1 / 16 / 128, both layouts.
TEST(AttentionFast, ShortSingleDecodeSplitsAcrossThreadsEvenly) {
  std::mt19937 rng(31);
  for (const std::uint32_t ctx : {129u, 300u, 511u}) {
    for (const std::uint32_t page : {1u, 16u, 128u}) {
      for (const PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
        Case c{{{ctx, 1}}, true, page, 2, 4, 96, 2};
        c.layout = layout;
        check_case<BFloat16>(c, rng);
        c.threads = 3;
        check_case<float>(c, rng);
      }
    }
  }
  Case c{{{300, 1}, {0, 0}}, false, 16, 3, 1, 64, 2};  // continuous, an empty entry beside
  check_case<Half>(c, rng);
}

TEST(AttentionFast, PrefillOnlyAndEmptyEntries) {
  std::mt19937 rng(5);
  Case c{{{0, 45}, {10, 0}, {0, 1}}, true, 16, 1, 4, 96, 2};
  check_case<float>(c, rng);
  c.paged = false;
  check_case<BFloat16>(c, rng);
}

TEST(AttentionFast, ExplicitScale) {
  std::mt19937 rng(11);
  OwnedCache<float> cache({{20, 3}}, true, 4, 1, 64, rng);
  const auto q = test::random_floats(3 * 2 * 64, -1, 1, rng);
  std::vector<float> a(q.size()), b(q.size());
  auto col = cache.paged_collection();
  auto k = col.get_key_cache(1), v = col.get_value_cache(1);
  std::span<const std::uint32_t> ro(cache.row_offsets);
  AttentionOptions opt{0.37f};
  attention_reference(k, v, std::span(q), 2, ro, std::span(a), opt);
  attention(k, v, std::span(q), 2, ro, std::span(b), opt);
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], kAbsTol + kRelTol * std::fabs(a[i]));
}

// Scores that rise along the context by more than the online softmax's
// slack (kSoftmaxMaxSlack, 8) per tile, by less (so the stale maximum lags
// until the rise adds up), and fall back: the running maximum must be raised
// and the accumulators rescaled, or exp(s - max) overflows (scores reach
// ~143). Every value is a small integer (exact in bf16 and f16) and the
// scale a power of two, so the scores themselves are exact in any summation
// order and the bound of check_case holds. Decodes long enough to split
// across threads (merges of stale maxima), GQA 1 and 4, both layouts, paged
// and continuous.
template <CacheElement T>
void check_rising_scores(bool paged, PageLayout layout, std::uint32_t group, std::size_t threads,
                         std::mt19937& rng) {
  constexpr std::uint32_t kDim = 64, kKv = 2, kContext = 1211;
  SCOPED_TRACE(std::string(paged ? "paged " : "continuous ") + std::string(layout_name(layout)) +
               " group " + std::to_string(group) + " threads " + std::to_string(threads) +
               " dtype " + std::string(dtype_name(dtype_of_v<T>)));
  OwnedCache<T> ref({{kContext - 1, 1}, {300, 1}}, paged, 16, kKv, kDim, rng, layout);
  const std::uint32_t n_q = kKv * group;
  std::uniform_int_distribution<int> sign(0, 1), noise(-1, 1);
  std::vector<float> q(std::size_t{2} * n_q * kDim);
  for (auto& x : q) x = sign(rng) != 0 ? 1.0f : -1.0f;
  // Score of token t (before the +-1 of noise): +16 per 32-token tile, then
  // lower, then +1.6 per tile, then flat.
  const auto rise = [](std::uint32_t t) -> int {
    if (t < 256) return static_cast<int>(t / 2);
    if (t < 700) return 90;
    if (t < 1000) return 127 + static_cast<int>((t - 700) / 20);
    return 130;
  };
  test::with_collection(ref, [&](const auto& col) {
    const auto k = col.get_key_cache(OwnedCache<T>::kLayer);
    for (std::uint32_t b = 0; b < 2; ++b) {
      for (std::uint32_t h = 0; h < kKv; ++h) {
        const float* qh = q.data() + (std::size_t{b} * n_q + std::size_t{h} * group) * kDim;
        for (std::uint32_t t = 0; t < ref.cache_lengths[b]; ++t) {
          for (std::uint32_t e = 0; e < kDim; ++e) {
            const float x = qh[e] * static_cast<float>(rise(t)) + static_cast<float>(noise(rng));
            *k.ptr(b, h, t, e) = from_float<T>(x);
          }
        }
      }
    }
  });
  OwnedCache<T> fast(ref);
  const auto k_new = test::random_floats(std::size_t{2} * kKv * kDim, -1, 1, rng);
  const auto v_new = test::random_floats(std::size_t{2} * kKv * kDim, -1, 1, rng);
  const auto out_ref =
      check_against_reference(ref, fast, k_new, v_new, q, n_q, {1.0f / kDim}, threads);
  for (std::size_t i = 0; i < out_ref.size(); ++i)
    ASSERT_TRUE(std::isfinite(out_ref[i])) << "reference element " << i;
}

TEST(AttentionFast, RisingScoresRaiseTheRunningMax) {
  std::mt19937 rng(1618);
  for_dtypes([&](auto tag) {
    using T = decltype(tag);
    for (const PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
      for (std::uint32_t group : {1u, 4u}) {
        for (std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
          check_rising_scores<T>(true, layout, group, threads, rng);
        }
      }
    }
    check_rising_scores<T>(false, PageLayout::nhd, 4, 2, rng);
  });
}

// Every prefetch strategy has a name that parses back to it; unknown names
// throw InvalidArgument naming the value and the accepted names.
TEST(PrefetchNames, RoundTripAndRejectUnknown) {
  for (const AttentionPrefetch p : {AttentionPrefetch::automatic, AttentionPrefetch::next_step_l1,
                                    AttentionPrefetch::next_tile_l1,
                                    AttentionPrefetch::next_tile_l2, AttentionPrefetch::none}) {
    EXPECT_EQ(parse_attention_prefetch(prefetch_name(p)), p);
  }
  for (const StorePrefetch p :
       {StorePrefetch::automatic, StorePrefetch::next_row_l1, StorePrefetch::none}) {
    EXPECT_EQ(parse_store_prefetch(prefetch_name(p)), p);
  }
  EXPECT_EQ(prefetch_name(AttentionPrefetch::next_tile_l2), "tile-l2");
  EXPECT_EQ(prefetch_name(AttentionPrefetch::next_tile_l1), "tile-l1");
  EXPECT_EQ(prefetch_name(StorePrefetch::next_row_l1), "row-l1");
  EXPECT_EQ(prefetch_name(static_cast<AttentionPrefetch>(9)), "?");
  try {
    parse_attention_prefetch("row-l1");
    ADD_FAILURE() << "a store prefetch name parsed as an attention one";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("'row-l1' is not one of auto, step-l1, tile-l1, tile-l2, none"),
        std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_store_prefetch("step-l1"), InvalidArgument);
  EXPECT_THROW(parse_store_prefetch(""), InvalidArgument);
}

TEST(PrecisionNames, RoundTripAndRejectUnknown) {
  for (const AttentionPrecision p : {AttentionPrecision::fp32, AttentionPrecision::bf16}) {
    EXPECT_EQ(parse_attention_precision(precision_name(p)), p);
  }
  EXPECT_EQ(precision_name(AttentionPrecision::bf16), "bf16");
  EXPECT_EQ(precision_name(static_cast<AttentionPrecision>(9)), "?");
  try {
    parse_attention_precision("f16");
    ADD_FAILURE() << "f16 parsed as a precision";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("precision 'f16' is not one of fp32, bf16"),
              std::string::npos)
        << e.what();
  }
}

TEST(AttentionFast, BadArgumentsThrowInvalidArgument) {
  std::mt19937 rng(3);
  OwnedCache<Half> cache({{5, 2}, {0, 3}}, true, 4, 2, 64, rng);
  auto col = cache.paged_collection();
  auto k = col.get_key_cache(1), v = col.get_value_cache(1);
  const std::size_t rows = 5;
  std::vector<float> q(rows * 4 * 64, 0.5f), out(q.size());
  std::vector<std::uint32_t> ro = cache.row_offsets;
  const auto before = cache.blocks;
  // n_q_heads not a multiple of n_kv_heads, and zero.
  EXPECT_THROW(attention(k, v, std::span<const float>(q), 3, std::span<const std::uint32_t>(ro),
                         std::span(out)),
               InvalidArgument);
  EXPECT_THROW(attention(k, v, std::span<const float>(q), 0, std::span<const std::uint32_t>(ro),
                         std::span(out)),
               InvalidArgument);
  // q / out size mismatch.
  EXPECT_THROW(attention(k, v, std::span<const float>(q).subspan(1), 4,
                         std::span<const std::uint32_t>(ro), std::span(out)),
               InvalidArgument);
  EXPECT_THROW(attention(k, v, std::span<const float>(q), 4, std::span<const std::uint32_t>(ro),
                         std::span(out).subspan(64)),
               InvalidArgument);
  // row_offsets: wrong length, not starting at 0, decreasing, past the view's room.
  std::vector<std::uint32_t> short_ro = {0, 2};
  std::vector<std::uint32_t> bad_start = {1, 2, 5};
  std::vector<std::uint32_t> decreasing = {0, 3, 2};
  std::vector<std::uint32_t> too_many = {0, 5, 5};  // entry 0: 5 cached + 5 new > 7
  for (const auto* bad : {&short_ro, &bad_start, &decreasing, &too_many}) {
    EXPECT_THROW(attention(k, v, std::span<const float>(q), 4, std::span<const std::uint32_t>(*bad),
                           std::span(out)),
                 InvalidArgument);
  }
  // K and V from different layers of different shape are fine; mismatched shapes are not.
  OwnedCache<Half> other({{5, 2}, {0, 3}}, true, 4, 1, 64, rng);
  auto other_v = other.paged_collection().get_value_cache(1);
  EXPECT_THROW(attention(k, other_v, std::span<const float>(q), 4,
                         std::span<const std::uint32_t>(ro), std::span(out)),
               InvalidArgument);
  // store_kv: size mismatch, bad offsets, bad rope.
  std::vector<float> kv(rows * 2 * 64, 0.25f);
  EXPECT_THROW(store_kv(k, v, std::span<const float>(kv).subspan(1), std::span<const float>(kv),
                        std::span<const std::uint32_t>(ro)),
               InvalidArgument);
  EXPECT_THROW(store_kv(k, v, std::span<const float>(kv), std::span<const float>(kv),
                        std::span<const std::uint32_t>(too_many)),
               InvalidArgument);
  StoreOptions odd;
  odd.rope_k = {true, 10000.0f, 7};
  EXPECT_THROW(store_kv(k, v, std::span<const float>(kv), std::span<const float>(kv),
                        std::span<const std::uint32_t>(ro), odd),
               InvalidArgument);
  StoreOptions wide;
  wide.rope_k = {true, 10000.0f, 66};
  EXPECT_THROW(store_kv(k, v, std::span<const float>(kv), std::span<const float>(kv),
                        std::span<const std::uint32_t>(ro), wide),
               InvalidArgument);
  // Prefetch values outside the enums (a cast from bad data), and K / V of
  // different page layouts.
  StoreOptions bad_store_pf;
  bad_store_pf.prefetch = static_cast<StorePrefetch>(9);
  EXPECT_THROW(store_kv(k, v, std::span<const float>(kv), std::span<const float>(kv),
                        std::span<const std::uint32_t>(ro), bad_store_pf),
               InvalidArgument);
  std::fill(out.begin(), out.end(), -3.0f);
  AttentionOptions bad_attn_pf;
  bad_attn_pf.prefetch = static_cast<AttentionPrefetch>(9);
  EXPECT_THROW(attention(k, v, std::span<const float>(q), 4, std::span<const std::uint32_t>(ro),
                         std::span(out), bad_attn_pf),
               InvalidArgument);
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == -3.0f; }))
      << "a throwing attention call wrote its output";
  OwnedCache<Half> hnd(cache);
  hnd.desc.layout = PageLayout::hnd;
  hnd.desc = hnd.desc.with_strides();
  auto hnd_v = hnd.paged_collection().get_value_cache(1);
  try {
    attention(k, hnd_v, std::span<const float>(q), 4, std::span<const std::uint32_t>(ro),
              std::span(out));
    ADD_FAILURE() << "K (nhd) with V (hnd) was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("layout nhd vs hnd"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(before == cache.blocks) << "a throwing call wrote to the cache";
}

}  // namespace
}  // namespace kvcache
