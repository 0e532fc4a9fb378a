// Reference kernels (store_kv_reference, attention_reference) against a
// float64 oracle, over shuffled page tables, GQA, odd lengths and both caches.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "kvcache/kvcache.h"
#include "test_util.h"

namespace {

using namespace kvcache;
using kvtest::Ids;
using kvtest::SeqKV;
using kvtest::U32;

// A scenario: some sequences with a history written in interleaved chunks
// (so their pages are scattered), then one batch step with new tokens.
struct Scenario {
  std::uint32_t n_kv = 2;
  std::uint32_t group = 4;  // n_q_heads / n_kv
  std::uint32_t dim = 16;
  std::uint32_t layers = 2;
  U32 history;     // committed tokens per batch entry before the final step
  U32 new_tokens;  // tokens of the final step
  std::uint64_t seed = 1;
};

std::uint32_t ceil_div(std::uint32_t a, std::uint32_t b) { return (a + b - 1) / b; }

template <class T>
struct Harness {
  Scenario sc;
  std::unique_ptr<KVCacheManager> mgr;
  std::uint32_t page_size = 0;  // 0 = continuous
  Ids ids;
  // Per layer, per entry: what the cache must hold (quantized to T).
  std::vector<std::vector<SeqKV>> truth;
  std::mt19937_64 rng;

  Harness(const Scenario& s, std::uint32_t page_size_, bool churn)
      : sc(s), page_size(page_size_), rng(s.seed) {
    const std::uint32_t batch = static_cast<std::uint32_t>(sc.history.size());
    std::uint32_t max_len = 0;
    for (std::uint32_t b = 0; b < batch; ++b)
      max_len = std::max(max_len, sc.history[b] + sc.new_tokens[b]);
    // Room for the churn sequences too (up to 3 * page_size tokens each).
    const std::uint32_t max_seq = std::max(max_len + 8, 3 * std::max(page_size, 4u));
    if (page_size) {
      auto p = kvtest::paged_params(sc.layers, sc.n_kv, sc.dim, page_size, dtype_of_v<T>);
      std::uint32_t pages = 4 + 4 * 3;
      for (std::uint32_t b = 0; b < batch; ++b) pages += ceil_div(max_seq, page_size);
      mgr = std::make_unique<PagedKVCacheManager>(p, pages, batch + 4, max_seq);
    } else {
      auto p = kvtest::continuous_params(sc.layers, sc.n_kv, sc.dim, dtype_of_v<T>);
      mgr = std::make_unique<ContinuousBatchingKVCacheManager>(p, batch + 4, max_seq);
    }
    if (churn) do_churn();
    ids = mgr->claim(batch);
    truth.assign(sc.layers, std::vector<SeqKV>(batch));
    write_history();
    mgr->check_invariants();
  }

  std::size_t row() const { return std::size_t{sc.n_kv} * sc.dim; }

  // Claim, grow and release sequences in a shuffled order so the free list is
  // no longer 0, 1, 2, ...
  void do_churn() {
    const Ids tmp = mgr->claim(4);
    for (int r = 0; r < 3; ++r) {
      for (std::size_t i = 0; i < tmp.size(); ++i) {
        const std::uint32_t unit = page_size ? page_size : 4;
        const std::uint32_t n = 1 + static_cast<std::uint32_t>(rng() % unit);  // <= unit
        mgr->fetch(Ids{tmp[i]}, U32{n});
        mgr->step(Ids{tmp[i]}, U32{n});
      }
    }
    Ids order = tmp;
    std::shuffle(order.begin(), order.end(), rng);
    for (auto id : order) mgr->release(id);
    mgr->check_invariants();
  }

  // Stores new K/V for entries `sel` of a fetched batch via store_kv_reference
  // (all layers) and records them in `truth`.
  void store(const KVCacheBatch& batch, const std::vector<std::uint32_t>& entry_of_row,
             const U32& counts) {
    const U32 off = kvtest::offsets_of(counts);
    for (std::uint32_t l = 0; l < sc.layers; ++l) {
      const auto k_new = kvtest::random_vec(rng, off.back() * row());
      const auto v_new = kvtest::random_vec(rng, off.back() * row());
      with_views(batch, l, [&](const auto& k, const auto& v) {
        store_kv_reference(k, v, std::span<const float>(k_new), std::span<const float>(v_new),
                           std::span<const std::uint32_t>(off));
      });
      for (std::size_t i = 0; i < counts.size(); ++i) {
        SeqKV& t = truth[l][entry_of_row[i]];
        for (std::size_t e = off[i] * row(); e < off[i + 1] * row(); ++e) {
          t.k.push_back(kvtest::quantize<T>(k_new[e]));
          t.v.push_back(kvtest::quantize<T>(v_new[e]));
        }
      }
    }
  }

