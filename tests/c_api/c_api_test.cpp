// The C interface (kvcache/c_api.h): the lifecycle through it against a
// float64 oracle, the memory layout its header documents read back element by
// element, the prefix cache / fork / truncate / multistep calls, and every
// error path: status, a message naming the value, and nothing changed.
//
// Attention bound: |out - oracle| <= 4e-6 + 4e-6 * |oracle| per element, the
// fast kernel's bound against the fp32 reference (tests/kernels/
// attention_test.cpp: 2e-6 + 2e-6 relative) plus as much again for the
// reference's own fp32 rounding against float64.
#include "kvcache/c_api.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using kvtest::U32;

// Owns the C handles of one test.
struct Handles {
  kvc_manager* manager = nullptr;
  kvc_batch* batch = nullptr;
  kvc_thread_pool* pool = nullptr;
  Handles() = default;
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;
  ~Handles() {
    kvc_batch_destroy(batch);
    kvc_manager_destroy(manager);
    kvc_thread_pool_destroy(pool);
  }
};

kvc_params make_params(kvc_dtype dtype, kvc_strategy strategy, kvc_page_layout layout,
                       std::uint32_t page_size, std::uint32_t n_kv, std::uint32_t dim,
                       int prefix_caching = 0) {
  kvc_params p{};
  p.dtype = dtype;
  p.num_layers = 2;
  p.n_kv_heads = n_kv;
  p.head_dim = dim;
  p.strategy = strategy;
  p.page_size = strategy == KVC_STRATEGY_PAGED ? page_size : 0;
  p.enable_prefix_caching = prefix_caching;
  p.page_layout = layout;
  return p;
}

// KVC_ASSERT_OK(call): `call`, which passes &kvc_err_ (declared here) as its
// kvc_error*, returns KVC_OK; otherwise the test stops with the message.
#define KVC_ASSERT_OK(call)                                         \
  do {                                                              \
    kvc_error kvc_err_{};                                           \
    const kvc_status kvc_s_ = (call);                               \
    ASSERT_EQ(kvc_s_, KVC_OK) << #call << ": " << kvc_err_.message; \
  } while (0)

// Calls fn(&err); expects `status` and a message containing every needle.
template <class F>
void expect_status(F&& fn, kvc_status status, std::initializer_list<std::string> needles) {
  kvc_error err{};
  err.status = KVC_OK;
  const kvc_status got = fn(&err);
  EXPECT_EQ(got, status) << kvc_status_name(got) << ": " << err.message;
  EXPECT_EQ(err.status, got);
  const std::string msg = err.message;
  for (const auto& n : needles) {
    EXPECT_NE(msg.find(n), std::string::npos) << "message '" << msg << "' lacks '" << n << "'";
  }
}

std::size_t dtype_bytes(std::int32_t d) { return d == KVC_DTYPE_F32 ? 4 : 2; }

float quantized(kvc_dtype d, float x) {
  switch (d) {
    case KVC_DTYPE_F16:
      return kvtest::quantize<kvcache::Half>(x);
    case KVC_DTYPE_BF16:
      return kvtest::quantize<kvcache::BFloat16>(x);
    default:
      return x;
  }
}

// The element the header's layout formula names.
float element_at(const kvc_cache_desc& d, std::uint32_t b, std::uint32_t kv, std::uint32_t layer,
                 std::uint32_t pos, std::uint32_t h, std::uint32_t dd) {
  const std::uint32_t block = d.lookup_table[std::size_t{b} * d.lookup_stride + pos / d.page_size];
  const std::size_t t = pos % d.page_size;
  std::size_t base = (std::size_t{block} * 2 + kv) * d.num_layers + layer;
  const std::size_t off = d.layout == KVC_LAYOUT_NHD
                              ? ((base * d.page_size + t) * d.n_kv_heads + h) * d.head_dim + dd
                              : ((base * d.n_kv_heads + h) * d.page_size + t) * d.head_dim + dd;
  // The header's stride formula names the same element.
  const std::uint64_t by_strides = layer * d.layer_stride + kv * d.kv_stride +
                                   block * d.block_stride + t * d.token_stride + h * d.head_stride +
                                   dd;
  EXPECT_EQ(by_strides, off);
  const auto* bytes = static_cast<const unsigned char*>(d.blocks) + off * dtype_bytes(d.dtype);
  switch (d.dtype) {
    case KVC_DTYPE_F16: {
      kvcache::Half x;
      std::memcpy(&x, bytes, 2);
      return kvcache::to_float(x);
    }
    case KVC_DTYPE_BF16: {
      kvcache::BFloat16 x;
      std::memcpy(&x, bytes, 2);
      return kvcache::to_float(x);
    }
    default: {
      float x;
      std::memcpy(&x, bytes, 4);
      return x;
    }
  }
}

struct LifecycleCase {
  kvc_dtype dtype;
  kvc_strategy strategy;
  kvc_page_layout layout;
};

class CApiLifecycle : public ::testing::TestWithParam<LifecycleCase> {};

