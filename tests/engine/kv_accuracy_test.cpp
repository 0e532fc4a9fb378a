// 8-bit caches in the engine: the model runs on every cache dtype, fp8
// scales come from a calibration pass, and compare_kv_dtypes' figures stay
// within stated bounds of an f32 cache (and leave them with a wrong scale).
#include "kvcache/engine/kv_accuracy.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kvcache/engine/model.h"
#include "kvcache/engine/scheduler.h"
#include "kvcache/error.h"
#include "kvcache/paged_manager.h"

namespace kvcache::engine {
namespace {

Model tiny_model() { return Model::from_seed(model_preset("tiny"), 7); }

std::vector<TokenId> prompt_of(std::size_t n) {
  std::vector<TokenId> p(n);
  std::iota(p.begin(), p.end(), 1);
  return p;
}

KVCompareReport compare(const Model& m, DType dtype, std::optional<KVScales> scales = {}) {
  KVCompareOptions o;
  o.dtype = dtype;
  o.page_size = 8;
  o.scales = std::move(scales);
  return compare_kv_dtypes(m, prompt_of(24), 96, o);
}

// The bounds: tiny model (head dim 8), 24-token prompt, 96 positions, page 8.
// Measured there: int8 max diff 0.020, mean KL 7.3e-6, top-1 1.0; e4m3 0.17 /
// 3.7e-4 / 1.0; e5m2 0.40 / 1.5e-3 / 1.0. The bounds leave 2.5-4x room.
struct Bounds {
  DType dtype;
  double max_logit_diff, mean_kl, top1;
};

TEST(KVAccuracy, EightBitCachesStayWithinTheirBoundsOfF32) {
  const Model m = tiny_model();
  for (const Bounds& b :
       {Bounds{DType::int8, 0.05, 3e-5, 0.95}, Bounds{DType::fp8_e4m3, 0.5, 1.5e-3, 0.95},
        Bounds{DType::fp8_e5m2, 1.0, 5e-3, 0.95}}) {
    SCOPED_TRACE(std::string(dtype_name(b.dtype)));
    const KVCompareReport r = compare(m, b.dtype);
    EXPECT_EQ(r.positions, 96u);
    EXPECT_EQ(r.tokens.size(), 96u);
    EXPECT_GT(r.max_logit_diff, 0.0);  // the 8-bit cache was really used
    EXPECT_LE(r.max_logit_diff, b.max_logit_diff);
    EXPECT_LE(r.mean_kl, b.mean_kl);
    EXPECT_GE(r.top1_agreement, b.top1);
    EXPECT_EQ(r.scales.num_layers(), is_fp8(b.dtype) ? 2u : 0u);
  }
}

TEST(KVAccuracy, TheReferenceAgainstItselfIsExact) {
  const KVCompareReport r = compare(tiny_model(), DType::f32);
  EXPECT_EQ(r.max_logit_diff, 0.0);
  EXPECT_EQ(r.mean_kl, 0.0);
  EXPECT_EQ(r.top1_agreement, 1.0);
}

// The greedy tokens are the f32 cache's, which equal the no-cache oracle's.
TEST(KVAccuracy, TeacherTokensAreTheReferenceGreedyTokens) {
  const Model m = tiny_model();
  const KVCompareReport r = compare(m, DType::int8);
  std::vector<TokenId> seq = prompt_of(24);
  seq.insert(seq.end(), r.tokens.begin(), r.tokens.end() - 1);
  const std::vector<float> logits = m.forward_no_cache(seq);
  const std::size_t vocab = m.config().vocab_size;
  for (std::size_t i = 0; i < r.tokens.size(); ++i) {
    const float* row = logits.data() + (23 + i) * vocab;
    EXPECT_EQ(r.tokens[i], std::max_element(row, row + vocab) - row) << "position " << i;
  }
}

// A deliberately wrong fp8 scale (1/64 of the calibrated one: most values
// saturate) breaks the bounds the right one keeps.
TEST(KVAccuracy, AWrongFp8ScaleFailsTheBounds) {
  const Model m = tiny_model();
  const KVScales good = m.calibrate_kv_scales(prompt_of(24), DType::fp8_e4m3);
  KVScales bad = good;
  for (std::uint32_t l = 0; l < bad.num_layers(); ++l) {
    for (std::uint32_t kv = 0; kv < 2; ++kv) {
      std::vector<float> s(bad.n_kv_heads());
      for (std::uint32_t h = 0; h < s.size(); ++h) s[h] = good.get(l, kv, h) / 64.0f;
      bad.set(l, kv, s);
    }
  }
  const KVCompareReport right = compare(m, DType::fp8_e4m3, good);
  const KVCompareReport wrong = compare(m, DType::fp8_e4m3, bad);
  EXPECT_EQ(right.scales, good);
  EXPECT_LE(right.mean_kl, 1.5e-3);  // the fp8_e4m3 bounds above
  EXPECT_LE(right.max_logit_diff, 0.5);
  EXPECT_GT(wrong.mean_kl, 1.5e-3);      // 0.41 measured
  EXPECT_GT(wrong.max_logit_diff, 0.5);  // 4.0 measured
  EXPECT_GT(wrong.max_logit_diff, 0.5);
}

TEST(KVAccuracy, CalibrationGivesThePerHeadAbsmaxOverTheFormatsLargest) {
  const Model m = tiny_model();
  const auto tokens = prompt_of(10);
  const KVScales s = m.calibrate_kv_scales(tokens, DType::fp8_e5m2);
  const KVScales s2 = m.calibrate_kv_scales(tokens, DType::fp8_e5m2, 2.0f);
  ASSERT_EQ(s.num_layers(), m.config().num_layers);
  ASSERT_EQ(s.n_kv_heads(), m.config().n_kv_heads);
  for (std::uint32_t l = 0; l < s.num_layers(); ++l) {
    for (std::uint32_t kv = 0; kv < 2; ++kv) {
      for (std::uint32_t h = 0; h < s.n_kv_heads(); ++h) {
        // Activations are O(1): the scale is far below 1 (absmax / 57344).
        EXPECT_GT(s.get(l, kv, h), 0.0f);
        EXPECT_LT(s.get(l, kv, h), 1e-3f);
        EXPECT_EQ(s2.get(l, kv, h), 2.0f * s.get(l, kv, h));
      }
    }
  }
  EXPECT_THROW(m.calibrate_kv_scales(tokens, DType::int8), InvalidArgument);
  EXPECT_THROW(m.calibrate_kv_scales({}, DType::fp8_e4m3), InvalidArgument);
  EXPECT_THROW(m.calibrate_kv_scales(tokens, DType::fp8_e4m3, 0.5f), InvalidArgument);
  const std::vector<TokenId> outside = {1, 1000};
  EXPECT_THROW(m.calibrate_kv_scales(outside, DType::fp8_e4m3), InvalidArgument);
}

TEST(KVAccuracy, CompareRefusesBadArguments) {
  const Model m = tiny_model();
  KVCompareOptions o;
  EXPECT_THROW(compare_kv_dtypes(m, {}, 4, o), InvalidArgument);
  EXPECT_THROW(compare_kv_dtypes(m, prompt_of(4), 0, o), InvalidArgument);
  EXPECT_THROW(compare_kv_dtypes(m, prompt_of(4), m.config().max_position, o), InvalidArgument);
  o.page_size = 0;
  EXPECT_THROW(compare_kv_dtypes(m, prompt_of(4), 4, o), InvalidArgument);
  o.page_size = 8;
  o.dtype = DType::fp8_e4m3;
  o.scales = KVScales(3, 2);  // the model has 2 layers
  EXPECT_THROW(compare_kv_dtypes(m, prompt_of(4), 4, o), InvalidArgument);
}

// The scheduler serves every cache dtype; greedy decoding on each follows
// the f32 cache's 8 tokens on this prompt.
TEST(KVAccuracy, TheSchedulerServesEveryCacheDType) {
  const Model m = tiny_model();
  std::vector<TokenId> f32_tokens;
  for (DType dtype :
       {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2, DType::int8}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    PagedKVCacheManager manager(m.config().cache_params(CacheStrategy::paged, 8, dtype), 16, 2,
                                128);
    if (is_fp8(dtype)) manager.set_kv_scales(m.calibrate_kv_scales(prompt_of(24), dtype));
    SchedulerConfig config;
    config.max_num_seqs = 2;
    Scheduler s(m, manager, config);
    Request r;
    r.prompt = prompt_of(24);
    r.max_new_tokens = 8;
    s.add_request(r);
    s.run_to_completion();
    const auto out = s.take_finished();
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].tokens.size(), 8u);
    if (dtype == DType::f32) f32_tokens = out[0].tokens;
    EXPECT_EQ(out[0].tokens, f32_tokens);
    EXPECT_EQ(manager.num_active_sequences(), 0u);
  }
}

}  // namespace
}  // namespace kvcache::engine