  template <class F>
  void with_views(const KVCacheBatch& batch, std::uint32_t layer, F&& f) {
    if (page_size) {
      auto c = batch.paged<T>();
      f(c.get_key_cache(layer), c.get_value_cache(layer));
    } else {
      auto c = batch.continuous<T>();
      f(c.get_key_cache(layer), c.get_value_cache(layer));
    }
  }

  // History in chunks, round-robin over sequences, each chunk its own fetch.
  void write_history() {
    const std::uint32_t batch = static_cast<std::uint32_t>(ids.size());
    U32 done(batch, 0);
    const std::uint32_t chunk = page_size ? std::max(1u, page_size / 2 + 1) : 5;
    bool more = true;
    while (more) {
      more = false;
      for (std::uint32_t b = 0; b < batch; ++b) {
        if (done[b] >= sc.history[b]) continue;
        const std::uint32_t n = std::min(chunk, sc.history[b] - done[b]);
        KVCacheBatch fb = mgr->fetch(Ids{ids[b]}, U32{n});
        EXPECT_EQ(fb.cache_lengths()[0], done[b]);
        store(fb, {b}, U32{n});
        mgr->step(Ids{ids[b]}, U32{n});
        done[b] += n;
        more = true;
      }
    }
  }

  // The final step: fetch all entries, store their new K/V.
  KVCacheBatch final_fetch() {
    KVCacheBatch batch = mgr->fetch(ids, sc.new_tokens);
    std::vector<std::uint32_t> entries(ids.size());
    std::iota(entries.begin(), entries.end(), 0u);
    store(batch, entries, sc.new_tokens);
    return batch;
  }

  // The cache holds exactly `truth` (checks store_kv's addressing).
  void check_cache_matches_truth(const KVCacheBatch& batch) {
    for (std::uint32_t l = 0; l < sc.layers; ++l) {
      with_views(batch, l, [&](const auto& k, const auto& v) {
        for (std::uint32_t b = 0; b < ids.size(); ++b) {
          const SeqKV& t = truth[l][b];
          const std::uint32_t len = t.length(sc.n_kv, sc.dim);
          ASSERT_EQ(len, sc.history[b] + sc.new_tokens[b]);
          for (std::uint32_t pos = 0; pos < len; ++pos)
            for (std::uint32_t h = 0; h < sc.n_kv; ++h)
              for (std::uint32_t d = 0; d < sc.dim; ++d) {
                const std::size_t e = pos * row() + h * sc.dim + d;
                ASSERT_EQ(to_float(*k.ptr(b, h, pos, d)), t.k[e])
                    << "K l" << l << " b" << b << " pos" << pos;
                ASSERT_EQ(to_float(*v.ptr(b, h, pos, d)), t.v[e])
                    << "V l" << l << " b" << b << " pos" << pos;
              }
        }
      });
    }
  }

  std::vector<float> attention(const KVCacheBatch& batch, std::uint32_t layer,
                               const std::vector<float>& q) {
    const std::uint32_t n_q = sc.n_kv * sc.group;
    std::vector<float> out(q.size(), 0.0f);
    const U32 off = kvtest::offsets_of(sc.new_tokens);
    with_views(batch, layer, [&](const auto& k, const auto& v) {
      attention_reference(k, v, std::span<const float>(q), n_q, std::span<const std::uint32_t>(off),
                          std::span<float>(out));
    });
    return out;
  }

