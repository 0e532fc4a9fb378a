// The tensor-core prefill kernel (src/kernels/cuda/prefill_attention.cu):
// f16 / bf16 caches, head dims 64 / 80 / 96 / 128, views whose
// max_seq_length > 4 (prefill, chunked prefill and mixed batches, including
// their 1-row decode entries). Every case first asserts that
// attention_kernel_name says "prefill".
//
// Checks: store_kv then attention on the device vs store_kv_reference then
// attention_reference on the host copy, output poisoned with NaN first,
// every element finite. The kernel rounds q to the cache's type (the
// tensor cores' input) and the softmax weights to it for the P.V mma, so the
// reference runs on q rounded the same way (round to nearest even, bit-equal
// to the device's), and the bound is prefill_abs_tol (cuda_test_util.h,
// derived in docs/CUDA.md): 1e-5 + 2^-8 (bf16) or 1e-5 + 2^-11 + context x
// 2^-25 (f16), plus 1e-5 |reference|. One case also compares against the
// unrounded-q reference to show the size of the q rounding (a looser,
// separately derived bound).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"

namespace kvcache::cuda::test {
namespace {

constexpr float kRelTol = 1e-5f;

// Fresh prefills, a prefill over history, 1-row decode entries (0- and
// 1-token histories), a 5-row entry, row counts that are no multiple of the
// kernel's 64-vector tile for any group.
std::vector<Entry> mixed_batch() {
  return {{0, 77}, {200, 45}, {5, 1}, {0, 1}, {130, 13}, {17, 70}, {1, 5}};
}

std::uint32_t max_context(const Case& c) {
  std::uint32_t n = 0;
  for (const Entry& e : c.entries) n = std::max(n, e.cache_length + e.new_tokens);
  return n;
}

template <CacheElement T>
void check_case(const Case& c, std::uint32_t seed, const AttentionOptions& options = {}) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of_v<T>)) + " " + c.name());
  std::mt19937 rng(seed);
  Mirrored<T> m(c, rng);
  EXPECT_EQ(std::string(attention_kernel_name(m.key(), m.value())), "prefill");
  m.store_on_device();
  cuda::attention(m.key(), m.value(), std::span<const float>(m.q_d.span()), m.n_q,
                  std::span<const std::uint32_t>(m.offsets_d.span()), m.out_d.span(), options);
  synchronize();
  const std::vector<float> ref = m.reference(options, /*round_q=*/true);
  EXPECT_TRUE(m.pools_equal()) << "store_kv differs from store_kv_reference";
  expect_close(m.out_d.to_host(), ref, prefill_abs_tol<T>(max_context(c)), kRelTol,
               "prefill attention");
}

void check_both(const Case& c, std::uint32_t seed) {
  check_case<Half>(c, seed);
  check_case<BFloat16>(c, seed);
}

TEST(CudaPrefill, HeadDims) {
  for (std::uint32_t dim : {64u, 80u, 96u, 128u}) {
    check_both({mixed_batch(), true, 16, 2, 4, dim}, 2100 + dim);
  }
}

TEST(CudaPrefill, GroupSizesAndLayouts) {
  // 6: a 64-vector tile ends in the middle of a row's heads; 80: one row's
  // heads span two tiles.
  for (PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
    for (std::uint32_t group : {1u, 4u, 6u, 8u}) {
      check_both({mixed_batch(), true, 16, 2, group, 128, layout}, 2200 + group);
    }
  }
  check_both({{{0, 9}, {20, 6}, {3, 1}}, true, 16, 1, 80, 64}, 2299);
}

TEST(CudaPrefill, PageSizes) {
  for (std::uint32_t page : {1u, 16u, 128u}) {
    for (PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
      check_both({mixed_batch(), true, page, 2, 2, 64, layout}, 2300 + page);
    }
  }
}

TEST(CudaPrefill, Continuous) {
  check_both({mixed_batch(), false, 0, 2, 4, 128}, 2400);
  check_both({mixed_batch(), false, 0, 3, 2, 80, PageLayout::hnd}, 2401);
}

TEST(CudaPrefill, ChunkedPrefillOverLongHistory) {
  // 77 new rows over 3,000 history tokens next to decode entries.
  check_both({{{3000, 77}, {0, 1}, {40, 1}}, true, 16, 1, 4, 128}, 2500);
  check_both({{{3000, 77}, {511, 6}}, true, 128, 1, 8, 64, PageLayout::hnd}, 2501);
}

TEST(CudaPrefill, LongPrefill) {
  // A 2,048-token prefill (the bench's shape, fewer heads to keep the host
  // reference short).
  check_case<BFloat16>({{{0, 2048}}, true, 16, 1, 1, 128}, 2600);
  check_case<Half>({{{0, 2048}}, true, 16, 1, 2, 64}, 2601);
}

TEST(CudaPrefill, ExplicitScale) {
  AttentionOptions options;
  options.scale = 0.37f;
  check_case<BFloat16>({mixed_batch(), true, 16, 2, 2, 64}, 2700, options);
  check_case<Half>({mixed_batch(), true, 16, 2, 2, 96}, 2701, options);
}

TEST(CudaPrefill, QRoundingAgainstTheUnroundedReference) {
  // Against attention_reference on the f32 q: rounding q (|q| <= 1) to T
  // changes a score by at most scale * u * sum_d |k_d| <= u sqrt(head_dim)
  // (scale 1 / sqrt(head_dim), |k| <= 1); scores that move by at most
  // delta move the weights by a factor in [e^-2delta, e^2delta], an output
  // by at most (e^2delta - 1) max|v|. bf16 at head dim 64: delta <= 2^-8 x 8
  // = 0.031, bound 0.065 (+ the prefill bound); f16: 0.0039, 0.0079.
  const Case c{mixed_batch(), true, 16, 2, 4, 64};
  const auto run = [&](auto tag, float q_bound) {
    using T = decltype(tag);
    SCOPED_TRACE(std::string(dtype_name(dtype_of_v<T>)));
    std::mt19937 rng(2800);
    Mirrored<T> m(c, rng);
    m.store_on_device();
    m.attend_on_device();
    synchronize();
    const std::vector<float> ref = m.reference();
    expect_close(m.out_d.to_host(), ref, q_bound + prefill_abs_tol<T>(max_context(c)), kRelTol,
                 "prefill attention vs unrounded q");
  };
  run(BFloat16{}, std::exp(2.0f * 0x1p-8f * 8.0f) - 1.0f);
  run(Half{}, std::exp(2.0f * 0x1p-11f * 8.0f) - 1.0f);
}

TEST(CudaPrefill, WorkspaceIsBitIdentical) {
  std::mt19937 rng(2900);
  const Case c{mixed_batch(), true, 16, 2, 4, 128};
  Mirrored<BFloat16> m(c, rng);
  m.store_on_device();
  m.attend_on_device();
  AttentionWorkspace ws;
  DeviceBuffer<float> out2(m.q.size());
  out2.fill_bytes(0xff);
  m.attend_into(out2, &ws);
  synchronize();
  const std::vector<float> a = m.out_d.to_host(), b = out2.to_host();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  expect_close(a, m.reference({}, true), prefill_abs_tol<BFloat16>(max_context(c)), kRelTol,
               "prefill attention");
}

}  // namespace
}  // namespace kvcache::cuda::test
