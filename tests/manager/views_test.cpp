// Per-layer views over manager memory: layout, aliasing, load/store, checks.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::U32;

// Views are the trivially copyable descriptors kernels take (seed traits).
static_assert(KVCacheT<PagedKVCache<float>> && KVCacheT<PagedKVCache<Half>> &&
              KVCacheT<PagedKVCache<BFloat16>>);
static_assert(KVCacheT<ContinuousBatchingKVCache<float>> &&
              KVCacheT<ContinuousBatchingKVCache<Half>>);
static_assert(KVCollectionT<PagedKVCacheCollection<float>> &&
              KVCollectionT<ContinuousBatchingKVCacheCollection<BFloat16>>);
static_assert(std::is_trivially_copyable_v<PagedKVCacheCollection<Half>>);
static_assert(PagedKVCache<float>::is_paged && !ContinuousBatchingKVCache<float>::is_paged);

// ---- helpers ------------------------------------------------------------------

// Both managers behind one factory so every layout test runs on both.
struct CacheSetup {
  KVCacheParams params;
  std::unique_ptr<KVCacheManager> mgr;
  std::uint32_t page_size;  // page_size or max_seq_len
};

CacheSetup make_setup(CacheStrategy s, DType dtype, std::uint32_t layers, std::uint32_t heads,
                      std::uint32_t dim, std::uint32_t page_size, std::uint32_t blocks,
                      std::uint32_t max_batch, std::uint32_t max_seq, std::uint32_t n_devices = 1,
                      PageLayout layout = PageLayout::nhd,
                      PoolArrangement arrangement = PoolArrangement::interleaved) {
  CacheSetup st;
  st.params = kvtest::make_params(s, layers, heads, dim, s == CacheStrategy::paged ? page_size : 0,
                                  dtype, n_devices);
  st.params.page_layout = layout;
  st.params.pool_arrangement = arrangement;
  if (s == CacheStrategy::paged) {
    st.mgr = std::make_unique<PagedKVCacheManager>(st.params, blocks, max_batch, max_seq);
    st.page_size = page_size;
  } else {
    st.mgr = std::make_unique<ContinuousBatchingKVCacheManager>(st.params, max_batch, max_seq);
    st.page_size = max_seq;
  }
  return st;
}

// Calls f(collection) with the typed collection of the batch's strategy.
template <class T, class F>
void with_collection(const KVCacheBatch& b, std::uint32_t device, F&& f) {
  if (b.strategy() == CacheStrategy::paged)
    f(b.paged<T>(device));
  else
    f(b.continuous<T>(device));
}

// Hand-computed element offset of (b, kv, layer, head, tok, d) from the
// documented layouts: interleaved blocks[num_blocks][2][num_layers][X],
// per_layer blocks[num_layers][2][num_blocks][X], X = [page_size][heads][dim]
// (NHD) or [heads][page_size][dim] (HND).
std::size_t expected_offset(const KVCacheBatch& batch, std::uint32_t b, std::uint32_t kv,
                            std::uint32_t layer, std::uint32_t head, std::uint32_t tok,
                            std::uint32_t d) {
  const auto& p = batch.params();
  const std::size_t H = p.n_kv_heads_per_device(), D = p.head_dim, L = p.num_layers;
  const std::size_t T = batch.page_size();
  const std::uint32_t block =
      batch.lookup_table()[std::size_t{b} * batch.lookup_stride() + tok / T];
  const std::size_t N = batch.num_blocks();
  const std::size_t outer = p.pool_arrangement == PoolArrangement::per_layer
                                ? (std::size_t{layer} * 2 + kv) * N + block
                                : (std::size_t{block} * 2 + kv) * L + layer;
  if (p.page_layout == PageLayout::hnd) return ((outer * H + head) * T + tok % T) * D + d;
  return (outer * T + tok % T) * H * D + head * D + d;
}

// ---- layout & aliasing --------------------------------------------------------

class ViewsLayout : public ::testing::TestWithParam<
                        std::tuple<CacheStrategy, DType, PageLayout, PoolArrangement>> {};