  // True if some sequence's pages are not 0,1,2,... consecutive.
  bool pages_scattered(const KVCacheBatch& batch) const {
    if (!page_size) return true;
    for (std::uint32_t b = 0; b < batch.batch_size(); ++b) {
      for (std::uint32_t j = 0; j + 1 < batch.lookup_stride(); ++j) {
        const auto p0 = batch.lookup_table()[b * batch.lookup_stride() + j];
        const auto p1 = batch.lookup_table()[b * batch.lookup_stride() + j + 1];
        if (p1 == batch.num_blocks()) break;
        if (p1 != p0 + 1) return true;
      }
    }
    return false;
  }
};

// Tolerance: the reference accumulates in f32. Each score is a dim-term dot
// product of values in +-[0.05, 1] (relative error ~ dim * 2^-24 worst case,
// ~sqrt(dim) * 2^-24 typical) and each output a convex combination of at most
// a few hundred values in [-1, 1]; the resulting error is far below
// 1e-5 * (1 + |ref|), which is the bound we assert for an f32 cache.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
    const double err = std::fabs(double(got[i]) - want[i]);
    worst = std::max(worst, err / (1 + std::fabs(want[i])));
    ASSERT_LE(err, rel * (1 + std::fabs(want[i])))
        << what << " at " << i << ": got " << got[i] << " want " << want[i];
  }
  // The outputs are non-trivial (not all ~0).
  double mag = 0;
  for (double w : want) mag = std::max(mag, std::fabs(w));
  EXPECT_GT(mag, 1e-3) << what;
}

void run_attention(const Scenario& sc, std::uint32_t page_size, bool churn) {
  Harness<float> hz(sc, page_size, churn);
  KVCacheBatch batch = hz.final_fetch();
  hz.check_cache_matches_truth(batch);
  if (page_size && page_size < 64) {
    EXPECT_TRUE(hz.pages_scattered(batch)) << "test setup failed to scatter pages";
  }
  const std::uint32_t n_q = sc.n_kv * sc.group;
  const U32 off = kvtest::offsets_of(sc.new_tokens);
  for (std::uint32_t l = 0; l < sc.layers; ++l) {
    const auto q = kvtest::random_vec(hz.rng, off.back() * n_q * sc.dim);
    const auto got = hz.attention(batch, l, q);
    const auto want = kvtest::attention_f64(hz.truth[l], sc.history, off, q, n_q, sc.n_kv, sc.dim);
    expect_close(got, want, 1e-5,
                 "layer " + std::to_string(l) + " page_size " + std::to_string(page_size));
  }
  hz.mgr->step(hz.ids, sc.new_tokens);
  hz.mgr->check_invariants();
}

class AttentionRef : public ::testing::TestWithParam<std::tuple<std::uint32_t, std::uint32_t>> {};

TEST_P(AttentionRef, Prefill) {
  const auto [page_size, group] = GetParam();
  Scenario sc;
  sc.group = group;
  sc.history = {0, 0, 0};
  sc.new_tokens = {37, 1, 20};
  sc.seed = 11 + page_size + group;
  run_attention(sc, page_size, true);
}

TEST_P(AttentionRef, Decode) {
  const auto [page_size, group] = GetParam();
  Scenario sc;
  sc.group = group;
  sc.history = {129, 37, 1, 64};
  sc.new_tokens = {1, 1, 1, 1};
  sc.seed = 23 + page_size + group;
  run_attention(sc, page_size, true);
}

TEST_P(AttentionRef, MixedBatch) {
  const auto [page_size, group] = GetParam();
  Scenario sc;
  sc.group = group;
  sc.history = {37, 0, 129, 0, 16};
  sc.new_tokens = {1, 13, 3, 1, 17};
  sc.seed = 37 + page_size + group;
  run_attention(sc, page_size, page_size % 2 == 0);
}

INSTANTIATE_TEST_SUITE_P(PageSizesAndGqa, AttentionRef,
                         ::testing::Combine(::testing::Values(0u /*continuous*/, 1u, 16u, 128u),
                                            ::testing::Values(1u, 4u, 8u)),
                         [](const auto& info) {
                           const auto ps = std::get<0>(info.param);
                           return (ps ? "page" + std::to_string(ps) : std::string("continuous")) +
                                  "_gqa" + std::to_string(std::get<1>(info.param));
                         });

