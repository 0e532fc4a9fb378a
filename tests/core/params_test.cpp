// KVCacheParams validation and memory math.
#include "kvcache/params.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::make_params;

KVCacheParams good() { return make_params(CacheStrategy::paged, 4, 8, 64, 16, DType::bf16, 2); }

TEST(Params, DefaultsAndGoodParamsValidate) {
  KVCacheParams p;  // f32, 1 layer, 1 head, dim 64, continuous
  EXPECT_NO_THROW(p.validate());
  EXPECT_NO_THROW(good().validate());
  auto c = make_params(CacheStrategy::continuous, 2, 4, 32);
  c.page_size = 16;  // ignored for continuous
  EXPECT_NO_THROW(c.validate());
  auto pc = good();
  pc.enable_prefix_caching = true;
  EXPECT_NO_THROW(pc.validate());
}

TEST(Params, ZeroSizesAreRejectedByName) {
  {
    auto p = good();
    p.num_layers = 0;
    KV_EXPECT_THROW(p.validate(), InvalidArgument, "num_layers");
  }
  {
    auto p = good();
    p.n_kv_heads = 0;
    KV_EXPECT_THROW(p.validate(), InvalidArgument, "n_kv_heads");
  }
  {
    auto p = good();
    p.head_dim = 0;
    KV_EXPECT_THROW(p.validate(), InvalidArgument, "head_dim");
  }
  {
    auto p = good();
    p.n_devices = 0;
    KV_EXPECT_THROW(p.validate(), InvalidArgument, "n_devices");
  }
}

TEST(Params, PagedNeedsPageSize) {
  auto p = good();
  p.page_size = 0;
  KV_EXPECT_THROW(p.validate(), InvalidArgument, "page_size");
}

TEST(Params, PrefixCachingNeedsPaged) {
  auto p = make_params(CacheStrategy::continuous, 2, 4, 32);
  p.enable_prefix_caching = true;
  KV_EXPECT_THROW(p.validate(), InvalidArgument, "prefix");
}

TEST(Params, DevicesMustDivideHeads) {
  auto p = make_params(CacheStrategy::continuous, 2, 8, 32, 0, DType::f32, 3);
  KV_EXPECT_THROW(p.validate(), InvalidArgument, "3", "8");
  p.n_devices = 16;  // more devices than heads
  KV_EXPECT_THROW(p.validate(), InvalidArgument, "16", "8");
  p.n_devices = 4;
  EXPECT_NO_THROW(p.validate());
  EXPECT_EQ(p.n_kv_heads_per_device(), 2u);
}

TEST(Params, HugeShapesAreRejected) {
  // 2 * 2^20 * 2^20 * 2^20 * 4 bytes per token overflows any sane byte count.
  auto p = make_params(CacheStrategy::continuous, 1u << 20, 1u << 20, 1u << 20);
  EXPECT_THROW(p.validate(), InvalidArgument);
  p = make_params(CacheStrategy::paged, 0xffffffffu, 0xffffffffu, 0xffffffffu, 16);
  EXPECT_THROW(p.validate(), InvalidArgument);
}

// The refusal names the true per-token size, computed in 128 bits: three
// 2^32 - 1 dimensions in f16 need 4 * (2^32 - 1)^3 bytes, which a 64-bit
// product wrapped to 51539607548 (issue 40, item 10).
TEST(Params, HugeShapeMessageNamesTheUnwrappedSize) {
  auto p = make_params(CacheStrategy::paged, 0xffffffffu, 0xffffffffu, 0xffffffffu, 16, DType::f16);
  KV_EXPECT_THROW(p.validate(), InvalidArgument, "316912649835696421541200789500 bytes",
                  "limit of 2147483648");
  p.dtype = DType::f32;
  KV_EXPECT_THROW(p.validate(), InvalidArgument, "633825299671392843082401579000 bytes");
  p = make_params(CacheStrategy::paged, 1u << 14, 1u << 8, 1u << 8, 16, DType::f32);  // 2^33
  KV_EXPECT_THROW(p.validate(), InvalidArgument, "8589934592 bytes");
}