// Three sequences through prefill, two decode steps and a mixed step, K/V,
// queries random; every step's output against the oracle over what the
// sequences stored, and every stored element read back through the
// documented layout.
TEST_P(CApiLifecycle, MatchesOracleAndTheDocumentedLayout) {
  const LifecycleCase c = GetParam();
  constexpr std::uint32_t kKv = 2, kQ = 4, kDim = 40, kLayer = 1;
  Handles hd;
  const kvc_params params = make_params(c.dtype, c.strategy, c.layout, 7, kKv, kDim);
  KVC_ASSERT_OK(kvc_manager_create(&params, c.strategy == KVC_STRATEGY_PAGED ? 40 : 0, 4, 96,
                                   &hd.manager, &kvc_err_));
  KVC_ASSERT_OK(kvc_batch_create(&hd.batch, &kvc_err_));
  std::uint64_t seqs[3];
  KVC_ASSERT_OK(kvc_claim(hd.manager, 3, seqs, &kvc_err_));

  std::mt19937_64 rng(17 + static_cast<int>(c.dtype) * 4 + static_cast<int>(c.layout) * 2 +
                      static_cast<int>(c.strategy));
  std::vector<kvtest::SeqKV> history(3);
  U32 cache_len = {0, 0, 0};
  const std::vector<U32> steps = {{5, 13, 1}, {1, 1, 1}, {1, 1, 1}, {9, 1, 3}};
  for (const U32& counts : steps) {
    KVC_ASSERT_OK(kvc_fetch(hd.manager, hd.batch, seqs, counts.data(), 3, 1, &kvc_err_));
    const U32 ro = kvtest::offsets_of(counts);
    const std::size_t rows = ro.back();
    const std::vector<float> k = kvtest::random_vec(rng, rows * kKv * kDim);
    const std::vector<float> v = kvtest::random_vec(rng, rows * kKv * kDim);
    const std::vector<float> q = kvtest::random_vec(rng, rows * kQ * kDim);
    std::vector<float> out(q.size(), 0.0f);
    KVC_ASSERT_OK(
        kvc_store_kv(hd.batch, kLayer, k.data(), v.data(), ro.data(), nullptr, nullptr, &kvc_err_));
    KVC_ASSERT_OK(kvc_attention(hd.batch, kLayer, q.data(), kQ, ro.data(), out.data(), nullptr,
                                nullptr, &kvc_err_));
    for (std::uint32_t b = 0; b < 3; ++b) {
      for (std::size_t i = ro[b] * kKv * kDim; i < ro[b + 1] * kKv * kDim; ++i) {
        history[b].k.push_back(quantized(c.dtype, k[i]));
        history[b].v.push_back(quantized(c.dtype, v[i]));
      }
    }
    const std::vector<double> want =
        kvtest::attention_f64(history, cache_len, ro, q, kQ, kKv, kDim);
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(out[i], want[i], 4e-6 + 4e-6 * std::fabs(want[i])) << "element " << i;
    }

    kvc_cache_desc d{};
    KVC_ASSERT_OK(kvc_batch_describe(hd.batch, &d, &kvc_err_));
    ASSERT_EQ(d.batch_size, 3u);
    ASSERT_EQ(d.strategy, static_cast<std::int32_t>(c.strategy));
    ASSERT_EQ(d.layout, static_cast<std::int32_t>(c.layout));
    ASSERT_EQ(d.dtype, static_cast<std::int32_t>(c.dtype));
    ASSERT_EQ(d.page_size, c.strategy == KVC_STRATEGY_PAGED ? 7u : 96u);
    for (std::uint32_t b = 0; b < 3; ++b) {
      ASSERT_EQ(d.seq_ids[b], seqs[b]);
      ASSERT_EQ(d.cache_lengths[b], cache_len[b]);
      const std::uint32_t len = cache_len[b] + counts[b];
      for (std::uint32_t pos = 0; pos < len; ++pos)
        for (std::uint32_t h = 0; h < kKv; ++h)
          for (std::uint32_t dd = 0; dd < kDim; ++dd) {
            const std::size_t i = (std::size_t{pos} * kKv + h) * kDim + dd;
            ASSERT_EQ(element_at(d, b, 0, kLayer, pos, h, dd), history[b].k[i])
                << "K entry " << b << " pos " << pos;
            ASSERT_EQ(element_at(d, b, 1, kLayer, pos, h, dd), history[b].v[i])
                << "V entry " << b << " pos " << pos;
          }
    }
    KVC_ASSERT_OK(kvc_step(hd.manager, seqs, counts.data(), 3, nullptr, &kvc_err_));
    for (std::uint32_t b = 0; b < 3; ++b) cache_len[b] += counts[b];
  }
  for (std::uint32_t b = 0; b < 3; ++b) {
    std::uint32_t len = 0;
    KVC_ASSERT_OK(kvc_cache_length(hd.manager, seqs[b], &len, &kvc_err_));
    EXPECT_EQ(len, cache_len[b]);
    KVC_ASSERT_OK(kvc_release(hd.manager, seqs[b], KVC_REUSE_UNKNOWN, &kvc_err_));
  }
  kvc_manager_stats s{};
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &s, &kvc_err_));
  EXPECT_EQ(s.active_sequences, 0u);
  EXPECT_EQ(s.free_blocks, s.total_blocks);
  KVC_ASSERT_OK(kvc_check_invariants(hd.manager, &kvc_err_));
}

INSTANTIATE_TEST_SUITE_P(
    DtypesLayoutsStrategies, CApiLifecycle,
    ::testing::Values(LifecycleCase{KVC_DTYPE_F32, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD},
                      LifecycleCase{KVC_DTYPE_F16, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD},
                      LifecycleCase{KVC_DTYPE_BF16, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD},
                      LifecycleCase{KVC_DTYPE_BF16, KVC_STRATEGY_PAGED, KVC_LAYOUT_HND},
                      LifecycleCase{KVC_DTYPE_F32, KVC_STRATEGY_CONTINUOUS, KVC_LAYOUT_HND},
                      LifecycleCase{KVC_DTYPE_F16, KVC_STRATEGY_CONTINUOUS, KVC_LAYOUT_NHD}),
    [](const ::testing::TestParamInfo<LifecycleCase>& info) {
      const LifecycleCase& c = info.param;
      const char* dtype = c.dtype == KVC_DTYPE_F32   ? "f32"
                          : c.dtype == KVC_DTYPE_F16 ? "f16"
                                                     : "bf16";
      return std::string(dtype) + (c.strategy == KVC_STRATEGY_PAGED ? "_paged_" : "_continuous_") +
             (c.layout == KVC_LAYOUT_NHD ? "nhd" : "hnd");
    });

TEST(CApi, StatusNames) {
  EXPECT_STREQ(kvc_status_name(KVC_OK), "ok");
  EXPECT_STREQ(kvc_status_name(KVC_INVALID_ARGUMENT), "invalid_argument");
  EXPECT_STREQ(kvc_status_name(KVC_UNKNOWN_SEQUENCE), "unknown_sequence");
  EXPECT_STREQ(kvc_status_name(KVC_OUT_OF_PAGES), "out_of_pages");
  EXPECT_STREQ(kvc_status_name(KVC_CAPACITY_EXCEEDED), "capacity_exceeded");
  EXPECT_STREQ(kvc_status_name(KVC_OUT_OF_MEMORY), "out_of_memory");
  EXPECT_STREQ(kvc_status_name(KVC_INTERNAL), "internal");
  EXPECT_STREQ(kvc_status_name(42), "unknown");
}