TEST(AttentionRefExtra, ExplicitScaleAndSingleHead) {
  Scenario sc;
  sc.n_kv = 1;
  sc.group = 1;
  sc.dim = 8;
  sc.layers = 1;
  sc.history = {5};
  sc.new_tokens = {3};
  Harness<float> hz(sc, 4, false);
  KVCacheBatch batch = hz.final_fetch();
  const U32 off = kvtest::offsets_of(sc.new_tokens);
  const auto q = kvtest::random_vec(hz.rng, 3 * 8);
  std::vector<float> out(q.size());
  auto c = batch.paged<float>();
  attention_reference(c.get_key_cache(0), c.get_value_cache(0), std::span<const float>(q), 1,
                      std::span<const std::uint32_t>(off), std::span<float>(out),
                      AttentionOptions{0.7f});
  const auto want = kvtest::attention_f64(hz.truth[0], sc.history, off, q, 1, 1, 8, double(0.7f));
  expect_close(out, want, 1e-5, "scale 0.7");
  // Causality: new rows sit at positions 5, 6, 7; changing K at position 7
  // (the last new token) may change only row 2's output.
  const std::vector<float> before = out;
  for (std::uint32_t d = 0; d < 8; ++d) *c.get_key_cache(0).ptr(0, 0, 7, d) = 3.0f;
  attention_reference(c.get_key_cache(0), c.get_value_cache(0), std::span<const float>(q), 1,
                      std::span<const std::uint32_t>(off), std::span<float>(out),
                      AttentionOptions{0.7f});
  for (std::uint32_t i = 0; i < 2 * 8; ++i) EXPECT_EQ(out[i], before[i]) << i;  // rows 0, 1
  bool changed = false;
  for (std::uint32_t i = 2 * 8; i < 3 * 8; ++i) changed |= out[i] != before[i];
  EXPECT_TRUE(changed) << "row 2 attends to position 7";
}

// Same K/V/Q in a continuous and a paged cache (scattered pages) -> same output.
TEST(AttentionRefExtra, ContinuousEqualsPaged) {
  Scenario sc;
  sc.n_kv = 2;
  sc.group = 4;
  sc.dim = 16;
  sc.layers = 2;
  sc.history = {37, 0, 129};
  sc.new_tokens = {1, 9, 2};
  sc.seed = 99;
  // Same seed and same sequence of random draws only if no churn differs, so
  // write the continuous truth into the paged cache explicitly instead.
  Harness<float> cont(sc, 0, false);
  KVCacheBatch cb = cont.final_fetch();
  for (std::uint32_t ps : {1u, 16u, 128u}) {
    Scenario empty_sc = sc;
    Harness<float> paged(empty_sc, ps, true);  // its own random history
    KVCacheBatch pb = paged.final_fetch();
    // Overwrite the paged cache with the continuous cache's contents.
    for (std::uint32_t l = 0; l < sc.layers; ++l) {
      auto pk = pb.paged<float>().get_key_cache(l), pv = pb.paged<float>().get_value_cache(l);
      auto ck = cb.continuous<float>().get_key_cache(l),
           cv = cb.continuous<float>().get_value_cache(l);
      for (std::uint32_t b = 0; b < 3; ++b)
        for (std::uint32_t pos = 0; pos < sc.history[b] + sc.new_tokens[b]; ++pos)
          for (std::uint32_t h = 0; h < sc.n_kv; ++h)
            for (std::uint32_t d = 0; d < sc.dim; ++d) {
              *pk.ptr(b, h, pos, d) = *ck.ptr(b, h, pos, d);
              *pv.ptr(b, h, pos, d) = *cv.ptr(b, h, pos, d);
            }
    }
    const U32 off = kvtest::offsets_of(sc.new_tokens);
    std::mt19937_64 rng(5);
    for (std::uint32_t l = 0; l < sc.layers; ++l) {
      const auto q = kvtest::random_vec(rng, off.back() * 8 * 16);
      const auto a = cont.attention(cb, l, q);
      const auto p = paged.attention(pb, l, q);
      for (std::size_t i = 0; i < a.size(); ++i)
        ASSERT_NEAR(a[i], p[i], 1e-6) << "page " << ps << " layer " << l << " at " << i;
    }
  }
}

// ---- store_kv_reference -------------------------------------------------------