TEST(Params, BytesPerToken) {
  // Llama-3-8B: 32 layers, 8 KV heads, head_dim 128, bf16.
  auto llama8b = make_params(CacheStrategy::paged, 32, 8, 128, 16, DType::bf16);
  EXPECT_EQ(llama8b.bytes_per_token(), 2u * 32 * 8 * 128 * 2);
  EXPECT_EQ(llama8b.bytes_per_token(), 131072u);
  EXPECT_EQ(llama8b.bytes_per_token_per_device(), 131072u);
  // Same over 4 devices: 2 heads each.
  auto tp4 = llama8b;
  tp4.n_devices = 4;
  EXPECT_EQ(tp4.bytes_per_token(), 131072u);
  EXPECT_EQ(tp4.bytes_per_token_per_device(), 131072u / 4);
  EXPECT_EQ(tp4.n_kv_heads_per_device(), 2u);
  // Llama-3-70B f16: 80 layers, 8 heads, 128 dim -> 327680 bytes.
  auto l70 = make_params(CacheStrategy::continuous, 80, 8, 128, 0, DType::f16);
  EXPECT_EQ(l70.bytes_per_token(), 327680u);
  // Small f32 shape.
  auto tiny = make_params(CacheStrategy::continuous, 3, 5, 7, 0, DType::f32);
  EXPECT_EQ(tiny.bytes_per_token(), 2u * 3 * 5 * 7 * 4);
  EXPECT_EQ(tiny.n_kv_heads_per_device(), 5u);
}

TEST(Params, StrategyNamesAndEquality) {
  EXPECT_EQ(strategy_name(CacheStrategy::paged), "paged");
  EXPECT_EQ(strategy_name(CacheStrategy::continuous), "continuous");
  EXPECT_EQ(parse_strategy("paged"), CacheStrategy::paged);
  EXPECT_EQ(parse_strategy("continuous"), CacheStrategy::continuous);
  KV_EXPECT_THROW(parse_strategy("radix"), InvalidArgument, "radix");
  auto a = good(), b = good();
  EXPECT_EQ(a, b);
  b.page_size = 32;
  EXPECT_FALSE(a == b);
  EXPECT_EQ(a.to_string(), "bf16 L4 kv8 d64 paged/16 x2 devices");
  EXPECT_EQ(b.to_string(), "bf16 L4 kv8 d64 paged/32 x2 devices");
  b.enable_prefix_caching = true;
  b.n_devices = 1;
  EXPECT_EQ(b.to_string(), "bf16 L4 kv8 d64 paged/32 +prefix");
  EXPECT_EQ(make_params(CacheStrategy::continuous, 2, 4, 32).to_string(),
            "f32 L2 kv4 d32 continuous");
}

TEST(Params, PageLayouts) {
  EXPECT_EQ(layout_name(PageLayout::nhd), "nhd");
  EXPECT_EQ(layout_name(PageLayout::hnd), "hnd");
  EXPECT_EQ(parse_layout("nhd"), PageLayout::nhd);
  EXPECT_EQ(parse_layout("hnd"), PageLayout::hnd);
  KV_EXPECT_THROW(parse_layout("nhwc"), InvalidArgument, "nhwc");
  auto a = good(), b = good();
  EXPECT_EQ(a.page_layout, PageLayout::nhd);  // the seeds' layout is the default
  b.page_layout = PageLayout::hnd;
  EXPECT_NO_THROW(b.validate());
  EXPECT_FALSE(a == b);
  EXPECT_NE(b.to_string().find("hnd"), std::string::npos);
  EXPECT_EQ(a.to_string().find("hnd"), std::string::npos);
  b.page_layout = static_cast<PageLayout>(7);
  KV_EXPECT_THROW(b.validate(), InvalidArgument, "page_layout");
}

}  // namespace