template <class T>
void run_layout_test(CacheStrategy strategy, PageLayout layout, PoolArrangement arrangement) {
  constexpr std::uint32_t L = 3, H = 2, D = 8, PS = 4, MAXSEQ = 16;
  CacheSetup st =
      make_setup(strategy, dtype_of_v<T>, L, H, D, PS, 20, 4, MAXSEQ, 1, layout, arrangement);
  const bool per_layer = arrangement == PoolArrangement::per_layer;
  const std::size_t N = st.mgr->total_blocks();
  auto& mgr = *st.mgr;
  const Ids ids = mgr.claim(3);
  // Interleave growth so pages of different sequences alternate.
  for (int r = 0; r < 3; ++r) {
    mgr.fetch(ids, U32{3, 2, 4});
    mgr.step(ids, U32{3, 2, 4});
  }
  const U32 new_tokens{2, 3, 1};
  KVCacheBatch batch = mgr.fetch(ids, new_tokens);
  const U32 lens{9, 6, 12};
  ASSERT_EQ(U32(batch.cache_lengths().begin(), batch.cache_lengths().end()), lens);
  const std::size_t total_elems = kvtest::buffer_bytes(mgr) / sizeof(T);

  T* base = static_cast<T*>(batch.blocks());
  std::mt19937_64 rng(42);
  // value written at each address, keyed by (b, kv, layer, head, tok, d)
  std::map<std::tuple<int, int, int, int, int, int>, T> written;
  std::set<const T*> addresses;

  with_collection<T>(batch, 0, [&](const auto& coll) {
    EXPECT_EQ(coll.blocks(), base);
    EXPECT_EQ(coll.num_layers(), L);
    EXPECT_EQ(coll.batch_size(), 3u);
    for (std::uint32_t b = 0; b < 3; ++b) EXPECT_EQ(coll.cache_length(b), lens[b]);
    for (std::uint32_t l = 0; l < L; ++l) {
      for (std::uint32_t kv = 0; kv < 2; ++kv) {
        const auto c = kv == 0 ? coll.get_key_cache(l) : coll.get_value_cache(l);
        EXPECT_EQ(c.n_kv_heads(), H);
        EXPECT_EQ(c.head_dim(), D);
        EXPECT_EQ(c.layout(), layout);
        EXPECT_EQ(c.token_stride(), layout == PageLayout::hnd ? D : std::size_t{H} * D);
        EXPECT_EQ(c.head_stride(),
                  layout == PageLayout::hnd ? std::size_t{st.page_size} * D : D);
        EXPECT_EQ(c.page_size(), st.page_size);
        EXPECT_EQ(c.batch_size(), 3u);
        for (std::uint32_t b = 0; b < 3; ++b) {
          EXPECT_EQ(c.cache_length(b), lens[b]);
          const std::uint32_t end = lens[b] + new_tokens[b];
          for (std::uint32_t tok = 0; tok < end; ++tok) {
            const std::uint32_t blk = tok / st.page_size;
            ASSERT_EQ(c.block_id(b, blk),
                      batch.lookup_table()[std::size_t{b} * batch.lookup_stride() + blk]);
            ASSERT_EQ(c.page_ptr(b, blk),
                      base + expected_offset(batch, b, kv, l, 0, blk * st.page_size, 0));
            // MAX: block_idx * stride + tok_in_block, stride = rows between
            // consecutive blocks of this layer's K (or V) in the pool.
            const std::uint64_t stride = per_layer ? st.page_size : 2 * L * st.page_size;
            const std::uint64_t row = c.row_idx(b, tok);
            ASSERT_EQ(row, c.block_id(b, blk) * stride + tok % st.page_size);
            for (std::uint32_t h = 0; h < H; ++h) {
              ASSERT_EQ(c.col_idx(h), h * D);
              for (std::uint32_t d = 0; d < D; ++d) {
                T* p = c.ptr(b, h, tok, d);
                const std::size_t off = expected_offset(batch, b, kv, l, h, tok, d);
                ASSERT_EQ(p, base + off) << "b" << b << " kv" << kv << " l" << l << " h" << h
                                         << " tok" << tok << " d" << d;
                ASSERT_LT(off, total_elems);
                ASSERT_EQ(c.matrix_ptr(row, c.col_idx(h) + d), p);
                if (layout == PageLayout::nhd) {
                  // layer_base + row_idx * (n_kv_heads * head_dim) + col_idx + d
                  const T* layer_base = base + expected_offset(batch, 0, kv, l, 0, 0, 0) -
                                        std::size_t{c.block_id(0, 0)} * stride * H * D;
                  ASSERT_EQ(layer_base + row * (std::size_t{H} * D) + c.col_idx(h) + d, p);
                }
                ASSERT_TRUE(addresses.insert(p).second)
                    << "address reached twice (aliasing) at b" << b << " kv" << kv << " l" << l;
                const T v = from_float<T>(kvtest::nonzero(rng));
                *p = v;
                written[{int(b), int(kv), int(l), int(h), int(tok), int(d)}] = v;
              }
            }
          }
        }
      }
    }
    // K of layer l, V of layer l and K of layer l+1 are different memory.
    for (std::uint32_t l = 0; l < L; ++l) {
      const T* k = coll.get_key_cache(l).ptr(0, 0, 0, 0);
      const T* v = coll.get_value_cache(l).ptr(0, 0, 0, 0);
      EXPECT_NE(k, v);
      const std::ptrdiff_t layer_block = std::ptrdiff_t{st.page_size} * H * D;
      EXPECT_EQ(v - k, per_layer ? std::ptrdiff_t(N) * layer_block : L * layer_block);
      if (l + 1 < L) {
        const T* k1 = coll.get_key_cache(l + 1).ptr(0, 0, 0, 0);
        EXPECT_NE(k, k1);
        EXPECT_NE(v, k1);
        EXPECT_EQ(k1 - k, per_layer ? 2 * std::ptrdiff_t(N) * layer_block : layer_block);
      }
    }
    // Read everything back through fresh views: a write through an aliasing
    // view would have overwritten an earlier value.
    for (const auto& [key, v] : written) {
      const auto [b, kv, l, h, tok, d] = key;
      const auto c = kv == 0 ? coll.get_key_cache(l) : coll.get_value_cache(l);
      ASSERT_EQ(std::memcmp(c.ptr(b, h, tok, d), &v, sizeof(T)), 0)
          << "b" << b << " kv" << kv << " l" << l << " h" << h << " tok" << tok << " d" << d;
    }
  });
  EXPECT_EQ(addresses.size(), written.size());
  mgr.check_invariants();
}

