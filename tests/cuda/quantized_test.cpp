// The CUDA kernels on 8-bit caches (fp8_e4m3, fp8_e5m2, int8): store_kv
// must write the same bytes as store_kv_reference (codes and int8 page
// scales), attention must match attention_reference on the same codes within
// the f32 bound (|cuda - ref| <= 1e-5 + 1e-5 |ref|: fp32 rounding of another
// order). Random data and history, shuffled tables, both layouts and pool
// arrangements, paged and continuous, odd head dims, GQA, contexts on the
// split path; RoPE fused into the quantising store; the fp8 scales through
// DeviceCollection; bad input refused; and a real manager mirrored on the
// device step by step (with fork, whose copy-on-write moves int8 scales
// with the page).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/quant_cache.h"
#include "kvcache/kvcache.h"
#include "test_util.h"

namespace kvcache::cuda::test {
namespace {

using kvcache::test::Cache;

constexpr DType kTypes[] = {DType::fp8_e4m3, DType::fp8_e5m2, DType::int8};

// A host Cache's pool and metadata on the device, through DeviceCollection
// (which uploads the fp8 scales).
template <class T>
struct DeviceCache {
  DeviceBuffer<T> pool;
  DeviceCollection<T> dev;
  explicit DeviceCache(const Cache& c)
      : pool(DeviceBuffer<T>::from_host(std::span<const T>(
            reinterpret_cast<const T*>(c.bytes.data()), c.desc.pool_elements()))),
        dev(c.desc, pool.data()) {}
  std::vector<std::uint8_t> bytes() const {
    const std::vector<T> h = pool.to_host();
    std::vector<std::uint8_t> out(h.size());
    std::memcpy(out.data(), h.data(), h.size());
    return out;
  }
};

struct QCase {
  DType dtype;
  std::vector<Entry> entries;
  bool paged = true;
  std::uint32_t page = 16, n_kv = 2, group = 1, dim = 64;
  PageLayout layout = PageLayout::nhd;
  PoolArrangement arrangement = PoolArrangement::interleaved;
  std::string name() const {
    return std::string(dtype_name(dtype)) + (paged ? " paged" : " continuous") + " page " +
           std::to_string(page) + " kv " + std::to_string(n_kv) + " group " +
           std::to_string(group) + " dim " + std::to_string(dim) + " " +
           std::string(layout_name(layout)) + " " + std::string(arrangement_name(arrangement));
  }
};

void expect_same_bytes(const std::vector<std::uint8_t>& device, const Cache& ref,
                       const std::string& what) {
  const std::size_t n = ref.desc.pool_elements();
  ASSERT_EQ(device.size(), n);
  std::size_t diffs = 0, first = n;
  for (std::size_t i = 0; i < n; ++i) {
    if (device[i] != ref.bytes[i]) {
      if (first == n) first = i;
      ++diffs;
    }
  }
  EXPECT_EQ(diffs, 0u) << what << ": " << diffs
                       << " bytes differ from store_kv_reference, first at " << first;
}

// store_kv then attention on the device vs the references on the host:
// attention through the kernel the call takes (returned) and through the
// generic kernel (detail::DecodeTuning::generic).
std::string check_case(const QCase& c, std::uint64_t seed) {
  SCOPED_TRACE(c.name());
  std::mt19937 rng(static_cast<std::mt19937::result_type>(seed));
  Cache ref(c.dtype, c.entries, c.paged, c.page, c.n_kv, c.dim, c.layout, c.arrangement, rng);
  const std::uint32_t n_q = c.n_kv * c.group;
  const auto k_new =
      kvcache::test::random_floats(std::size_t{ref.rows()} * c.n_kv * c.dim, -1, 1, rng);
  const auto v_new = kvcache::test::random_floats(k_new.size(), -1, 1, rng);
  const auto q = kvcache::test::random_floats(std::size_t{ref.rows()} * n_q * c.dim, -2, 2, rng);
  std::string kernel;
  visit_dtype(c.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_quantized(dtype_of_v<T>)) {
      DeviceCache<T> d(ref);  // the history, before the references write
      const auto k_d = DeviceBuffer<float>::from_host(k_new);
      const auto v_d = DeviceBuffer<float>::from_host(v_new);
      const auto q_d = DeviceBuffer<float>::from_host(q);
      const auto rows_d = DeviceBuffer<std::uint32_t>::from_host(ref.row_offsets);
      DeviceBuffer<float> out_d(q.size()), generic_d(q.size());
      out_d.fill_bytes(0xff);  // NaN poison
      generic_d.fill_bytes(0xff);
      const CacheDesc k = d.dev.key(1), v = d.dev.value(1);
      kernel = attention_kernel_name(k, v);
      cuda::store_kv(k, v, k_d.span(), v_d.span(), rows_d.span());
      cuda::attention(k, v, q_d.span(), n_q, rows_d.span(), out_d.span());
      detail::DecodeTuning generic;
      generic.generic = true;
      detail::attention_cuda_tuned(c.dtype, k, v, q_d.span(), n_q, rows_d.span(), generic_d.span(),
                                   {}, nullptr, nullptr, generic);
      synchronize();
      kvcache::test::reference_store(ref, k_new, v_new);
      std::vector<float> out_ref(q.size());
      kvcache::test::reference_attention(ref, q, n_q, out_ref);
      expect_same_bytes(d.bytes(), ref, "store_kv");
      expect_close(out_d.to_host(), out_ref, 1e-5f, 1e-5f, "attention (" + kernel + ")");
      expect_close(generic_d.to_host(), out_ref, 1e-5f, 1e-5f, "attention (generic)");
    }
  });
  return kernel;
}

