// The memory math at the edges of uint32_t / size_t (issue 39, item 2): the
// fuzz driver over its corpus and random inputs, a RapidCheck property, and
// the reported wrap as a regression.
#include "reliability/size_inputs.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace kvcache {
namespace {

std::filesystem::path corpus_dir() {
  return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "fuzz" / "corpus" / "sizes";
}

TEST(SizeInputs, CorpusReplays) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus_dir())) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
    EXPECT_NO_THROW(testing::run_size_inputs(bytes)) << entry.path();
    ++files;
  }
  EXPECT_GE(files, 2) << "the corpus in " << corpus_dir() << " is missing";
}

TEST(SizeInputs, RandomInputs) {
  std::mt19937 rng(20261127);
  for (int i = 0; i < 3000; ++i) {
    std::vector<std::uint8_t> bytes(24);
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    ASSERT_NO_THROW(testing::run_size_inputs(bytes)) << "input " << i;
  }
}

// The reported case: bf16, 64 layers, 64 KV heads, head_dim 256,
// max_batch_size 213005, max_seq_len 20647621 multiply to 2^64 + 4 MiB bytes.
// estimated_memory_size returned 4 MiB, the constructor succeeded and a later
// store wrote out of bounds.
TEST(SizeInputs, TheReportedWrapIsRefused) {
  KVCacheParams p;
  p.dtype = DType::bf16;
  p.num_layers = 64;
  p.n_kv_heads = 64;
  p.head_dim = 256;
  KV_EXPECT_THROW(ContinuousBatchingKVCacheManager::estimated_memory_size(p, 213005, 20647621),
                  InvalidArgument, "max_batch_size 213005", "max_seq_len 20647621",
                  "does not fit in 64 bits");
  KV_EXPECT_THROW(ContinuousBatchingKVCacheManager(p, 213005, 20647621), InvalidArgument, "213005");
  p.cache_strategy = CacheStrategy::paged;
  p.page_size = 4294967295u;
  KV_EXPECT_THROW(PagedKVCacheManager::estimated_memory_size(p, 4294967294u), InvalidArgument,
                  "total_num_pages 4294967294", "page_size 4294967295");
  KV_EXPECT_THROW(PagedKVCacheManager(p, 4294967294u, 1, 16), InvalidArgument, "64 bits");
}

// For any sizes: the exact product or InvalidArgument.
RC_GTEST_PROP(SizeProperty, EstimatedMemoryIsExactOrRefused, ()) {
  const auto edge = [] {
    return *rc::gen::oneOf(
        rc::gen::inRange<std::uint32_t>(1, 300),
        rc::gen::element(65536u, 2147483647u, 2147483648u, 4294967294u, 4294967295u),
        rc::gen::arbitrary<std::uint32_t>());
  };
  KVCacheParams p;
  p.dtype = *rc::gen::element(DType::f32, DType::f16, DType::bf16);
  p.num_layers = edge();
  p.n_kv_heads = edge();
  p.head_dim = edge();
  const std::uint32_t batch = edge(), seq = edge();
  try {
    p.validate();
  } catch (const InvalidArgument&) {
    RC_SUCCEED("params refused");
  }
  using u128 = unsigned __int128;
  const u128 exact = u128{batch} * seq * p.bytes_per_token();
  try {
    const std::size_t got = ContinuousBatchingKVCacheManager::estimated_memory_size(p, batch, seq);
    RC_ASSERT(exact <= u128{UINT64_MAX});
    RC_ASSERT(u128{got} == exact);
  } catch (const InvalidArgument&) {
    RC_ASSERT(exact > u128{UINT64_MAX});
  }
}

}  // namespace
}  // namespace kvcache