TEST_P(ViewsLayout, OffsetsAndNoAliasing) {
  // Named copies, not structured bindings: clang 14 cannot capture those.
  const CacheStrategy strategy = std::get<0>(GetParam());
  const PageLayout layout = std::get<2>(GetParam());
  const PoolArrangement arrangement = std::get<3>(GetParam());
  visit_dtype(std::get<1>(GetParam()),
              [&](auto t) { run_layout_test<decltype(t)>(strategy, layout, arrangement); });
}

INSTANTIATE_TEST_SUITE_P(All, ViewsLayout,
                         ::testing::Combine(::testing::Values(CacheStrategy::paged,
                                                              CacheStrategy::continuous),
                                            ::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(PageLayout::nhd, PageLayout::hnd),
                                            ::testing::Values(PoolArrangement::interleaved,
                                                              PoolArrangement::per_layer)));

// Float-only, both strategies: matrix view and block_paged_ptr tiles.
TEST(Views, BlockPagedPtrTilesAreContiguous) {
  for (CacheStrategy s : {CacheStrategy::paged, CacheStrategy::continuous}) {
    CacheSetup st = make_setup(s, DType::f32, 2, 3, 4, 8, 10, 2, 32);
    auto& mgr = *st.mgr;
    const Ids ids = mgr.claim(2);
    KVCacheBatch batch = mgr.fetch(ids, U32{24, 17});
    with_collection<float>(batch, 0, [&](const auto& coll) {
      const auto v = coll.get_value_cache(1);
      for (std::uint32_t b = 0; b < 2; ++b) {
        for (std::uint32_t start = 0; start + 4 <= batch.reserved_lengths()[b]; start += 4) {
          float* p = v.template block_paged_ptr<4>(b, start, 2, 1);
          EXPECT_EQ(p, v.ptr(b, 2, start, 1));
          for (std::uint32_t i = 0; i < 4; ++i)
            EXPECT_EQ(p + i * v.token_stride(), v.ptr(b, 2, start + i, 1));
        }
        // A whole block is one tile.
        float* blk = v.template block_paged_ptr<8>(b, 8, 0);
        for (std::uint32_t i = 0; i < 8; ++i) EXPECT_EQ(blk + i * 12, v.ptr(b, 0, 8 + i, 0));
      }
    });
  }
}

// ---- load / store -------------------------------------------------------------