std::vector<Entry> mixed_batch() { return {{700, 1}, {0, 19}, {61, 7}, {3, 1}, {33, 3}}; }

TEST(CudaQuantized, LayoutsArrangementsStrategies) {
  std::uint64_t seed = 1;
  for (DType t : kTypes)
    for (PageLayout layout : {PageLayout::nhd, PageLayout::hnd})
      for (PoolArrangement arr : {PoolArrangement::interleaved, PoolArrangement::per_layer})
        for (bool paged : {true, false}) {
          QCase c{.dtype = t, .entries = mixed_batch()};
          c.paged = paged;
          c.layout = layout;
          c.arrangement = arr;
          c.group = 4;
          check_case(c, seed++);
        }
}

TEST(CudaQuantized, HeadDimsGroupsAndPageSizes) {
  std::uint64_t seed = 100;
  for (DType t : kTypes)
    for (std::uint32_t dim : {4u, 20u, 36u, 128u, 256u})
      for (std::uint32_t group : {1u, 3u, 8u})
        for (std::uint32_t page : {1u, 5u, 16u}) {
          QCase c{.dtype = t, .entries = {{45, 1}, {9, 6}, {0, 2}}};
          c.dim = dim;
          c.group = group;
          c.page = page;
          c.n_kv = 3;
          check_case(c, seed++);
        }
  // fp8 takes head dims that are not multiples of 4 (no 16-byte loads).
  for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    QCase c{.dtype = t, .entries = mixed_batch()};
    c.dim = 19;
    c.page = 7;
    check_case(c, seed++);
  }
}

// Decode steps (at most 4 new rows per entry) with 16-byte rows take the
// decode kernel: every layout, arrangement, head dim 16..256, GQA 1..8.
TEST(CudaQuantized, DecodeKernel) {
  std::uint64_t seed = 200;
  const std::vector<Entry> decode_batch{{700, 1}, {33, 3}, {0, 4}, {61, 2}, {5, 1}};
  for (DType t : kTypes)
    for (PageLayout layout : {PageLayout::nhd, PageLayout::hnd})
      for (PoolArrangement arr : {PoolArrangement::interleaved, PoolArrangement::per_layer})
        for (std::uint32_t dim : {16u, 64u, 128u, 256u})
          for (std::uint32_t group : {1u, 4u, 8u}) {
            QCase c{.dtype = t, .entries = decode_batch};
            c.layout = layout;
            c.arrangement = arr;
            c.dim = dim;
            c.group = group;
            c.n_kv = 4;
            EXPECT_EQ(check_case(c, seed++), "decode") << c.name();
          }
}

