// The decode attention kernel (src/kernels/cuda/decode_attention.cu): calls
// whose view has max_seq_length <= 4 (decode and small speculative steps),
// head_dim a multiple of the 16-byte vector (8 f16 / bf16 elements, 4 f32)
// and 16-byte aligned pools. Every case first asserts which kernel
// attention_kernel_name says the call takes, so a planner change that sends
// these shapes to the generic kernel fails here instead of passing silently.
//
// Same checks and bound as kernels_test.cpp: store_kv then attention on the
// device vs store_kv_reference then attention_reference on the host, output
// poisoned with NaN first, every element finite and within
// 1e-5 + 1e-5 |reference|. The decode kernel sums in yet another order
// (per-lane partial dot products reduced by a butterfly, an online softmax
// in base 2 with q pre-scaled by scale * log2(e), per-row and per-warp
// log-sum-exp combines, split partials merged in natural log); each of these
// moves an output by a few fp32 ulps of 1.0, well inside the ~84-ulp bound.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/decode_tuning.h"

namespace kvcache::cuda::test {
namespace {

constexpr float kAbsTol = 1e-5f;
constexpr float kRelTol = 1e-5f;

// A ragged decode / speculative batch: 1..4 new rows per entry, a 1-token
// context (no history, one new token), a history of 1, a 0-history entry
// with 4 new rows, lengths multiples of nothing.
std::vector<Entry> ragged_decode() {
  return {{517, 1}, {0, 1}, {1, 1}, {33, 2}, {1000, 3}, {95, 4}, {0, 4}, {258, 1}};
}

std::string expected_kernel(const Case& c, DType dtype) {
  std::uint32_t max_new = 0;
  for (const Entry& e : c.entries) max_new = std::max(max_new, e.new_tokens);
  const std::uint32_t vec = 16 / static_cast<std::uint32_t>(dtype_size(dtype));
  return max_new <= 4 && c.dim % vec == 0 ? "decode" : "generic";
}

template <CacheElement T>
void check_case(const Case& c, std::uint32_t seed) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of_v<T>)) + " " + c.name());
  std::mt19937 rng(seed);
  Mirrored<T> m(c, rng);
  EXPECT_EQ(std::string(attention_kernel_name(m.key(), m.value())),
            expected_kernel(c, dtype_of_v<T>));
  m.store_on_device();
  m.attend_on_device();
  synchronize();
  const std::vector<float> ref = m.reference();
  EXPECT_TRUE(m.pools_equal()) << "store_kv differs from store_kv_reference";
  expect_close(m.out_d.to_host(), ref, kAbsTol, kRelTol, "attention");
}

void check_all_dtypes(const Case& c, std::uint32_t seed) {
  check_case<float>(c, seed);
  check_case<Half>(c, seed);
  check_case<BFloat16>(c, seed);
}

TEST(CudaDecode, HeadDims) {
  // f16 / bf16: 8, 10, 12, 16, 32 vectors per row (8, 16, 16, 16, 32 lanes
  // per token); f32: 16, 20, 24, 32, 64 (two vectors per lane at 256).
  for (std::uint32_t dim : {64u, 80u, 96u, 128u, 256u}) {
    check_all_dtypes({ragged_decode(), true, 16, 2, 4, dim}, 1100 + dim);
  }
}

TEST(CudaDecode, HeadDimsThatFallBack) {
  // 36: a multiple of f32's 4-element vector (decode kernel, 9 vectors per
  // row, 7 idle lanes of 16) but not of f16 / bf16's 8 (generic kernel).
  // 33: no vector multiple at all, every dtype takes the generic kernel.
  check_all_dtypes({ragged_decode(), true, 16, 2, 2, 36}, 1200);
  check_all_dtypes({ragged_decode(), true, 16, 2, 2, 33}, 1201);
}

TEST(CudaDecode, GroupSizesAndLayouts) {
  for (PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
    for (std::uint32_t group : {1u, 2u, 4u, 8u}) {
      check_all_dtypes({ragged_decode(), true, 16, 2, group, 128, layout}, 1300 + group);
    }
  }
}

TEST(CudaDecode, LargeGroupsTakeSeveralHeadTiles) {
  // 8 query vectors per block: one row x 8 heads, or 4 rows x 2 heads.
  check_all_dtypes({ragged_decode(), true, 16, 1, 32, 64}, 1400);
  check_all_dtypes({ragged_decode(), true, 16, 1, 24, 80, PageLayout::hnd}, 1401);
  check_all_dtypes({{{700, 1}, {5, 1}, {0, 1}}, true, 16, 2, 24, 128}, 1402);
}

TEST(CudaDecode, PageSizes) {
  for (std::uint32_t page : {1u, 16u, 128u}) {
    for (PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
      check_all_dtypes({ragged_decode(), true, page, 2, 2, 128, layout}, 1500 + page);
    }
  }
}

TEST(CudaDecode, Continuous) {
  // A slot of max context + 5 tokens: not a power of two (division path).
  check_all_dtypes({ragged_decode(), false, 0, 2, 4, 128}, 1600);
  check_all_dtypes({ragged_decode(), false, 0, 3, 2, 96, PageLayout::hnd}, 1601);
}

TEST(CudaDecode, SpeculativeRows) {
  // Every entry 4 rows (4 x 2 heads per block) or 3 rows (6 of 8 vectors).
  check_all_dtypes({{{300, 4}, {0, 4}, {2049, 4}}, true, 16, 2, 4, 128}, 1700);
  check_all_dtypes({{{300, 3}, {1, 3}, {77, 3}}, true, 16, 2, 2, 64, PageLayout::hnd}, 1701);
  check_all_dtypes({{{129, 2}, {0, 2}}, true, 1, 4, 1, 256}, 1702);
}