TEST(CApi, BadParamsAreRefusedAndNothingIsCreated) {
  kvc_params p = make_params(KVC_DTYPE_BF16, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD, 16, 2, 64);
  kvc_manager* m = nullptr;
  expect_status([&](kvc_error* e) { return kvc_manager_create(nullptr, 8, 2, 64, &m, e); },
                KVC_INVALID_ARGUMENT, {"params is NULL"});
  expect_status([&](kvc_error* e) { return kvc_manager_create(&p, 8, 2, 64, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"out is NULL"});
  kvc_params bad = p;
  bad.dtype = 9;
  expect_status([&](kvc_error* e) { return kvc_manager_create(&bad, 8, 2, 64, &m, e); },
                KVC_INVALID_ARGUMENT, {"params->dtype value 9"});
  bad = p;
  bad.strategy = 5;
  expect_status([&](kvc_error* e) { return kvc_manager_create(&bad, 8, 2, 64, &m, e); },
                KVC_INVALID_ARGUMENT, {"params->strategy value 5"});
  bad = p;
  bad.page_layout = 3;
  expect_status([&](kvc_error* e) { return kvc_manager_create(&bad, 8, 2, 64, &m, e); },
                KVC_INVALID_ARGUMENT, {"params->page_layout value 3"});
  bad = p;
  bad.enable_prefix_caching = 2;
  expect_status([&](kvc_error* e) { return kvc_manager_create(&bad, 8, 2, 64, &m, e); },
                KVC_INVALID_ARGUMENT, {"enable_prefix_caching is 2"});
  bad = p;
  bad.num_layers = 0;
  expect_status([&](kvc_error* e) { return kvc_manager_create(&bad, 8, 2, 64, &m, e); },
                KVC_INVALID_ARGUMENT, {"num_layers"});
  bad = p;
  bad.page_size = 0;
  expect_status([&](kvc_error* e) { return kvc_manager_create(&bad, 8, 2, 64, &m, e); },
                KVC_INVALID_ARGUMENT, {"page_size"});
  const kvc_params cont =
      make_params(KVC_DTYPE_F32, KVC_STRATEGY_CONTINUOUS, KVC_LAYOUT_NHD, 0, 2, 64);
  expect_status([&](kvc_error* e) { return kvc_manager_create(&cont, 3, 2, 64, &m, e); },
                KVC_INVALID_ARGUMENT, {"num_blocks is 3", "max_batch_size (2)"});
  EXPECT_EQ(m, nullptr);
  // A NULL kvc_error* is allowed: the status alone comes back.
  EXPECT_EQ(kvc_manager_create(nullptr, 8, 2, 64, &m, nullptr), KVC_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);
}

TEST(CApi, EstimatedMemorySizeIsTheManagers) {
  const kvc_params p = make_params(KVC_DTYPE_BF16, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD, 16, 8, 128);
  std::size_t bytes = 0;
  KVC_ASSERT_OK(kvc_estimated_memory_size(&p, 100, 0, &bytes, &kvc_err_));
  EXPECT_EQ(bytes, std::size_t{100} * 2 * 2 * 16 * 8 * 128 * 2);  // pages, K/V, layers, ...
  const kvc_params c =
      make_params(KVC_DTYPE_F32, KVC_STRATEGY_CONTINUOUS, KVC_LAYOUT_NHD, 0, 2, 64);
  KVC_ASSERT_OK(kvc_estimated_memory_size(&c, 3, 50, &bytes, &kvc_err_));
  EXPECT_EQ(bytes, std::size_t{3} * 2 * 2 * 50 * 2 * 64 * 4);
  expect_status([&](kvc_error* e) { return kvc_estimated_memory_size(&p, 1, 0, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"bytes is NULL"});
}

// Every manager and kernel error: its status, a message naming the value,
// and the manager's bookkeeping and the cache's bytes unchanged.
TEST(CApi, ErrorsNameTheValueAndChangeNothing) {
  Handles hd;
  const kvc_params p = make_params(KVC_DTYPE_BF16, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD, 4, 2, 16);
  KVC_ASSERT_OK(kvc_manager_create(&p, 6, 3, 64, &hd.manager, &kvc_err_));
  KVC_ASSERT_OK(kvc_batch_create(&hd.batch, &kvc_err_));
  std::uint64_t seqs[2];
  KVC_ASSERT_OK(kvc_claim(hd.manager, 2, seqs, &kvc_err_));
  const std::uint32_t five[2] = {5, 3};
  KVC_ASSERT_OK(kvc_fetch(hd.manager, hd.batch, seqs, five, 2, 1, &kvc_err_));
  std::mt19937_64 rng(5);
  const std::vector<float> k = kvtest::random_vec(rng, 8 * 2 * 16),
                           v = kvtest::random_vec(rng, 8 * 2 * 16);
  const U32 ro = {0, 5, 8};
  KVC_ASSERT_OK(
      kvc_store_kv(hd.batch, 0, k.data(), v.data(), ro.data(), nullptr, nullptr, &kvc_err_));
  KVC_ASSERT_OK(kvc_step(hd.manager, seqs, five, 2, nullptr, &kvc_err_));

  kvc_manager_stats before{};
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &before, &kvc_err_));
  kvc_cache_desc d{};
  std::size_t pool_bytes = 0;
  KVC_ASSERT_OK(kvc_estimated_memory_size(&p, 6, 0, &pool_bytes, &kvc_err_));
  const std::uint32_t one[2] = {1, 1};
  KVC_ASSERT_OK(kvc_fetch(hd.manager, hd.batch, seqs, one, 2, 1, &kvc_err_));
  KVC_ASSERT_OK(kvc_batch_describe(hd.batch, &d, &kvc_err_));
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &before, &kvc_err_));
  const auto* pool = static_cast<const unsigned char*>(d.blocks);
  const std::vector<unsigned char> bytes_before(pool, pool + pool_bytes);

  // Manager calls.
  expect_status([&](kvc_error* e) { return kvc_claim(nullptr, 1, seqs, e); }, KVC_INVALID_ARGUMENT,
                {"manager is NULL"});
  std::uint64_t more[2];
  expect_status([&](kvc_error* e) { return kvc_claim(hd.manager, 2, more, e); },
                KVC_CAPACITY_EXCEEDED, {"3"});
  expect_status([&](kvc_error* e) { return kvc_claim(hd.manager, 1, nullptr, e); },
                KVC_INVALID_ARGUMENT, {"seq_ids is NULL with 1 elements"});
  const std::uint32_t huge[2] = {60, 1};  // 65 tokens > max_seq_len 64
  expect_status([&](kvc_error* e) { return kvc_fetch(hd.manager, hd.batch, seqs, huge, 2, 1, e); },
                KVC_CAPACITY_EXCEEDED, {});
  const std::uint32_t many[2] = {20, 1};  // 7 pages, 6 in the pool
  expect_status([&](kvc_error* e) { return kvc_fetch(hd.manager, hd.batch, seqs, many, 2, 1, e); },
                KVC_OUT_OF_PAGES, {"pages"});
  const std::uint64_t stranger[1] = {999};
  expect_status(
      [&](kvc_error* e) { return kvc_fetch(hd.manager, hd.batch, stranger, one, 1, 1, e); },
      KVC_UNKNOWN_SEQUENCE, {"999"});
  expect_status([&](kvc_error* e) { return kvc_step(hd.manager, stranger, one, 1, nullptr, e); },
                KVC_UNKNOWN_SEQUENCE, {"999"});
  const std::uint32_t too_far[2] = {2, 1};
  expect_status([&](kvc_error* e) { return kvc_step(hd.manager, seqs, too_far, 2, nullptr, e); },
                KVC_CAPACITY_EXCEEDED, {});
  expect_status([&](kvc_error* e) { return kvc_release(hd.manager, 999, KVC_REUSE_UNKNOWN, e); },
                KVC_UNKNOWN_SEQUENCE, {"999"});
  expect_status([&](kvc_error* e) { return kvc_release(hd.manager, seqs[0], 7, e); },
                KVC_INVALID_ARGUMENT, {"hint value 7"});
  std::uint32_t reused = 0;
  expect_status(
      [&](kvc_error* e) { return kvc_match_prefix(hd.manager, seqs[0], one, 2, 0, &reused, e); },
      KVC_INVALID_ARGUMENT, {"enable_prefix_caching"});
  expect_status([&](kvc_error* e) { return kvc_truncate(hd.manager, seqs[0], 9, e); },
                KVC_INVALID_ARGUMENT, {"9"});
  std::uint32_t len = 0;
  expect_status([&](kvc_error* e) { return kvc_cache_length(hd.manager, 999, &len, e); },
                KVC_UNKNOWN_SEQUENCE, {"999"});

  // Batches and kernels (on the batch fetched above: one new token each).
  kvc_batch* fresh = nullptr;
  KVC_ASSERT_OK(kvc_batch_create(&fresh, &kvc_err_));
  kvc_cache_desc unused{};
  expect_status([&](kvc_error* e) { return kvc_batch_describe(fresh, &unused, e); },
                KVC_INVALID_ARGUMENT, {"not been fetched"});
  const kvc_block_copy* no_copies = nullptr;
  std::uint32_t n_no_copies = 0;
  expect_status(
      [&](kvc_error* e) { return kvc_batch_block_copies(fresh, &no_copies, &n_no_copies, e); },
      KVC_INVALID_ARGUMENT, {"not been fetched"});
  const U32 dro = {0, 1, 2};
  const std::vector<float> q(2 * 4 * 16, 0.5f);
  std::vector<float> out(q.size(), 7.0f);
  expect_status(
      [&](kvc_error* e) {
        return kvc_attention(fresh, 0, q.data(), 4, dro.data(), out.data(), nullptr, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"not been fetched"});
  kvc_batch_destroy(fresh);
  expect_status(
      [&](kvc_error* e) {
        return kvc_store_kv(hd.batch, 2, k.data(), v.data(), dro.data(), nullptr, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"layer 2"});
  const U32 bad_ro = {1, 1, 2};
  expect_status(
      [&](kvc_error* e) {
        return kvc_store_kv(hd.batch, 0, k.data(), v.data(), bad_ro.data(), nullptr, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"row_offsets[0] is 1"});
  expect_status(
      [&](kvc_error* e) {
        return kvc_store_kv(hd.batch, 0, k.data(), v.data(), nullptr, nullptr, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"row_offsets is NULL"});
  expect_status(
      [&](kvc_error* e) {
        return kvc_store_kv(hd.batch, 0, nullptr, v.data(), dro.data(), nullptr, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"k_new is NULL"});
  const kvc_store_options bad_rope{2, 0.0f, 0};
  expect_status(
      [&](kvc_error* e) {
        return kvc_store_kv(hd.batch, 0, k.data(), v.data(), dro.data(), &bad_rope, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"rope_k is 2"});
  const kvc_store_options odd_rope{1, 0.0f, 5};
  expect_status(
      [&](kvc_error* e) {
        return kvc_store_kv(hd.batch, 0, k.data(), v.data(), dro.data(), &odd_rope, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"rotary_dim 5"});
  expect_status(
      [&](kvc_error* e) {
        return kvc_attention(hd.batch, 0, q.data(), 3, dro.data(), out.data(), nullptr, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"3"});
  expect_status(
      [&](kvc_error* e) {
        return kvc_attention(hd.batch, 0, q.data(), 4, dro.data(), nullptr, nullptr, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"out is NULL"});
  const U32 decreasing = {0, 2, 1};
  expect_status(
      [&](kvc_error* e) {
        return kvc_batch_increment_cache_lengths(hd.batch, decreasing.data(), 3, e);
      },
      KVC_INVALID_ARGUMENT, {});
  kvc_thread_pool* tp = nullptr;
  expect_status([&](kvc_error* e) { return kvc_thread_pool_create(5000, &tp, e); },
                KVC_INVALID_ARGUMENT, {"5000"});
  EXPECT_EQ(tp, nullptr);

  // Nothing changed: bookkeeping, the batch's description, every byte of K/V.
  kvc_manager_stats after{};
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &after, &kvc_err_));
  EXPECT_EQ(after.free_blocks, before.free_blocks);
  EXPECT_EQ(after.active_sequences, before.active_sequences);
  kvc_cache_desc d2{};
  KVC_ASSERT_OK(kvc_batch_describe(hd.batch, &d2, &kvc_err_));
  EXPECT_EQ(d2.cache_lengths[0], 5u);
  EXPECT_EQ(d2.cache_lengths[1], 3u);
  EXPECT_EQ(d2.max_seq_length, 1u);
  for (std::uint32_t b = 0; b < 2; ++b) {
    KVC_ASSERT_OK(kvc_cache_length(hd.manager, seqs[b], &len, &kvc_err_));
    EXPECT_EQ(len, b == 0 ? 5u : 3u);
  }
  EXPECT_TRUE(std::equal(bytes_before.begin(), bytes_before.end(), pool));
  KVC_ASSERT_OK(kvc_check_invariants(hd.manager, &kvc_err_));
}

TEST(CApi, PagedOnlyCallsAreRefusedOnContinuous) {
  Handles hd;
  const kvc_params p = make_params(KVC_DTYPE_F32, KVC_STRATEGY_CONTINUOUS, KVC_LAYOUT_NHD, 0, 1, 8);
  KVC_ASSERT_OK(kvc_manager_create(&p, 2, 2, 32, &hd.manager, &kvc_err_));
  std::uint64_t s = 0;
  KVC_ASSERT_OK(kvc_claim(hd.manager, 1, &s, &kvc_err_));
  std::uint64_t child = 0;
  std::uint32_t reused = 0;
  const std::uint32_t tokens[3] = {1, 2, 3};
  expect_status([&](kvc_error* e) { return kvc_fork(hd.manager, s, &child, e); },
                KVC_INVALID_ARGUMENT, {"fork needs the paged strategy"});
  expect_status([&](kvc_error* e) { return kvc_truncate(hd.manager, s, 0, e); },
                KVC_INVALID_ARGUMENT, {"truncate needs the paged strategy"});
  expect_status(
      [&](kvc_error* e) { return kvc_match_prefix(hd.manager, s, tokens, 3, 0, &reused, e); },
      KVC_INVALID_ARGUMENT, {"match_prefix needs the paged strategy"});
  const std::uint32_t n = 0;
  expect_status([&](kvc_error* e) { return kvc_step(hd.manager, &s, &n, 1, tokens, e); },
                KVC_INVALID_ARGUMENT, {"token_ids needs the paged strategy"});
  expect_status([&](kvc_error* e) { return kvc_release(hd.manager, s, KVC_REUSE_LIKELY, e); },
                KVC_INVALID_ARGUMENT, {"hint needs the paged strategy"});
  std::uint32_t covered = 0;
  expect_status(
      [&](kvc_error* e) { return kvc_pin_prefix(hd.manager, tokens, 3, 1, 0, &covered, e); },
      KVC_INVALID_ARGUMENT, {"pin_prefix needs the paged strategy"});
  expect_status([&](kvc_error* e) { return kvc_reset_prefix_cache(hd.manager, e); },
                KVC_INVALID_ARGUMENT, {"reset_prefix_cache needs the paged strategy"});
  expect_status([&](kvc_error* e) { return kvc_reset_metrics(hd.manager, e); },
                KVC_INVALID_ARGUMENT, {"reset_metrics needs the paged strategy"});
  kvc_manager_stats st{};
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &st, &kvc_err_));
  EXPECT_EQ(st.active_sequences, 1u);  // the refused release released nothing
  KVC_ASSERT_OK(kvc_release(hd.manager, s, KVC_REUSE_UNKNOWN, &kvc_err_));
}

// Prefix caching through the C calls: a released sequence's full pages are
// matched by the next request with the same tokens, which then reads the
// first one's K/V; fork shares, truncate rolls back; multistep advances the
// batch's lengths without the manager.
TEST(CApi, PrefixCacheForkTruncateAndMultistep) {
  Handles hd;
  constexpr std::uint32_t kPage = 4, kDim = 8;
  const kvc_params p =
      make_params(KVC_DTYPE_F32, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD, kPage, 1, kDim, 1);
  KVC_ASSERT_OK(kvc_manager_create(&p, 16, 4, 64, &hd.manager, &kvc_err_));
  KVC_ASSERT_OK(kvc_batch_create(&hd.batch, &kvc_err_));
  std::vector<std::uint32_t> tokens(10);
  std::iota(tokens.begin(), tokens.end(), 100u);
  std::mt19937_64 rng(9);
  const std::vector<float> k = kvtest::random_vec(rng, 10 * kDim),
                           v = kvtest::random_vec(rng, 10 * kDim);

  std::uint64_t a = 0;
  KVC_ASSERT_OK(kvc_claim(hd.manager, 1, &a, &kvc_err_));
  const std::uint32_t ten = 10;
  KVC_ASSERT_OK(kvc_fetch(hd.manager, hd.batch, &a, &ten, 1, 1, &kvc_err_));
  const U32 ro = {0, 10};
  for (std::uint32_t layer = 0; layer < 2; ++layer) {
    KVC_ASSERT_OK(
        kvc_store_kv(hd.batch, layer, k.data(), v.data(), ro.data(), nullptr, nullptr, &kvc_err_));
  }
  KVC_ASSERT_OK(kvc_step(hd.manager, &a, &ten, 1, tokens.data(), &kvc_err_));
  KVC_ASSERT_OK(kvc_release(hd.manager, a, KVC_REUSE_LIKELY, &kvc_err_));
  kvc_manager_stats s{};
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &s, &kvc_err_));
  EXPECT_EQ(s.pages_published, 2u);  // two full pages of 4
  EXPECT_EQ(s.pages_cached, 2u);

  std::uint64_t b = 0;
  KVC_ASSERT_OK(kvc_claim(hd.manager, 1, &b, &kvc_err_));
  std::uint32_t reused = 0;
  KVC_ASSERT_OK(
      kvc_match_prefix(hd.manager, b, tokens.data(), tokens.size(), 0, &reused, &kvc_err_));
  EXPECT_EQ(reused, 8u);
  std::uint32_t len = 0;
  KVC_ASSERT_OK(kvc_cache_length(hd.manager, b, &len, &kvc_err_));
  EXPECT_EQ(len, 8u);
  // A different extra key (tenant) matches nothing.
  std::uint64_t other = 0;
  KVC_ASSERT_OK(kvc_claim(hd.manager, 1, &other, &kvc_err_));
  KVC_ASSERT_OK(
      kvc_match_prefix(hd.manager, other, tokens.data(), tokens.size(), 77, &reused, &kvc_err_));
  EXPECT_EQ(reused, 0u);
  KVC_ASSERT_OK(kvc_release(hd.manager, other, KVC_REUSE_UNKNOWN, &kvc_err_));

  // b reads a's K/V for the 8 reused tokens (layer 1, through the layout).
  const std::uint32_t two = 2;
  KVC_ASSERT_OK(kvc_fetch(hd.manager, hd.batch, &b, &two, 1, 1, &kvc_err_));
  kvc_cache_desc d{};
  KVC_ASSERT_OK(kvc_batch_describe(hd.batch, &d, &kvc_err_));
  for (std::uint32_t pos = 0; pos < 8; ++pos)
    for (std::uint32_t dd = 0; dd < kDim; ++dd) {
      ASSERT_EQ(element_at(d, 0, 0, 1, pos, 0, dd), k[pos * kDim + dd]);
      ASSERT_EQ(element_at(d, 0, 1, 1, pos, 0, dd), v[pos * kDim + dd]);
    }
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &s, &kvc_err_));
  EXPECT_EQ(s.match_calls, 2u);
  EXPECT_EQ(s.prompt_tokens, 20u);
  EXPECT_EQ(s.reused_tokens, 8u);
  const U32 ro2 = {0, 2};
  KVC_ASSERT_OK(
      kvc_store_kv(hd.batch, 0, k.data(), v.data(), ro2.data(), nullptr, nullptr, &kvc_err_));
  KVC_ASSERT_OK(kvc_step(hd.manager, &b, &two, 1, tokens.data() + 8, &kvc_err_));

  std::uint64_t child = 0;
  KVC_ASSERT_OK(kvc_fork(hd.manager, b, &child, &kvc_err_));
  KVC_ASSERT_OK(kvc_cache_length(hd.manager, child, &len, &kvc_err_));
  EXPECT_EQ(len, 10u);
  KVC_ASSERT_OK(kvc_truncate(hd.manager, child, 3, &kvc_err_));
  KVC_ASSERT_OK(kvc_cache_length(hd.manager, child, &len, &kvc_err_));
  EXPECT_EQ(len, 3u);
  KVC_ASSERT_OK(kvc_cache_length(hd.manager, b, &len, &kvc_err_));
  EXPECT_EQ(len, 10u);
  KVC_ASSERT_OK(kvc_check_invariants(hd.manager, &kvc_err_));

  // No sharing written into yet: no copies.
  const kvc_block_copy* copies = nullptr;
  std::uint32_t n_copies = 99;
  KVC_ASSERT_OK(kvc_batch_block_copies(hd.batch, &copies, &n_copies, &kvc_err_));
  EXPECT_EQ(n_copies, 0u);
  EXPECT_EQ(copies, nullptr);
  KVC_ASSERT_OK(kvc_batch_describe(hd.batch, &d, &kvc_err_));
  const std::uint32_t b_page0 = d.lookup_table[0];  // b's first page, shared with child

  // Multistep: room for 3 decode steps, the batch advanced between them.
  // child's write at position 3 goes into the page it still shares with b:
  // the fetch copies it and says so.
  const std::uint64_t both[2] = {b, child};
  const std::uint32_t ones[2] = {1, 1};
  KVC_ASSERT_OK(kvc_fetch(hd.manager, hd.batch, both, ones, 2, 3, &kvc_err_));
  KVC_ASSERT_OK(kvc_batch_block_copies(hd.batch, &copies, &n_copies, &kvc_err_));
  KVC_ASSERT_OK(kvc_batch_describe(hd.batch, &d, &kvc_err_));
  ASSERT_EQ(n_copies, 1u);
  EXPECT_EQ(copies[0].src, b_page0);
  EXPECT_EQ(copies[0].dst, d.lookup_table[d.lookup_stride]);  // child's first page
  EXPECT_EQ(d.lookup_table[0], b_page0);
  expect_status(
      [&](kvc_error* e) { return kvc_batch_block_copies(hd.batch, nullptr, &n_copies, e); },
      KVC_INVALID_ARGUMENT, {"copies"});
  const U32 prev = {0, 1, 2};
  for (std::uint32_t step = 1; step < 3; ++step) {
    KVC_ASSERT_OK(kvc_batch_increment_cache_lengths(hd.batch, prev.data(), 3, &kvc_err_));
    KVC_ASSERT_OK(kvc_batch_describe(hd.batch, &d, &kvc_err_));
    EXPECT_EQ(d.cache_lengths[0], 10u + step);
    EXPECT_EQ(d.cache_lengths[1], 3u + step);
  }
  expect_status(
      [&](kvc_error* e) { return kvc_batch_increment_cache_lengths(hd.batch, prev.data(), 3, e); },
      KVC_CAPACITY_EXCEEDED, {});
  KVC_ASSERT_OK(kvc_check_invariants(hd.manager, &kvc_err_));
}