template <class T>
void run_store_kv(std::uint32_t page_size) {
  Scenario sc;
  sc.n_kv = 2;
  sc.dim = 8;
  sc.layers = 2;
  sc.history = {6, 0, 11};
  sc.new_tokens = {3, 5, 1};
  sc.seed = 3 + page_size;
  Harness<T> hz(sc, page_size, true);
  KVCacheBatch batch = hz.mgr->fetch(hz.ids, sc.new_tokens);
  // Remember the whole buffer: store_kv must change the new positions only.
  // (They still hold the zero-initialised memory: nothing wrote there before,
  // and every stored value is non-zero, so each new element changes.)
  const std::size_t bytes = kvtest::buffer_bytes(*hz.mgr);
  const auto* raw = static_cast<const unsigned char*>(batch.blocks());
  const std::vector<unsigned char> before(raw, raw + bytes);
  std::vector<std::uint32_t> entries{0, 1, 2};
  hz.store(batch, entries, sc.new_tokens);
  hz.check_cache_matches_truth(batch);
  // Exactly the new positions changed: count the changed elements.
  const std::vector<unsigned char> after(raw, raw + bytes);
  std::size_t changed_elems = 0;
  for (std::size_t i = 0; i < bytes; i += sizeof(T))
    changed_elems += std::memcmp(&before[i], &after[i], sizeof(T)) != 0;
  const std::size_t new_total = 3 + 5 + 1;
  EXPECT_EQ(changed_elems, new_total * 2 * sc.layers * sc.n_kv * sc.dim);
  hz.mgr->step(hz.ids, sc.new_tokens);
  hz.mgr->check_invariants();
}

TEST(StoreKvRef, WritesAtCacheLengthPlusIAllDtypes) {
  for (std::uint32_t ps : {0u, 1u, 4u, 16u}) {
    run_store_kv<float>(ps);
    run_store_kv<Half>(ps);
    run_store_kv<BFloat16>(ps);
  }
}

// ---- argument validation --------------------------------------------------------

TEST(ReferenceValidation, RowOffsetsAndSizes) {
  auto p = kvtest::paged_params(1, 2, 4, 4);
  PagedKVCacheManager m(p, 8, 2, 16);
  const Ids ids = m.claim(2);
  KVCacheBatch b = m.fetch(ids, U32{2, 3});
  auto c = b.paged<float>();
  auto k = c.get_key_cache(0), v = c.get_value_cache(0);
  std::vector<float> kv(5 * 8, 0.5f), q(5 * 4 * 4, 0.5f), out(5 * 4 * 4);
  auto sk = std::span<const float>(kv);
  auto sq = std::span<const float>(q);
  const U32 good{0, 2, 5};
  EXPECT_NO_THROW(store_kv_reference(k, v, sk, sk, std::span<const std::uint32_t>(good)));
  EXPECT_NO_THROW(attention_reference(k, v, sq, 4, std::span<const std::uint32_t>(good),
                                      std::span<float>(out)));
  const U32 short_off{0, 5};
  KV_EXPECT_THROW(store_kv_reference(k, v, sk, sk, std::span<const std::uint32_t>(short_off)),
                  InvalidArgument, "2", "3");
  const U32 nonzero_start{1, 2, 5};
  KV_EXPECT_THROW(store_kv_reference(k, v, sk, sk, std::span<const std::uint32_t>(nonzero_start)),
                  InvalidArgument, "1");
  const U32 decreasing{0, 3, 2};
  KV_EXPECT_THROW(attention_reference(k, v, sq, 4, std::span<const std::uint32_t>(decreasing),
                                      std::span<float>(out)),
                  InvalidArgument);
  std::vector<float> small(4 * 8);
  KV_EXPECT_THROW(store_kv_reference(k, v, std::span<const float>(small), sk,
                                     std::span<const std::uint32_t>(good)),
                  InvalidArgument, "32", "40");
  KV_EXPECT_THROW(
      attention_reference(k, v, sq, 3, std::span<const std::uint32_t>(good), std::span<float>(out)),
      InvalidArgument, "3");
  KV_EXPECT_THROW(
      attention_reference(k, v, sq, 0, std::span<const std::uint32_t>(good), std::span<float>(out)),
      InvalidArgument);
  std::vector<float> small_out(10);
  KV_EXPECT_THROW(attention_reference(k, v, sq, 4, std::span<const std::uint32_t>(good),
                                      std::span<float>(small_out)),
                  InvalidArgument, "10");
}

}  // namespace
