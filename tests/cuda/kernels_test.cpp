// CUDA store_kv / attention against the scalar references on random data:
// the GENERIC kernel. These shapes (> 4 new rows) would take the prefill
// kernel for f16 / bf16 at head dims 64 / 80 / 96 / 128, so the attention
// calls here force the generic kernel (detail::DecodeTuning::generic) and
// keep it covered at every shape and dtype; prefill_test.cpp covers the
// prefill kernel through the public path.
//
// store_kv: the device pool must equal, byte for byte, the host pool after
// store_kv_reference (same f16 / bf16 round-to-nearest-even; every other
// byte of the pool, both layers, K and V, untouched).
// attention: every output element is written (the buffer is poisoned with
// NaN first) and |cuda - reference| <= kAbsTol + kRelTol * |reference|,
// kAbsTol = kRelTol = 1e-5. Outputs are convex combinations of V values in
// [-1, 1]; both sides accumulate in fp32 but in different orders (the GPU
// tiles the context, uses an online softmax and merges split-KV partials by
// log-sum-exp, with CUDA's expf within 2 ulp), which moves each output by a
// few tens of fp32 ulps of 1.0 (2^-23 ~ 1.2e-7): 1e-5 is ~84 ulps, while a
// wrong token, head, page or mask moves outputs by ~1e-2.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cuda_test_util.h"

namespace kvcache::cuda::test {
namespace {

constexpr float kAbsTol = 1e-5f;
constexpr float kRelTol = 1e-5f;

// A mixed batch: a decode long enough to split, a fresh prefill, a chunked
// prefill over history, short decodes; lengths multiples of nothing.
std::vector<Entry> mixed_batch() { return {{1531, 1}, {0, 37}, {61, 7}, {3, 1}, {33, 2}}; }

template <CacheElement T>
void check_case(const Case& c, std::uint32_t seed) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of_v<T>)) + " " + c.name());
  std::mt19937 rng(seed);
  Mirrored<T> m(c, rng);
  m.store_on_device();
  m.attend_generic();
  synchronize();
  const std::vector<float> ref = m.reference();
  EXPECT_TRUE(m.pools_equal()) << "store_kv differs from store_kv_reference";
  expect_close(m.out_d.to_host(), ref, kAbsTol, kRelTol, "attention");
}

template <class F>
void for_each_dtype(F&& f) {
  f(float{});
  f(Half{});
  f(BFloat16{});
}

void check_all_dtypes(const Case& c, std::uint32_t seed) {
  for_each_dtype([&](auto tag) { check_case<decltype(tag)>(c, seed); });
}

TEST(CudaKernels, HeadDims) {
  for (std::uint32_t dim : {64u, 80u, 96u, 128u, 256u, 40u, 72u, 33u}) {
    check_all_dtypes({mixed_batch(), true, 16, 2, 4, dim}, 100 + dim);
  }
}

TEST(CudaKernels, GroupSizesAndLayouts) {
  for (PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
    for (std::uint32_t group : {1u, 2u, 4u, 8u}) {
      check_all_dtypes({mixed_batch(), true, 16, 2, group, 128, layout}, 200 + group);
    }
  }
}

TEST(CudaKernels, LargeGroupSplitsHeadsAcrossBlocks) {
  // 32 query heads on one KV head: more than one block's worth of vectors.
  check_all_dtypes({mixed_batch(), true, 16, 1, 32, 64}, 300);
  check_all_dtypes({mixed_batch(), true, 16, 1, 24, 80, PageLayout::hnd}, 301);
}

TEST(CudaKernels, PageSizes) {
  for (std::uint32_t page : {1u, 16u, 128u}) {
    for (PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
      check_all_dtypes({mixed_batch(), true, page, 2, 2, 64, layout}, 400 + page);
    }
  }
}

TEST(CudaKernels, Continuous) {
  check_all_dtypes({mixed_batch(), false, 0, 2, 4, 128}, 500);
  check_all_dtypes({mixed_batch(), false, 0, 3, 2, 72, PageLayout::hnd}, 501);
}

TEST(CudaKernels, LongDecodeTakesTheSplitPath) {
  // Few entries, long contexts: the grid is split along the context and
  // merged by log-sum-exp (the planner splits whenever the batch leaves the
  // device mostly idle; 20k tokens of one entry gives ~78 splits of 256).
  // One short entry with 5 new rows keeps these on the generic kernel
  // (max_seq_length > 4); decode_test.cpp covers the decode kernel's splits.
  check_all_dtypes({{{20011, 1}, {3, 5}}, true, 16, 1, 8, 128}, 600);
  check_all_dtypes({{{5003, 1}, {3001, 1}, {777, 5}}, true, 16, 2, 4, 128, PageLayout::hnd}, 601);
  check_all_dtypes({{{9001, 1}, {0, 5}}, false, 0, 2, 1, 96}, 602);
}

TEST(CudaKernels, PrefillOverLongHistory) {
  check_all_dtypes({{{4000, 40}, {0, 300}}, true, 16, 2, 4, 128}, 700);
  check_all_dtypes({{{0, 513}}, true, 128, 1, 1, 256}, 701);
}

TEST(CudaKernels, ManyEntriesDecode) {
  std::vector<Entry> entries;
  // Entry 96 has 5 new rows: the generic kernel (decode_test.cpp: the decode one).
  for (std::uint32_t b = 0; b < 97; ++b) entries.push_back({(b * 37) % 301 + 1, b == 96 ? 5u : 1u});
  check_all_dtypes({entries, true, 16, 4, 2, 128}, 800);
}

TEST(CudaKernels, ExplicitScale) {
  std::mt19937 rng(900);
  Case c{mixed_batch(), true, 16, 2, 2, 64};
  Mirrored<Half> m(c, rng);
  AttentionOptions options;
  options.scale = 0.37f;
  m.store_on_device();
  m.attend_generic(options);
  synchronize();
  expect_close(m.out_d.to_host(), m.reference(options), kAbsTol, kRelTol,
               "attention with scale 0.37");
}

}  // namespace
}  // namespace kvcache::cuda::test