// Events collected by the callback (through user_data).
struct EventLog {
  std::vector<kvc_page_event> events;
  std::vector<std::vector<std::uint32_t>> tokens;
};
void log_event(const kvc_page_event* e, void* user) {
  auto* log = static_cast<EventLog*>(user);
  log->events.push_back(*e);
  log->tokens.emplace_back(e->tokens, e->tokens + e->n_tokens);
}

// The prefix cache's configuration through C: a policy, the stored /
// removed events with their hash chain and tokens, pinning, the resets.
TEST(CApi, PrefixConfigEventsPinsAndResets) {
  const kvc_prefix_config dflt = kvc_prefix_config_default();
  const kvcache::PrefixCacheConfig cpp;
  EXPECT_EQ(dflt.policy, KVC_EVICT_ADAPTIVE);
  EXPECT_EQ(dflt.s3fifo_small_fraction, cpp.s3fifo_small_fraction);
  EXPECT_EQ(dflt.ghost_factor, cpp.ghost_factor);
  EXPECT_EQ(dflt.on_event, nullptr);

  Handles hd;
  constexpr std::uint32_t kPage = 4;
  const kvc_params p =
      make_params(KVC_DTYPE_F32, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD, kPage, 1, 8, 1);
  EventLog log;
  kvc_prefix_config config = dflt;
  config.policy = KVC_EVICT_TIERED;
  config.on_event = log_event;
  config.user_data = &log;
  KVC_ASSERT_OK(kvc_manager_create_prefix(&p, 12, 2, 64, &config, &hd.manager, &kvc_err_));
  KVC_ASSERT_OK(kvc_batch_create(&hd.batch, &kvc_err_));
  std::vector<std::uint32_t> tokens(9);
  std::iota(tokens.begin(), tokens.end(), 40u);
  std::uint64_t a = 0;
  KVC_ASSERT_OK(kvc_claim(hd.manager, 1, &a, &kvc_err_));
  const std::uint32_t nine = 9;
  KVC_ASSERT_OK(kvc_fetch(hd.manager, hd.batch, &a, &nine, 1, 1, &kvc_err_));
  KVC_ASSERT_OK(kvc_step(hd.manager, &a, &nine, 1, tokens.data(), &kvc_err_));
  ASSERT_EQ(log.events.size(), 2u);  // two full pages of 4
  EXPECT_EQ(log.events[0].kind, KVC_PAGE_STORED);
  EXPECT_EQ(log.events[0].parent_hash, 0u);
  EXPECT_EQ(log.events[1].parent_hash, log.events[0].hash);
  EXPECT_EQ(log.events[0].hash, kvcache::default_block_hash(0, std::span(tokens.data(), kPage), 0));
  EXPECT_EQ(log.tokens[1], std::vector<std::uint32_t>(tokens.begin() + 4, tokens.begin() + 8));
  KVC_ASSERT_OK(kvc_release(hd.manager, a, KVC_REUSE_UNLIKELY, &kvc_err_));

  // Another request's one full page, cached but not pinned.
  std::uint64_t c = 0;
  KVC_ASSERT_OK(kvc_claim(hd.manager, 1, &c, &kvc_err_));
  const std::uint32_t five = 5;
  const std::vector<std::uint32_t> other = {7, 7, 7, 7, 7};
  KVC_ASSERT_OK(kvc_fetch(hd.manager, hd.batch, &c, &five, 1, 1, &kvc_err_));
  KVC_ASSERT_OK(kvc_step(hd.manager, &c, &five, 1, other.data(), &kvc_err_));
  KVC_ASSERT_OK(kvc_release(hd.manager, c, KVC_REUSE_UNKNOWN, &kvc_err_));
  ASSERT_EQ(log.events.size(), 3u);
  const std::uint64_t other_hash = log.events[2].hash;

  std::uint32_t covered = 0;
  KVC_ASSERT_OK(
      kvc_pin_prefix(hd.manager, tokens.data(), tokens.size(), 3, 0, &covered, &kvc_err_));
  EXPECT_EQ(covered, 8u);
  kvc_manager_stats s{};
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &s, &kvc_err_));
  EXPECT_EQ(s.pages_pinned, 2u);
  EXPECT_EQ(s.pages_cached, 3u);
  EXPECT_EQ(s.pages_published, 3u);

  // A request needing 10 of the 12 pages (9 free): one cached page must go,
  // and it is the unpinned one.
  std::uint64_t b = 0;
  KVC_ASSERT_OK(kvc_claim(hd.manager, 1, &b, &kvc_err_));
  const std::uint32_t forty = 40;
  KVC_ASSERT_OK(kvc_fetch(hd.manager, hd.batch, &b, &forty, 1, 1, &kvc_err_));
  ASSERT_EQ(log.events.size(), 4u);
  EXPECT_EQ(log.events[3].kind, KVC_PAGE_REMOVED);
  EXPECT_EQ(log.events[3].hash, other_hash);
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &s, &kvc_err_));
  EXPECT_EQ(s.pages_pinned, 2u);
  EXPECT_EQ(s.pages_cached, 2u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.free_blocks, 0u);
  KVC_ASSERT_OK(kvc_release(hd.manager, b, KVC_REUSE_UNKNOWN, &kvc_err_));

  KVC_ASSERT_OK(kvc_reset_prefix_cache(hd.manager, &kvc_err_));
  ASSERT_EQ(log.events.size(), 6u);
  EXPECT_EQ(log.events[4].kind, KVC_PAGE_REMOVED);
  EXPECT_EQ(log.events[5].kind, KVC_PAGE_REMOVED);
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &s, &kvc_err_));
  EXPECT_EQ(s.pages_cached, 0u);
  EXPECT_EQ(s.pages_pinned, 0u);
  EXPECT_EQ(s.free_blocks, s.total_blocks);
  KVC_ASSERT_OK(kvc_reset_metrics(hd.manager, &kvc_err_));
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &s, &kvc_err_));
  EXPECT_EQ(s.pages_published, 0u);
  KVC_ASSERT_OK(kvc_check_invariants(hd.manager, &kvc_err_));

  // Errors.
  kvc_manager* m = nullptr;
  kvc_prefix_config bad = dflt;
  bad.policy = 9;
  expect_status([&](kvc_error* e) { return kvc_manager_create_prefix(&p, 12, 2, 64, &bad, &m, e); },
                KVC_INVALID_ARGUMENT, {"config->policy value 9"});
  bad = dflt;
  bad.ghost_factor = 100;  // refused under LRU too, which keeps no ghost
  expect_status([&](kvc_error* e) { return kvc_manager_create_prefix(&p, 12, 2, 64, &bad, &m, e); },
                KVC_INVALID_ARGUMENT, {"ghost_factor"});
  expect_status(
      [&](kvc_error* e) { return kvc_manager_create_prefix(&p, 12, 2, 64, nullptr, &m, e); },
      KVC_INVALID_ARGUMENT, {"config is NULL"});
  const kvc_params off =
      make_params(KVC_DTYPE_F32, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD, kPage, 1, 8);
  expect_status(
      [&](kvc_error* e) { return kvc_manager_create_prefix(&off, 12, 2, 64, &dflt, &m, e); },
      KVC_INVALID_ARGUMENT, {"enable_prefix_caching"});
  EXPECT_EQ(m, nullptr);
}

