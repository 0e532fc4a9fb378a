// 8-bit store_kv byte for byte against store_kv_reference on the managers'
// 64-byte-aligned pools: calls large enough for the non-temporal stores
// (store_q8-inl.h) and small ones, both layouts, 1 and 2 threads, with
// int8 rounding ties (x * 127 / absmax landing on k + 0.5) in the input.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/paged_manager.h"
#include "kvcache/thread_pool.h"

namespace kvcache {
namespace {

using U32 = std::vector<std::uint32_t>;
constexpr std::uint32_t kHeads = 8, kDim = 128, kPage = 16, kPages = 300;

KVCacheParams params_of(DType dtype, PageLayout layout) {
  return KVCacheParams{.dtype = dtype,
                       .num_layers = 1,
                       .n_kv_heads = kHeads,
                       .head_dim = kDim,
                       .cache_strategy = CacheStrategy::paged,
                       .page_size = kPage,
                       .page_layout = layout};
}

// Random rows in [-2, 2]; the first head of every 5th row holds ties: its
// absmax is 127, so int8 codes it at scale 1 and x.5 rounds to even.
std::vector<float> input(std::size_t rows, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> x(rows * kHeads * kDim);
  for (float& e : x) e = u(rng);
  for (std::size_t r = 0; r < rows; r += 5) {
    float* head = x.data() + r * kHeads * kDim;
    head[0] = 127.0f;
    for (std::uint32_t d = 1; d < kDim; ++d) head[d] = static_cast<float>(int(d % 9) - 4) + 0.5f;
  }
  return x;
}

struct Pair {
  PagedKVCacheManager ref, fast;
  std::vector<SeqId> ref_seqs, fast_seqs;
  explicit Pair(const KVCacheParams& p)
      : ref(p, kPages, 2, kPages * kPage), fast(p, kPages, 2, kPages * kPage) {
    if (is_fp8(p.dtype)) {
      std::mt19937 rng(3);
      std::uniform_real_distribution<float> s(0.001f, 0.01f);
      std::vector<float> k(kHeads), v(kHeads);
      for (float& e : k) e = s(rng);
      for (float& e : v) e = s(rng);
      const KVScales scales(1, kHeads, k, v);
      ref.set_kv_scales(scales);
      fast.set_kv_scales(scales);
    }
    ref_seqs = ref.claim(2);
    fast_seqs = fast.claim(2);
  }
  // Stores `news` tokens per sequence in both (reference, fast) and commits them.
  void store(const U32& news, std::size_t threads, std::mt19937& rng) {
    const std::uint32_t rows = news[0] + news[1];
    const auto k = input(rows, rng), v = input(rows, rng);
    const U32 offsets{0, news[0], rows};
    const KVCacheBatch rb = ref.fetch(ref_seqs, news), fb = fast.fetch(fast_seqs, news);
    visit_dtype(ref.params().dtype, [&](auto tag) {
      using T = decltype(tag);
      const auto col = rb.paged<T>();
      store_kv_reference(col.get_key_cache(0), col.get_value_cache(0), std::span(k), std::span(v),
                         std::span<const std::uint32_t>(offsets));
    });
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(fb.blocks(0)) % 64, 0u);
    ThreadPool pool(threads);
    const CacheDesc d = fb.desc();
    store_kv(d.layer(0, 0), d.layer(0, 1), k, v, offsets, {}, &pool);
    ref.step(ref_seqs, news);
    fast.step(fast_seqs, news);
  }
  bool same() {
    const std::size_t bytes = PagedKVCacheManager::estimated_memory_size(ref.params(), kPages);
    const KVCacheBatch rb = ref.fetch(ref_seqs);
    const KVCacheBatch fb = fast.fetch(fast_seqs);
    return std::memcmp(rb.blocks(0), fb.blocks(0), bytes) == 0;
  }
};

TEST(StoreQ8, LargeStreamingAndSmallCallsMatchTheReference) {
  // 4,200 rows of 8 x 128 codes, K and V: 8.6 MB, above kStoreStreamingBytes.
  static_assert(2 * std::size_t{4200} * kHeads * kDim >= kStoreStreamingBytes);
  std::mt19937 rng(21);
  for (DType dtype : {DType::int8, DType::fp8_e4m3, DType::fp8_e5m2}) {
    for (PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
      for (std::size_t threads : {1u, 2u}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::string(layout_name(layout)) +
                     " threads " + std::to_string(threads));
        Pair p(params_of(dtype, layout));
        p.store(U32{3037, 1163}, threads, rng);  // streaming
        EXPECT_TRUE(p.same()) << "large call";
        p.store(U32{1, 3}, threads, rng);  // decode-sized: plain stores
        EXPECT_TRUE(p.same()) << "small call";
      }
    }
  }
}

}  // namespace
}  // namespace kvcache