TEST(CudaQuantized, LongContextsTakeTheSplitPath) {
  std::uint64_t seed = 300;
  for (DType t : kTypes) {
    QCase c{.dtype = t, .entries = {{20000, 1}, {5000, 2}}};
    c.dim = 128;
    c.n_kv = 8;
    c.group = 4;
    EXPECT_EQ(check_case(c, seed++), "decode");
  }
}

// RoPE fused into the quantising store, against rotating with
// apply_rope_reference and storing with store_kv_reference. The device's
// cos / sin may differ from the host's in the last bit of a float within a
// few double ulps of a rounding boundary, and a code then by one step: at
// most that, and rarely.
TEST(CudaQuantized, StoreWithRope) {
  std::mt19937 rng(9);
  for (DType t : kTypes)
    for (PageLayout layout : {PageLayout::nhd, PageLayout::hnd}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::string(layout_name(layout)));
      const std::uint32_t n_kv = 2, dim = 64;
      Cache ref(t, {{13, 5}, {70000, 20}}, true, 16, n_kv, dim, layout,
                PoolArrangement::interleaved, rng);
      auto k_new = kvcache::test::random_floats(std::size_t{ref.rows()} * n_kv * dim, -1, 1, rng);
      const auto v_new = kvcache::test::random_floats(k_new.size(), -1, 1, rng);
      RopeOptions rope;
      rope.enabled = true;
      rope.theta = 10000.0f;
      rope.rotary_dim = 48;  // a partial rotation
      visit_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (is_quantized(dtype_of_v<T>)) {
          DeviceCache<T> d(ref);
          const auto k_d = DeviceBuffer<float>::from_host(k_new);
          const auto v_d = DeviceBuffer<float>::from_host(v_new);
          const auto rows_d = DeviceBuffer<std::uint32_t>::from_host(ref.row_offsets);
          StoreOptions options;
          options.rope_k = rope;
          cuda::store_kv(d.dev.key(1), d.dev.value(1), k_d.span(), v_d.span(), rows_d.span(),
                         options);
          synchronize();
          const std::vector<std::uint8_t> got = d.bytes();
          for (std::uint32_t b = 0; b < 2; ++b)
            for (std::uint32_t r = ref.row_offsets[b]; r < ref.row_offsets[b + 1]; ++r) {
              const std::uint32_t pos = ref.cache_lengths[b] + (r - ref.row_offsets[b]);
              apply_rope_reference(std::span<float>(k_new).subspan(std::size_t{r} * n_kv * dim,
                                                                   std::size_t{n_kv} * dim),
                                   n_kv, dim, pos, rope);
            }
          kvcache::test::reference_store(ref, k_new, v_new);
          std::size_t diffs = 0;
          for (std::size_t i = 0; i < ref.desc.pool_elements(); ++i) {
            if (got[i] == ref.bytes[i]) continue;
            ++diffs;
            if (dtype_of_v<T> != DType::int8) {  // an int8 scale byte may differ in any bit
              EXPECT_LE(std::abs(int(got[i]) - int(ref.bytes[i])), 1) << "byte " << i;
            }
          }
          EXPECT_LE(diffs, ref.desc.pool_elements() / 1000) << diffs << " bytes differ";
        }
      });
    }
}