TEST(CApi, ThreadPoolGivesTheSameAttention) {
  Handles hd;
  constexpr std::uint32_t kKv = 2, kQ = 8, kDim = 64;
  const kvc_params p =
      make_params(KVC_DTYPE_BF16, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD, 16, kKv, kDim);
  KVC_ASSERT_OK(kvc_manager_create(&p, 64, 2, 1024, &hd.manager, &kvc_err_));
  KVC_ASSERT_OK(kvc_batch_create(&hd.batch, &kvc_err_));
  KVC_ASSERT_OK(kvc_thread_pool_create(2, &hd.pool, &kvc_err_));
  std::uint64_t s = 0;
  KVC_ASSERT_OK(kvc_claim(hd.manager, 1, &s, &kvc_err_));
  const std::uint32_t n = 700;
  KVC_ASSERT_OK(kvc_fetch(hd.manager, hd.batch, &s, &n, 1, 1, &kvc_err_));
  std::mt19937_64 rng(3);
  const std::vector<float> k = kvtest::random_vec(rng, n * kKv * kDim),
                           v = kvtest::random_vec(rng, n * kKv * kDim);
  const std::vector<float> q = kvtest::random_vec(rng, n * kQ * kDim);
  const U32 ro = {0, n};
  KVC_ASSERT_OK(
      kvc_store_kv(hd.batch, 0, k.data(), v.data(), ro.data(), nullptr, hd.pool, &kvc_err_));
  std::vector<float> one(q.size()), two(q.size());
  const kvc_attention_options opts{0.1f, KVC_PRECISION_FP32, KVC_PREFETCH_AUTOMATIC};
  KVC_ASSERT_OK(
      kvc_attention(hd.batch, 0, q.data(), kQ, ro.data(), one.data(), &opts, nullptr, &kvc_err_));
  KVC_ASSERT_OK(
      kvc_attention(hd.batch, 0, q.data(), kQ, ro.data(), two.data(), &opts, hd.pool, &kvc_err_));
  for (std::size_t i = 0; i < q.size(); ++i) {
    ASSERT_NEAR(one[i], two[i], 4e-6 + 4e-6 * std::fabs(one[i])) << i;
  }
  // The scale option reaches the kernel: the default scale gives other values.
  std::vector<float> dflt(q.size());
  KVC_ASSERT_OK(kvc_attention(hd.batch, 0, q.data(), kQ, ro.data(), dflt.data(), nullptr, nullptr,
                              &kvc_err_));
  EXPECT_NE(dflt, one);
}

