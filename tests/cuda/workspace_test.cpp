// kvcache::cuda::AttentionWorkspace (kvcache/cuda/workspace.h): one workspace
// reused across calls of different shapes, kernels and dtypes grows its
// scratch and never shrinks it; every call's output is bit-identical to the
// same call without a workspace (the same plan and kernels run) and within
// the reference bound; back-to-back calls on one stream share the scratch
// safely; a moved-from workspace is rejected with InvalidArgument and
// changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"

namespace kvcache::cuda::test {
namespace {

constexpr float kAbsTol = 1e-5f;
constexpr float kRelTol = 1e-5f;

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs c without a workspace, then twice back to back with ws (into two
// outputs, no synchronisation between: the second call reuses the scratch
// in stream order); all three must be equal bit for bit and close to the
// reference. Returns ws's capacity afterwards.
template <CacheElement T>
std::size_t check_reuse(const Case& c, std::uint32_t seed, const char* kernel,
                        AttentionWorkspace& ws) {
  SCOPED_TRACE(std::string(dtype_name(dtype_of_v<T>)) + " " + c.name());
  std::mt19937 rng(seed);
  Mirrored<T> m(c, rng);
  EXPECT_EQ(std::string(attention_kernel_name(m.key(), m.value())), kernel);
  m.store_on_device();
  m.attend_on_device(nullptr);
  DeviceBuffer<float> a(m.q.size()), b(m.q.size());
  a.fill_bytes(0xff);
  b.fill_bytes(0xff);
  m.attend_into(a, &ws);
  m.attend_into(b, &ws);
  synchronize();
  const std::vector<float> plain = m.out_d.to_host();
  EXPECT_TRUE(bitwise_equal(plain, a.to_host())) << "first call with the workspace";
  EXPECT_TRUE(bitwise_equal(plain, b.to_host())) << "second call with the workspace";
  expect_close(plain, m.reference(), kAbsTol, kRelTol, "attention");
  return ws.capacity_bytes();
}

TEST(CudaWorkspace, ReusedAcrossShapesAndDtypesGrowsAndMatches) {
  AttentionWorkspace ws;
  EXPECT_TRUE(ws.valid());
  EXPECT_GE(ws.device(), 0);
  EXPECT_EQ(ws.capacity_bytes(), 0u);
  // A full decode batch: no split, no scratch.
  std::vector<Entry> many(300, Entry{40, 1});
  const Case no_split{many, true, 16, 8, 1, 128};
  EXPECT_EQ(check_reuse<BFloat16>(no_split, 3000, "decode", ws), 0u);
  // Split decode, small: the first allocation.
  const Case small{{{6000, 1}}, true, 16, 2, 4, 128};
  const std::size_t c1 = check_reuse<BFloat16>(small, 3001, "decode", ws);
  EXPECT_GT(c1, 0u);
  // More rows and heads, longer: grows.
  const Case big{{{20011, 1}, {9001, 4}, {300, 3}}, true, 16, 2, 4, 128};
  const std::size_t c2 = check_reuse<float>(big, 3002, "decode", ws);
  EXPECT_GT(c2, c1);
  // The generic kernel (a 5-row entry) on the split path, another dtype.
  // Head dim 72: not one of the prefill kernel's (64, 80, 96, 128).
  const Case generic{{{9000, 1}, {10, 5}}, true, 16, 2, 2, 72, PageLayout::hnd};
  const std::size_t c3 = check_reuse<Half>(generic, 3003, "generic", ws);
  EXPECT_GE(c3, c2);
  // Odd head dim (scalar merge path) and a smaller call again: never shrinks.
  const Case odd{{{7000, 1}, {3, 6}}, false, 16, 1, 3, 33};
  EXPECT_EQ(check_reuse<BFloat16>(odd, 3004, "generic", ws), c3);
  EXPECT_EQ(check_reuse<Half>(small, 3005, "decode", ws), c3);
}

TEST(CudaWorkspace, MovedFromIsRejected) {
  AttentionWorkspace ws;
  AttentionWorkspace moved(std::move(ws));
  EXPECT_FALSE(ws.valid());  // NOLINT(bugprone-use-after-move): the documented state
  EXPECT_EQ(ws.device(), -1);
  EXPECT_EQ(ws.capacity_bytes(), 0u);
  EXPECT_TRUE(moved.valid());
  const Case c{{{5000, 1}, {20, 2}}, true, 16, 2, 4, 128};
  std::mt19937 rng(3100);
  Mirrored<BFloat16> m(c, rng);
  m.store_on_device();
  try {
    m.attend_on_device(&ws);
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("moved-from"), std::string::npos) << e.what();
  }
  synchronize();
  for (float x : m.out_d.to_host()) {
    ASSERT_TRUE(std::isnan(x)) << "the rejected call wrote the output";
  }
  // The moved-to workspace works; a moved-from one can be assigned to again.
  m.attend_on_device(&moved);
  synchronize();
  expect_close(m.out_d.to_host(), m.reference(), kAbsTol, kRelTol, "moved-to workspace");
  ws = std::move(moved);
  EXPECT_TRUE(ws.valid());
  EXPECT_GT(ws.capacity_bytes(), 0u);
}

}  // namespace
}  // namespace kvcache::cuda::test