template <class T>
void run_load_store(CacheStrategy s) {
  constexpr std::uint32_t L = 2, H = 2, D = 16;
  CacheSetup st = make_setup(s, dtype_of_v<T>, L, H, D, 4, 12, 2, 16);
  auto& mgr = *st.mgr;
  const Ids ids = mgr.claim(2);
  KVCacheBatch batch = mgr.fetch(ids, U32{11, 6});
  std::mt19937_64 rng(7 + static_cast<int>(s));
  with_collection<T>(batch, 0, [&](const auto& coll) {
    for (std::uint32_t l = 0; l < L; ++l) {
      const auto k = coll.get_key_cache(l);
      const auto v = coll.get_value_cache(l);
      for (std::uint32_t b = 0; b < 2; ++b) {
        for (std::uint32_t tok = 0; tok < batch.reserved_lengths()[b]; ++tok) {
          for (std::uint32_t h = 0; h < H; ++h) {
            std::array<T, 8> a{}, c{};
            std::array<T, 4> w4{};
            for (auto& x : a) x = from_float<T>(kvtest::nonzero(rng));
            for (auto& x : c) x = from_float<T>(kvtest::nonzero(rng));
            for (auto& x : w4) x = from_float<T>(kvtest::nonzero(rng));
            k.template store<8>(b, h, tok, 0, a);
            k.template store<4>(b, h, tok, 8, w4);
            k.template store<4>(b, h, tok, 12, w4);
            v.template store<8>(b, h, tok, 8, c);
            v.template store<8>(b, h, tok, 0, a);
            const auto ka = k.template load<8>(b, h, tok, 0);
            const auto k4 = k.template load<4>(b, h, tok, 12);
            const auto vc = v.template load<8>(b, h, tok, 8);
            const auto va = v.template load<8>(b, h, tok, 0);
            for (int i = 0; i < 8; ++i) {
              ASSERT_TRUE(ka[i] == a[i]);
              ASSERT_TRUE(vc[i] == c[i]);
              ASSERT_TRUE(va[i] == a[i]);
              ASSERT_TRUE(*k.ptr(b, h, tok, i) == a[i]);
              ASSERT_TRUE(*v.ptr(b, h, tok, 8 + i) == c[i]);
            }
            for (int i = 0; i < 4; ++i) {
              ASSERT_TRUE(k4[i] == w4[i]);
              ASSERT_TRUE(*k.ptr(b, h, tok, 8 + i) == w4[i]);
            }
            const auto one = k.template load<1>(b, h, tok, 3);
            ASSERT_TRUE(one[0] == a[3]);
          }
        }
      }
    }
  });
}

TEST(Views, LoadStoreRoundTripAllDtypes) {
  for (CacheStrategy s : {CacheStrategy::paged, CacheStrategy::continuous}) {
    run_load_store<float>(s);
    run_load_store<Half>(s);
    run_load_store<BFloat16>(s);
  }
}

// ---- wrong type / strategy / layer --------------------------------------------

TEST(Views, WrongTypeStrategyLayerDevice) {
  auto pp = kvtest::paged_params(2, 2, 4, 4, DType::f16);
  PagedKVCacheManager pm(pp, 8, 2, 16);
  KVCacheBatch pb = pm.fetch(pm.claim(1), U32{3});
  EXPECT_NO_THROW(pb.paged<Half>());
  KV_EXPECT_THROW(pb.paged<float>(), InvalidArgument, "f32");
  KV_EXPECT_THROW(pb.paged<BFloat16>(), InvalidArgument, "bf16");
  EXPECT_THROW(pb.continuous<Half>(), InvalidArgument);
  KV_EXPECT_THROW(pb.paged<Half>(1), InvalidArgument, "1");
  auto coll = pb.paged<Half>();
  EXPECT_NO_THROW(coll.get_key_cache(1));
  KV_EXPECT_THROW(coll.get_key_cache(2), InvalidArgument, "2");
  KV_EXPECT_THROW(coll.get_value_cache(7), InvalidArgument, "7");

  auto cp = kvtest::continuous_params(3, 1, 4, DType::bf16);
  ContinuousBatchingKVCacheManager cm(cp, 2, 8);
  KVCacheBatch cb = cm.fetch(cm.claim(1), U32{3});
  EXPECT_NO_THROW(cb.continuous<BFloat16>());
  EXPECT_THROW(cb.continuous<Half>(), InvalidArgument);
  EXPECT_THROW(cb.paged<BFloat16>(), InvalidArgument);
  auto cc = cb.continuous<BFloat16>();
  KV_EXPECT_THROW(cc.get_key_cache(3), InvalidArgument, "3");
  KV_EXPECT_THROW(cc.get_value_cache(100), InvalidArgument, "100");

  // A default (never fetched) batch has no views.
  KVCacheBatch empty;
  EXPECT_THROW(empty.paged<float>(), InvalidArgument);
  EXPECT_THROW(empty.continuous<float>(), InvalidArgument);
}

