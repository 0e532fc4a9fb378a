// Bad input to the CUDA kernels and helpers: a typed kvcache::Error whose
// message names the value and the limit, and nothing written (the output
// keeps its NaN poison, the device pool its bytes).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "test_util.h"

namespace kvcache::cuda::test {
namespace {

struct BadInput : ::testing::Test {
  std::mt19937 rng{42};
  Mirrored<float> m{Case{{{40, 1}, {0, 5}}, true, 16, 2, 2, 64}, rng};
  std::vector<float> pool_before = m.pool.to_host();

  std::span<const float> q() const { return m.q_d.span(); }
  std::span<const std::uint32_t> offsets() const { return m.offsets_d.span(); }

  // Nothing on the device changed: output all poison, pool as before.
  void expect_untouched() {
    synchronize();
    for (float x : m.out_d.to_host()) {
      std::uint32_t bits;
      std::memcpy(&bits, &x, 4);
      ASSERT_EQ(bits, 0xffffffffu) << "output written by a call that threw";
    }
    const std::vector<float> pool = m.pool.to_host();
    EXPECT_EQ(std::memcmp(pool.data(), pool_before.data(), pool.size() * 4), 0)
        << "pool written by a call that threw";
  }
};

TEST_F(BadInput, QueryHeadsNotAMultipleOfKvHeads) {
  KV_EXPECT_THROW(cuda::attention(m.key(), m.value(), q(), 3, offsets(), m.out_d.span()),
                  InvalidArgument, "n_q_heads 3", "n_kv_heads 2");
  KV_EXPECT_THROW(cuda::attention(m.key(), m.value(), q(), 0, offsets(), m.out_d.span()),
                  InvalidArgument, "n_q_heads 0");
  expect_untouched();
}

TEST_F(BadInput, HeadDimAboveTheLimit) {
  auto k = m.key(), v = m.value();
  k.head_dim = v.head_dim = 300;
  KV_EXPECT_THROW(cuda::attention(k, v, q(), m.n_q, offsets(), m.out_d.span()), InvalidArgument,
                  "head_dim 300", "256");
  KV_EXPECT_THROW(cuda::store_kv(k, v, std::span<const float>(m.k_new_d.span()),
                                 std::span<const float>(m.v_new_d.span()), offsets()),
                  InvalidArgument, "head_dim 300", "256");
  expect_untouched();
}

TEST_F(BadInput, SpanSizes) {
  KV_EXPECT_THROW(cuda::attention(m.key(), m.value(), q().first(q().size() - 1), m.n_q, offsets(),
                                  m.out_d.span()),
                  InvalidArgument, "q has");
  KV_EXPECT_THROW(cuda::attention(m.key(), m.value(), q(), m.n_q, offsets(),
                                  m.out_d.span().first(m.out_d.size() - 64)),
                  InvalidArgument, "out has");
  KV_EXPECT_THROW(
      cuda::attention(m.key(), m.value(), q(), m.n_q, offsets().first(2), m.out_d.span()),
      InvalidArgument, "row_offsets has 2", "3");
  KV_EXPECT_THROW(cuda::store_kv(m.key(), m.value(), std::span<const float>(m.k_new_d.span()),
                                 std::span<const float>(m.v_new_d.span()).first(64), offsets()),
                  InvalidArgument, "v_new has 64");
  expect_untouched();
}

TEST_F(BadInput, HostMemoryIsRejected) {
  std::vector<float> host_out(m.q.size());
  KV_EXPECT_THROW(cuda::attention(m.key(), m.value(), std::span<const float>(m.q), m.n_q, offsets(),
                                  m.out_d.span()),
                  InvalidArgument, "q is not device memory");
  KV_EXPECT_THROW(
      cuda::attention(m.key(), m.value(), q(), m.n_q, offsets(), std::span<float>(host_out)),
      InvalidArgument, "out is not device memory");
  auto k = m.key();
  k.blocks = m.host.blocks.data();
  auto v = m.value();
  v.blocks = m.host.blocks.data() + (static_cast<float*>(v.blocks) - m.pool.data());
  KV_EXPECT_THROW(cuda::attention(k, v, q(), m.n_q, offsets(), m.out_d.span()), InvalidArgument,
                  "key cache blocks is not device memory");
  expect_untouched();
}

TEST_F(BadInput, MismatchedKeyAndValueViews) {
  auto v = m.value();
  v.page_size = 8;
  KV_EXPECT_THROW(cuda::attention(m.key(), v, q(), m.n_q, offsets(), m.out_d.span()),
                  InvalidArgument, "page_size 16 vs 8");
  expect_untouched();
}

TEST_F(BadInput, Bf16PrecisionIsNotSupported) {
  AttentionOptions options;
  options.precision = AttentionPrecision::bf16;
  KV_EXPECT_THROW(
      cuda::attention(m.key(), m.value(), q(), m.n_q, offsets(), m.out_d.span(), options),
      InvalidArgument, "bf16");
  expect_untouched();
}

TEST_F(BadInput, DeviceCollectionChecksLayerAndHostDesc) {
  KV_EXPECT_THROW(m.dev.key(2), InvalidArgument, "layer 2", "2 layers");
  auto bad = m.host.desc;
  std::vector<std::uint32_t> lookup(m.host.lookup);
  lookup[0] = bad.num_blocks + 7;
  bad.lookup_table = lookup.data();
  KV_EXPECT_THROW(DeviceCollection<float>(bad, m.pool.data()), InvalidArgument,
                  std::to_string(bad.num_blocks + 7));
  KV_EXPECT_THROW(DeviceCollection<float>(m.host.desc, m.host.blocks.data()), InvalidArgument,
                  "not device memory");
}

TEST(DeviceBuffer, MoveAndSizeChecks) {
  std::vector<int> host{1, 2, 3, 4, 5};
  DeviceBuffer<int> a = DeviceBuffer<int>::from_host(host);
  int* p = a.data();
  DeviceBuffer<int> b(std::move(a));
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.to_host(), host);
  std::vector<int> wrong(4);
  KV_EXPECT_THROW(b.download(wrong), InvalidArgument, "4", "5");
  KV_EXPECT_THROW(b.upload(wrong), InvalidArgument, "4", "5");
  EXPECT_EQ(b.to_host(), host);
}

TEST(DeviceBuffer, HugeAllocationThrowsDeviceError) {
  KV_EXPECT_THROW(DeviceBuffer<char>(std::size_t{1} << 50), DeviceError, "cudaMalloc",
                  std::to_string(std::size_t{1} << 50));
  // The failure is not left behind for the next launch to report (seen on an
  // H200: the next store_kv threw "out of memory" from its launch check).
  std::mt19937 rng(7);
  Mirrored<float> m(Case{{{5, 3}}, true, 16, 2, 2, 64}, rng);
  EXPECT_NO_THROW(m.store_on_device());
  EXPECT_NO_THROW(m.attend_on_device());
  synchronize();
  const std::vector<float> ref = m.reference();  // also stores into the host pool
  EXPECT_TRUE(m.pools_equal());
  expect_close(m.out_d.to_host(), ref, 1e-5f, 1e-5f, "attention after a failed cudaMalloc");
}

}  // namespace
}  // namespace kvcache::cuda::test