TEST(CudaDecode, LongContextsTakeTheSplitPath) {
  // One or few entries leave the device idle: the context is split and the
  // partials merged by log-sum-exp (20k tokens: ~78 splits of 256).
  check_all_dtypes({{{20011, 1}}, true, 16, 1, 8, 128}, 1800);
  check_all_dtypes({{{20000, 4}}, true, 128, 2, 4, 128, PageLayout::hnd}, 1801);
  check_all_dtypes({{{5003, 1}, {3001, 3}, {0, 1}}, true, 16, 2, 4, 128, PageLayout::hnd}, 1802);
  check_all_dtypes({{{9001, 1}}, false, 0, 2, 1, 96}, 1803);
}

TEST(CudaDecode, ManyEntries) {
  std::vector<Entry> entries;
  for (std::uint32_t b = 0; b < 97; ++b) entries.push_back({(b * 37) % 301, 1 + b % 4});
  check_all_dtypes({entries, true, 16, 4, 2, 128}, 1900);
  check_all_dtypes({entries, true, 1, 2, 8, 64, PageLayout::hnd}, 1901);
}

TEST(CudaDecode, ExplicitScale) {
  std::mt19937 rng(2000);
  Case c{ragged_decode(), true, 16, 2, 4, 128};
  Mirrored<BFloat16> m(c, rng);
  ASSERT_EQ(std::string(attention_kernel_name(m.key(), m.value())), "decode");
  AttentionOptions options;
  options.scale = 0.37f;
  m.store_on_device();
  cuda::attention(m.key(), m.value(), std::span<const float>(m.q_d.span()), m.n_q,
                  std::span<const std::uint32_t>(m.offsets_d.span()), m.out_d.span(), options);
  synchronize();
  expect_close(m.out_d.to_host(), m.reference(options), kAbsTol, kRelTol,
               "attention with scale 0.37");
}

// The decode kernel's non-default paths (detail::DecodeTuning, reached by
// the bench's --sweep): ring depths 2 and 4, 8 lanes x 2 vectors per token
// row, 1 / 2 / 4 query vectors per block, other split plans, each with and
// without an AttentionWorkspace; every one against the reference.
template <CacheElement T>
void check_tuned(const Case& c, std::uint32_t seed, const detail::DecodeTuning& t, const char* what,
                 AttentionWorkspace* ws = nullptr) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of_v<T>)) + " " + c.name() + " " + what);
  std::mt19937 rng(seed);
  Mirrored<T> m(c, rng);
  ASSERT_EQ(std::string(attention_kernel_name(m.key(), m.value())), "decode");
  m.store_on_device();
  detail::attention_cuda_tuned(
      dtype_of_v<T>, m.key(), m.value(), std::span<const float>(m.q_d.span()), m.n_q,
      std::span<const std::uint32_t>(m.offsets_d.span()), m.out_d.span(), {}, nullptr, ws, t);
  synchronize();
  expect_close(m.out_d.to_host(), m.reference(), kAbsTol, kRelTol, "attention");
}

TEST(CudaDecode, TunedVariants) {
  struct V {
    const char* name;
    std::uint32_t vec, stages, lanes, waves, min_split;
  };
  const V variants[] = {{"stages2", 0, 2, 0, 0, 0},
                        {"stages4", 0, 4, 0, 0, 0},
                        {"lanes8", 0, 0, 8, 0, 0},
                        {"lanes8+st2", 0, 2, 8, 0, 0},
                        {"vec4+lanes8+st3", 4, 3, 8, 0, 0},
                        {"vec1", 1, 0, 0, 0, 0},
                        {"vec2", 2, 0, 0, 0, 0},
                        {"vec4", 4, 0, 0, 0, 0},
                        {"waves4", 0, 0, 0, 4, 0},
                        {"split1024", 0, 0, 0, 0, 1024},
                        {"stages2+waves8", 0, 2, 0, 8, 0},
                        {"stages4+lanes8+waves2", 0, 4, 8, 2, 0}};
  // Ragged rows (1..4 per entry, so 8-vector blocks and lanes8 falling back
  // to 16 lanes), GQA 4 (4 vectors per block with one row), a long split
  // context, head dims 128 and 80 (idle vectors of a lane-row set).
  const Case cases[] = {{ragged_decode(), true, 16, 2, 4, 128},
                        {{{700, 1}, {5, 1}, {0, 1}}, true, 16, 2, 4, 128, PageLayout::hnd},
                        {{{9001, 1}}, true, 16, 1, 4, 80},
                        {{{3000, 4}, {17, 2}}, true, 16, 2, 4, 128}};
  std::uint32_t seed = 2100;
  AttentionWorkspace ws;  // shared by every variant: grows, keeps per-kernel state
  for (const V& v : variants) {
    detail::DecodeTuning t;
    t.max_vectors = v.vec;
    t.stages = v.stages;
    t.lanes = v.lanes;
    t.split_waves = v.waves;
    t.min_split_tokens = v.min_split;
    for (const Case& c : cases) {
      check_tuned<BFloat16>(c, seed, t, v.name);
      check_tuned<Half>(c, seed, t, v.name, &ws);
      ++seed;
    }
  }
}

}  // namespace
}  // namespace kvcache::cuda::test