// ---- CollectionDesc validation ------------------------------------------------

struct OwnBuffer {
  static constexpr std::uint32_t kBlocks = 4, kLayers = 2, kTokens = 4, kHeads = 2, kDim = 4;
  std::vector<float> blocks =
      std::vector<float>(std::size_t{kBlocks} * 2 * kLayers * kTokens * kHeads * kDim);
  U32 cache_lengths{5, 0};
  U32 table{2, 0, 4, 3, 4, 4};  // stride 3; row 0 pages {2, 0}, row 1 page {3}
  CacheDesc desc() {
    CacheDesc d;
    d.blocks = blocks.data();
    d.cache_lengths = cache_lengths.data();
    d.lookup_table = table.data();
    d.lookup_stride = 3;
    d.batch_size = 2;
    d.max_seq_length = 3;
    d.max_cache_length = 8;
    d.num_layers = kLayers;
    d.page_size = kTokens;
    d.n_kv_heads = kHeads;
    d.head_dim = kDim;
    d.num_blocks = kBlocks;
    return d;
  }
};

TEST(CollectionDescTest, ValidDescAndLayout) {
  OwnBuffer ob;
  PagedKVCacheCollection<float> coll(ob.desc());
  EXPECT_EQ(coll.sentinel(), 4u);
  const auto k = coll.get_key_cache(1);
  const auto v = coll.get_value_cache(0);
  // Token 5 of entry 0 is in page table slot 1 -> block 0, row 1.
  EXPECT_EQ(k.ptr(0, 1, 5, 2), ob.blocks.data() + ((0 * 2 + 0) * 2 + 1) * 4 * 8 + 1 * 8 + 4 + 2);
  EXPECT_EQ(v.ptr(0, 0, 2, 3), ob.blocks.data() + ((2 * 2 + 1) * 2 + 0) * 4 * 8 + 2 * 8 + 3);
  // MAX's row: page 3 times the rows between pages of a layer (2 * 2 layers *
  // 4 tokens, interleaved) plus the token in its page.
  EXPECT_EQ(k.row_idx(1, 3), 3u * 16 + 3);
  ContinuousBatchingKVCacheCollection<float> cc(ob.desc());
  EXPECT_EQ(cc.max_seq_len(), 4u);
}