// The fp8 scales reach the kernels only through the descriptor: doubling
// every V scale on the host doubles the device's output after update().
TEST(CudaQuantized, Fp8ScalesFollowTheHostDescriptor) {
  std::mt19937 rng(77);
  Cache c(DType::fp8_e4m3, {{40, 1}, {7, 1}}, true, 16, 2, 64, PageLayout::nhd,
          PoolArrangement::interleaved, rng);
  const std::uint32_t n_q = 4;
  const auto q = kvcache::test::random_floats(std::size_t{c.rows()} * n_q * 64, -2, 2, rng);
  DeviceCache<Fp8E4M3> d(c);
  const auto q_d = DeviceBuffer<float>::from_host(q);
  const auto rows_d = DeviceBuffer<std::uint32_t>::from_host(c.row_offsets);
  // Attend over history only: zero new rows would not query, so one new
  // row each that store_kv writes first.
  const auto kv_new = kvcache::test::random_floats(std::size_t{c.rows()} * 2 * 64, -1, 1, rng);
  const auto kv_d = DeviceBuffer<float>::from_host(kv_new);
  cuda::store_kv(d.dev.key(1), d.dev.value(1), kv_d.span(), kv_d.span(), rows_d.span());
  DeviceBuffer<float> out1(q.size()), out2(q.size());
  cuda::attention(d.dev.key(1), d.dev.value(1), q_d.span(), n_q, rows_d.span(), out1.span());
  synchronize();
  Cache doubled(c);
  for (std::uint32_t h = 0; h < 2; ++h) doubled.head_scales[(1 * 2 + 1) * 2 + h] *= 2.0f;
  d.dev.update(doubled.desc);
  cuda::attention(d.dev.key(1), d.dev.value(1), q_d.span(), n_q, rows_d.span(), out2.span());
  synchronize();
  const std::vector<float> a = out1.to_host(), b = out2.to_host();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_FLOAT_EQ(b[i], 2.0f * a[i]) << i;
}

TEST(CudaQuantized, BadInputChangesNothing) {
  std::mt19937 rng(5);
  Cache c(DType::fp8_e5m2, {{10, 2}}, true, 16, 2, 64, PageLayout::nhd,
          PoolArrangement::interleaved, rng);
  DeviceCache<Fp8E5M2> d(c);
  const std::vector<std::uint8_t> before = d.bytes();
  const auto kv_d = DeviceBuffer<float>::from_host(
      kvcache::test::random_floats(std::size_t{c.rows()} * 2 * 64, -1, 1, rng));
  const auto rows_d = DeviceBuffer<std::uint32_t>::from_host(c.row_offsets);
  CacheDesc k = d.dev.key(1), v = d.dev.value(1);
  k.head_scales = nullptr;
  KV_EXPECT_THROW(cuda::store_kv(k, v, kv_d.span(), kv_d.span(), rows_d.span()), InvalidArgument,
                  "fp8_e5m2", "head_scales");
  k = d.dev.key(1);
  k.head_scales = c.head_scales.data();  // host memory
  KV_EXPECT_THROW(cuda::store_kv(k, v, kv_d.span(), kv_d.span(), rows_d.span()), InvalidArgument,
                  "key head_scales", "not device memory");
  DeviceBuffer<float> out(std::size_t{c.rows()} * 2 * 64);
  KV_EXPECT_THROW(cuda::attention(k, v, kv_d.span(), 2, rows_d.span(), out.span()), InvalidArgument,
                  "key head_scales");
  synchronize();
  EXPECT_EQ(d.bytes(), before);
}

// A real manager with an 8-bit cache, its pool mirrored on the device: each
// step's K/V/q through DeviceCollection + the CUDA kernels and through the
// CPU kernels on the manager's host pool; pools equal byte for byte, outputs
// within the f32 bound. Fork + a write into the shared page: copy_blocks
// moves the page with its int8 scales.
class QuantizedManagerFlow : public ::testing::TestWithParam<DType> {
 protected:
  static constexpr std::uint32_t kLayers = 2, kKv = 2, kGroup = 4, kDim = 64, kPage = 16;
  KVCacheParams params{.dtype = GetParam(),
                       .num_layers = kLayers,
                       .n_kv_heads = kKv,
                       .head_dim = kDim,
                       .cache_strategy = CacheStrategy::paged,
                       .page_size = kPage};
  PagedKVCacheManager manager{params, 64, 8, 1024};
  std::mt19937 rng{31};