// The precision and prefetch options reach the kernel: every prefetch gives
// the same values within the fp32 bound, bf16 precision differs from fp32 by
// more than that but within its own bound (2^-8 of the largest |V| = 1 plus
// fp32 rounding, tests/kernels/attention_test.cpp), and bad values are refused.
TEST(CApi, AttentionPrecisionAndPrefetchOptions) {
  Handles hd;
  constexpr std::uint32_t kKv = 2, kQ = 8, kDim = 64;
  const kvc_params p =
      make_params(KVC_DTYPE_BF16, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD, 16, kKv, kDim);
  KVC_ASSERT_OK(kvc_manager_create(&p, 32, 2, 512, &hd.manager, &kvc_err_));
  KVC_ASSERT_OK(kvc_batch_create(&hd.batch, &kvc_err_));
  std::uint64_t s = 0;
  KVC_ASSERT_OK(kvc_claim(hd.manager, 1, &s, &kvc_err_));
  const std::uint32_t n = 300;
  KVC_ASSERT_OK(kvc_fetch(hd.manager, hd.batch, &s, &n, 1, 1, &kvc_err_));
  std::mt19937_64 rng(11);
  const std::vector<float> k = kvtest::random_vec(rng, n * kKv * kDim);
  const std::vector<float> v = kvtest::random_vec(rng, n * kKv * kDim);
  const std::vector<float> q = kvtest::random_vec(rng, n * kQ * kDim, 0.5f, 2.0f);
  const U32 ro = {0, n};
  KVC_ASSERT_OK(
      kvc_store_kv(hd.batch, 0, k.data(), v.data(), ro.data(), nullptr, nullptr, &kvc_err_));
  const auto run = [&](std::int32_t precision, std::int32_t prefetch) {
    std::vector<float> out(q.size());
    const kvc_attention_options o{0.0f, precision, prefetch};
    kvc_error e{};
    EXPECT_EQ(kvc_attention(hd.batch, 0, q.data(), kQ, ro.data(), out.data(), &o, nullptr, &e),
              KVC_OK)
        << e.message;
    return out;
  };
  const std::vector<float> base = run(KVC_PRECISION_FP32, KVC_PREFETCH_AUTOMATIC);
  for (std::int32_t prefetch = KVC_PREFETCH_NEXT_STEP_L1; prefetch <= KVC_PREFETCH_NEXT_TILE_L1;
       ++prefetch) {
    const std::vector<float> out = run(KVC_PRECISION_FP32, prefetch);
    for (std::size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], base[i], 4e-6 + 4e-6 * std::fabs(base[i])) << "prefetch " << prefetch;
    }
  }
  const std::vector<float> rounded = run(KVC_PRECISION_BF16, KVC_PREFETCH_AUTOMATIC);
  float most = 0.0f;
  for (std::size_t i = 0; i < rounded.size(); ++i) {
    const float diff = std::fabs(rounded[i] - base[i]);
    ASSERT_LE(diff, 1.0f / 256 + 1e-5f) << i;
    most = std::max(most, diff);
  }
  EXPECT_GT(most, 1e-5f);  // the rounding is visible: the option reached the kernel
  std::vector<float> out(q.size());
  kvc_attention_options bad{0.0f, 2, KVC_PREFETCH_AUTOMATIC};
  expect_status(
      [&](kvc_error* e) {
        return kvc_attention(hd.batch, 0, q.data(), kQ, ro.data(), out.data(), &bad, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"options->precision value 2"});
  bad = {0.0f, KVC_PRECISION_FP32, 5};
  expect_status(
      [&](kvc_error* e) {
        return kvc_attention(hd.batch, 0, q.data(), kQ, ro.data(), out.data(), &bad, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"options->prefetch value 5", "(0-4)"});
  // A NaN or infinite scale is refused by the kernel entry (issue 40, item 10).
  for (const float scale : {std::nanf(""), HUGE_VALF}) {
    bad = {scale, KVC_PRECISION_FP32, KVC_PREFETCH_AUTOMATIC};
    expect_status(
        [&](kvc_error* e) {
          return kvc_attention(hd.batch, 0, q.data(), kQ, ro.data(), out.data(), &bad, nullptr, e);
        },
        KVC_INVALID_ARGUMENT, {"scale is", "finite"});
  }
}

// Manager calls from several threads at once, each thread with its own batch
// (the header's thread-safety contract): every thread's K/V reads back as
// written, and the manager ends empty and consistent. In the TSan run.
TEST(CApiConcurrency, ThreadsShareOneManager) {
  Handles hd;
  constexpr std::uint32_t kDim = 16, kThreads = 4, kRounds = 150;
  const kvc_params p = make_params(KVC_DTYPE_F32, KVC_STRATEGY_PAGED, KVC_LAYOUT_NHD, 4, 1, kDim);
  KVC_ASSERT_OK(kvc_manager_create(&p, 64, kThreads, 64, &hd.manager, &kvc_err_));
  std::vector<std::string> failures(kThreads);
  auto worker = [&](std::uint32_t id) {
    kvc_batch* batch = nullptr;
    kvc_error err{};
    std::mt19937_64 rng(100 + id);
    if (kvc_batch_create(&batch, &err) != KVC_OK) {
      failures[id] = err.message;
      return;
    }
    for (std::uint32_t r = 0; r < kRounds && failures[id].empty(); ++r) {
      std::uint64_t seq = 0;
      const auto n = static_cast<std::uint32_t>(1 + rng() % 12);
      const std::vector<float> k = kvtest::random_vec(rng, n * kDim);
      const std::vector<float> v = kvtest::random_vec(rng, n * kDim);
      const U32 ro = {0, n};
      kvc_cache_desc d{};
      if (kvc_claim(hd.manager, 1, &seq, &err) != KVC_OK ||
          kvc_fetch(hd.manager, batch, &seq, &n, 1, 1, &err) != KVC_OK ||
          kvc_store_kv(batch, 1, k.data(), v.data(), ro.data(), nullptr, nullptr, &err) != KVC_OK ||
          kvc_batch_describe(batch, &d, &err) != KVC_OK) {
        failures[id] = err.message;
        break;
      }
      for (std::uint32_t pos = 0; pos < n; ++pos)
        for (std::uint32_t dd = 0; dd < kDim; ++dd) {
          if (element_at(d, 0, 0, 1, pos, 0, dd) != k[pos * kDim + dd] ||
              element_at(d, 0, 1, 1, pos, 0, dd) != v[pos * kDim + dd]) {
            failures[id] = "thread " + std::to_string(id) + " read back other K/V";
          }
        }
      std::uint32_t len = 0;
      if (kvc_step(hd.manager, &seq, &n, 1, nullptr, &err) != KVC_OK ||
          kvc_cache_length(hd.manager, seq, &len, &err) != KVC_OK ||
          kvc_release(hd.manager, seq, KVC_REUSE_UNKNOWN, &err) != KVC_OK) {
        failures[id] = err.message;
      } else if (len != n) {
        failures[id] = "cache length " + std::to_string(len) + ", expected " + std::to_string(n);
      }
    }
    kvc_batch_destroy(batch);
  };
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  for (std::uint32_t t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  kvc_manager_stats s{};
  KVC_ASSERT_OK(kvc_manager_stats_get(hd.manager, &s, &kvc_err_));
  EXPECT_EQ(s.active_sequences, 0u);
  EXPECT_EQ(s.free_blocks, s.total_blocks);
  KVC_ASSERT_OK(kvc_check_invariants(hd.manager, &kvc_err_));
}

}  // namespace

namespace {

// The per-layer arrangement through C: the description says so, layer l's K
// of block p lies at ((l * 2 + 0) * num_blocks + p) * block elements, and a
// store past an entry's reserved room is refused with nothing written.
TEST(CApi, PerLayerArrangementAndReservedRoom) {
  Handles h;
  kvc_params p = make_params(KVC_DTYPE_F32, KVC_STRATEGY_PAGED, KVC_LAYOUT_HND, 4, 2, 8);
  p.pool_arrangement = KVC_ARRANGEMENT_PER_LAYER;
  KVC_ASSERT_OK(kvc_manager_create(&p, 8, 4, 64, &h.manager, &kvc_err_));
  KVC_ASSERT_OK(kvc_batch_create(&h.batch, &kvc_err_));
  std::uint64_t ids[2];
  KVC_ASSERT_OK(kvc_claim(h.manager, 2, ids, &kvc_err_));
  const std::uint32_t news[2] = {1, 6};
  KVC_ASSERT_OK(kvc_fetch(h.manager, h.batch, ids, news, 2, 1, &kvc_err_));
  kvc_cache_desc d{};
  KVC_ASSERT_OK(kvc_batch_describe(h.batch, &d, &kvc_err_));
  EXPECT_EQ(d.arrangement, KVC_ARRANGEMENT_PER_LAYER);
  ASSERT_NE(d.reserved_lengths, nullptr);
  EXPECT_EQ(d.reserved_lengths[0], 1u);
  EXPECT_EQ(d.reserved_lengths[1], 6u);
  EXPECT_EQ(d.max_full_context_length, 6u);
  EXPECT_EQ(d.max_cache_length, 0u);

  const std::size_t row = 2 * 8, block = 4 * row;
  std::vector<float> k(7 * row), v(7 * row);
  std::mt19937_64 rng(3);
  for (auto& x : k) x = kvtest::nonzero(rng);
  for (auto& x : v) x = kvtest::nonzero(rng);
  const std::vector<float> before(static_cast<float*>(d.blocks),
                                  static_cast<float*>(d.blocks) + 2 * 2 * 8 * block);
  const std::uint32_t too_many[3] = {0, 2, 7};  // entry 0 reserved 1 row
  expect_status(
      [&](kvc_error* e) {
        return kvc_store_kv(h.batch, 1, k.data(), v.data(), too_many, nullptr, nullptr, e);
      },
      KVC_INVALID_ARGUMENT, {"entry 0", "2 new tokens", "1 tokens its fetch reserved"});
  EXPECT_TRUE(std::equal(before.begin(), before.end(), static_cast<float*>(d.blocks)));

  const std::uint32_t offsets[3] = {0, 1, 7};
  KVC_ASSERT_OK(kvc_store_kv(h.batch, 1, k.data(), v.data(), offsets, nullptr, nullptr, &kvc_err_));
  // Entry 1, token 5 (block 1 of its table, row 1), head 1, dim 3: HND.
  const std::uint32_t page = d.lookup_table[1 * d.lookup_stride + 1];
  const float* layer1_v =
      static_cast<const float*>(d.blocks) + (1 * 2 + 1) * std::size_t{8} * block;
  EXPECT_EQ(layer1_v[page * block + (1 * 4 + 1) * 8 + 3], v[(1 + 5) * row + 1 * 8 + 3]);
}

}  // namespace