TEST(CollectionDescTest, RejectsBadDescs) {
  {
    OwnBuffer ob;
    ob.table[1] = 5;  // > num_blocks
    KV_EXPECT_THROW(PagedKVCacheCollection<float>(ob.desc()), InvalidArgument, "5");
  }
  {
    OwnBuffer ob;
    ob.table[3] = 99;
    KV_EXPECT_THROW(PagedKVCacheCollection<float>(ob.desc()), InvalidArgument, "99");
  }
  {
    OwnBuffer ob;
    auto d = ob.desc();
    d.blocks = nullptr;
    KV_EXPECT_THROW(PagedKVCacheCollection<float>(d), InvalidArgument, "blocks");
  }
  {
    OwnBuffer ob;
    auto d = ob.desc();
    d.layout = static_cast<PageLayout>(5);
    KV_EXPECT_THROW(PagedKVCacheCollection<float>(d), InvalidArgument, "layout value 5");
  }
  {
    OwnBuffer ob;
    auto d = ob.desc();
    d.cache_lengths = nullptr;
    KV_EXPECT_THROW(PagedKVCacheCollection<float>(d), InvalidArgument, "cache_lengths");
  }
  {
    OwnBuffer ob;
    auto d = ob.desc();
    d.lookup_table = nullptr;
    KV_EXPECT_THROW(PagedKVCacheCollection<float>(d), InvalidArgument, "lookup_table");
  }
  {
    OwnBuffer ob;
    auto d = ob.desc();
    d.num_layers = 0;
    EXPECT_THROW(PagedKVCacheCollection<float>{d}, InvalidArgument);
  }
  {
    OwnBuffer ob;
    auto d = ob.desc();
    d.head_dim = 0;
    EXPECT_THROW(ContinuousBatchingKVCacheCollection<float>{d}, InvalidArgument);
  }
  {
    OwnBuffer ob;
    ob.table[1] = 4;  // sentinel where entry 0 has committed tokens 4..5
    KV_EXPECT_THROW(PagedKVCacheCollection<float>{ob.desc()}, InvalidArgument,
                    "lookup_table[0][1] is the sentinel");
  }
  {
    OwnBuffer ob;
    auto d = ob.desc();
    const U32 reserved{13, 1};  // entry 0's table has room for 3 * 4 = 12 tokens
    d.reserved_lengths = reserved.data();
    KV_EXPECT_THROW(PagedKVCacheCollection<float>(d), InvalidArgument, "needs 4 blocks for 13");
  }
  {
    OwnBuffer ob;
    auto d = ob.desc();
    const U32 reserved{8, 5};  // entry 1 holds page 3 only: tokens 4..5 would be the sentinel
    d.reserved_lengths = reserved.data();
    KV_EXPECT_THROW(PagedKVCacheCollection<float>(d), InvalidArgument,
                    "lookup_table[1][1] is the sentinel but entry 1 has 5 reserved");
  }
  {
    OwnBuffer ob;
    auto d = ob.desc();
    const U32 reserved{4, 0};  // below cache_lengths[0] = 5
    d.reserved_lengths = reserved.data();
    KV_EXPECT_THROW(PagedKVCacheCollection<float>(d), InvalidArgument,
                    "reserved_lengths[0] = 4 is below cache_lengths[0] = 5");
  }
  {
    OwnBuffer ob;
    auto d = ob.desc();
    d.arrangement = static_cast<PoolArrangement>(3);
    KV_EXPECT_THROW(PagedKVCacheCollection<float>(d), InvalidArgument, "arrangement value 3");
  }
  {  // MAX multistep: max_cache_length may exceed the table's room (an upper bound)
    OwnBuffer ob;
    auto d = ob.desc();
    d.max_cache_length = 13;
    EXPECT_NO_THROW(PagedKVCacheCollection<float>{d});
  }
  {
    OwnBuffer ob;
    ob.cache_lengths[0] = 9;  // above max_cache_length 8
    KV_EXPECT_THROW(PagedKVCacheCollection<float>{ob.desc()}, InvalidArgument,
                    "cache_lengths[0] = 9 exceeds max_cache_length 8");
  }
}

// ---- multi-device -------------------------------------------------------------

TEST(Views, DevicesHoldDisjointShards) {
  for (CacheStrategy s : {CacheStrategy::paged, CacheStrategy::continuous}) {
    CacheSetup st = make_setup(s, DType::f32, 2, 4, 4, 4, 8, 2, 8, /*n_devices=*/2);
    auto& mgr = *st.mgr;
    KVCacheBatch batch = mgr.fetch(mgr.claim(1), U32{6});
    const std::size_t bytes = kvtest::buffer_bytes(mgr);
    auto* d0 = static_cast<char*>(batch.blocks(0));
    auto* d1 = static_cast<char*>(batch.blocks(1));
    EXPECT_TRUE(d0 + bytes <= d1 || d1 + bytes <= d0) << "device buffers overlap";
    with_collection<float>(batch, 0, [&](const auto& c0) {
      with_collection<float>(batch, 1, [&](const auto& c1) {
        EXPECT_EQ(c0.get_key_cache(0).n_kv_heads(), 2u);
        for (std::uint32_t tok = 0; tok < 6; ++tok)
          for (std::uint32_t h = 0; h < 2; ++h) {
            *c0.get_key_cache(1).ptr(0, h, tok, 1) = 1.0f + tok;
            *c1.get_key_cache(1).ptr(0, h, tok, 1) = -1.0f - tok;
          }
        for (std::uint32_t tok = 0; tok < 6; ++tok)
          for (std::uint32_t h = 0; h < 2; ++h) {
            EXPECT_EQ(*c0.get_key_cache(1).ptr(0, h, tok, 1), 1.0f + tok);
            EXPECT_EQ(*c1.get_key_cache(1).ptr(0, h, tok, 1), -1.0f - tok);
          }
      });
    });
  }
}

}  // namespace