  void SetUp() override {
    if (is_fp8(GetParam())) {
      std::vector<float> ks(kLayers * kKv), vs(kLayers * kKv);
      for (auto& x : ks) x = std::uniform_real_distribution<float>(0.002f, 0.004f)(rng);
      for (auto& x : vs) x = std::uniform_real_distribution<float>(0.002f, 0.004f)(rng);
      manager.set_kv_scales(KVScales(kLayers, kKv, ks, vs));
    }
  }

  template <class T>
  void step(DeviceBuffer<T>& pool, const std::vector<SeqId>& seqs,
            const std::vector<std::uint32_t>& new_tokens) {
    std::vector<std::uint32_t> rows(seqs.size() + 1, 0);
    std::partial_sum(new_tokens.begin(), new_tokens.end(), rows.begin() + 1);
    const std::size_t total = rows.back();
    const std::uint32_t n_q = kKv * kGroup;
    KVCacheBatch batch = manager.fetch(seqs, new_tokens);
    const CacheDesc host = batch.desc();
    auto* host_pool = static_cast<T*>(host.blocks);
    if (pool.empty()) {
      pool = DeviceBuffer<T>::from_host(std::span<const T>(host_pool, host.pool_elements()));
    }
    DeviceCollection<T> dev(host, pool.data());
    copy_blocks(host, pool.data(), batch.block_copies());
    const auto rows_d = DeviceBuffer<std::uint32_t>::from_host(rows);
    for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
      const auto k_new = kvcache::test::random_floats(total * kKv * kDim, -1, 1, rng);
      const auto v_new = kvcache::test::random_floats(total * kKv * kDim, -1, 1, rng);
      const auto q = kvcache::test::random_floats(total * n_q * kDim, -1, 1, rng);
      const auto k_d = DeviceBuffer<float>::from_host(k_new);
      const auto v_d = DeviceBuffer<float>::from_host(v_new);
      const auto q_d = DeviceBuffer<float>::from_host(q);
      DeviceBuffer<float> out_d(q.size());
      out_d.fill_bytes(0xff);
      cuda::store_kv(dev.key(layer), dev.value(layer), k_d.span(), v_d.span(), rows_d.span());
      cuda::attention(dev.key(layer), dev.value(layer), q_d.span(), n_q, rows_d.span(),
                      out_d.span());
      const CacheDesc hk = host.layer(layer, 0), hv = host.layer(layer, 1);
      kvcache::store_kv(hk, hv, k_new, v_new, rows);
      std::vector<float> ref(q.size());
      kvcache::attention(hk, hv, q, n_q, rows, ref);
      synchronize();
      expect_close(out_d.to_host(), ref, 1e-5f, 1e-5f, "attention through the manager");
    }
    const std::vector<T> d = pool.to_host();
    EXPECT_EQ(std::memcmp(d.data(), host_pool, d.size()), 0)
        << "device pool differs from the manager's host pool";
    manager.step(seqs, new_tokens);
  }
};

TEST_P(QuantizedManagerFlow, PrefillDecodeForkCopyOnWrite) {
  visit_dtype(GetParam(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_quantized(dtype_of_v<T>)) {
      DeviceBuffer<T> pool;
      const std::vector<SeqId> s = manager.claim(2);
      step(pool, s, {37, 5});
      step(pool, s, {1, 1});
      const SeqId child = manager.fork(s[0]);  // shares a partly filled page
      step(pool, {s[0], child}, {1, 2});       // both write into it: a copy
      step(pool, {s[0], s[1], child}, {1, 1, 1});
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizedManagerFlow,
                         ::testing::Values(DType::fp8_e4m3, DType::fp8_e5m2, DType::int8),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace kvcache::cuda::test
