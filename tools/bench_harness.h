// tools/bench_harness.h — what the kernel benchmarks share: `kvcache bench`
// (tools/bench_attention.cpp, tools/bench_store.cpp) and the Google Benchmark
// programs (bench/kernels_bench.cpp) build their caches here.
//
// make_cache builds a manager through the public API (paged, optionally with
// a shuffled free list: every page first handed to a one-page sequence and
// released in random order, so a sequence's pages are scattered as in a
// long-running server; or continuous) and claims `sets` sets of `batch`
// sequences; fill writes random K/V with store_kv (history committed with
// step, then new tokens fetched and stored) and keeps each set's batch for
// the timed kernel. with_layer hands layer 0's K and V caches of a batch to a
// callable, for either strategy. Also the timing helpers (median, time_calls).
// Header-only; nothing global; the caller owns every object.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "kvcache/kernels/attention.h"
#include "kvcache/kvcache.h"
#include "kvcache/thread_pool.h"

namespace kvcache::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of each of n calls f(i).
template <class F>
std::vector<double> time_calls(std::size_t n, F&& f) {
  std::vector<double> t;
  for (std::size_t i = 0; i < n; ++i) {
    const double t0 = now_s();
    f(i);
    t.push_back(now_s() - t0);
  }
  return t;
}

inline std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Row offsets of `batch` entries of `each` rows: {0, each, 2 * each, ...}.
inline std::vector<std::uint32_t> offsets(std::uint32_t batch, std::uint32_t each) {
  std::vector<std::uint32_t> o(batch + 1);
  for (std::uint32_t b = 0; b <= batch; ++b) o[b] = b * each;
  return o;
}

// `sets` sequence sets of `batch` sequences, each with `tokens` tokens of room,
// in a manager built through the public API.
struct BenchCache {
  std::unique_ptr<KVCacheManager> manager;
  std::vector<std::vector<SeqId>> sets;
  std::vector<KVCacheBatch> batches;  // the fetched step of each set (fill)
  std::size_t bytes = 0;              // the manager's cache memory
};

// p.cache_strategy picks the manager (p.page_size its pages); shuffled: the
// paged free list in random order (see above).
inline BenchCache make_cache(const KVCacheParams& p, std::uint32_t batch, bool shuffled,
                             std::uint32_t sets, std::uint32_t tokens, std::mt19937& rng) {
  BenchCache c;
  const std::uint32_t seqs = sets * batch;
  if (p.cache_strategy == CacheStrategy::paged) {
    const std::uint32_t per_seq = (tokens + p.page_size - 1) / p.page_size;
    const std::uint32_t pages = per_seq * seqs + 1;
    c.manager = std::make_unique<PagedKVCacheManager>(
        p, pages, shuffled ? std::max(pages, seqs) : seqs, per_seq * p.page_size);
    c.bytes = PagedKVCacheManager::estimated_memory_size(p, pages);
    if (shuffled) {  // every page once to a one-page sequence, released in random order
      auto ids = c.manager->claim(pages);
      std::vector<std::uint32_t> one(ids.size(), 1);
      c.manager->fetch(ids, one);
      std::shuffle(ids.begin(), ids.end(), rng);
      for (SeqId id : ids) c.manager->release(id);
    }
  } else {
    c.manager = std::make_unique<ContinuousBatchingKVCacheManager>(p, seqs, tokens);
    c.bytes = ContinuousBatchingKVCacheManager::estimated_memory_size(p, seqs, tokens);
  }
  for (std::uint32_t s = 0; s < sets; ++s) c.sets.push_back(c.manager->claim(batch));
  return c;
}

// Runs f(k_cache, v_cache) on layer 0 of a batch, for either strategy.
template <CacheElement T, class F>
void with_layer(const KVCacheBatch& batch, F&& f) {
  if (batch.strategy() == CacheStrategy::paged) {
    auto col = batch.paged<T>();
    f(col.get_key_cache(0), col.get_value_cache(0));
  } else {
    auto col = batch.continuous<T>();
    f(col.get_key_cache(0), col.get_value_cache(0));
  }
}

// Fills `history` tokens per sequence (committed with step), then fetches
// `new_tokens` per sequence and stores them; keeps that batch of every set in
// c.batches for the timed kernel. The cache memory is advised 2 MiB pages
// (huge) or not before any page is touched. pool may be null.
template <CacheElement T>
void fill(BenchCache& c, const KVCacheParams& p, std::uint32_t history, std::uint32_t new_tokens,
          bool huge, ThreadPool* pool, std::mt19937& rng) {
  const std::size_t row = std::size_t{p.n_kv_heads} * p.head_dim;
  const std::uint32_t batch = static_cast<std::uint32_t>(c.sets[0].size());
  const std::uint32_t chunk =
      std::max<std::uint32_t>(1, std::min<std::uint32_t>(1024, 8192 / batch));
  const std::uint32_t src_rows = batch * std::max(chunk, new_tokens);
  const auto k_src = random_floats(src_rows * row, rng);
  const auto v_src = random_floats(src_rows * row, rng);
  bool advised = false;
  auto store = [&](const KVCacheBatch& kb, std::uint32_t each) {
    if (!advised) {  // before any page is touched
      madvise(kb.blocks(0), c.bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
      advised = true;
    }
    const auto ro = offsets(batch, each);
    const std::size_t n = std::size_t{batch} * each * row;
    with_layer<T>(kb, [&](const auto& k, const auto& v) {
      store_kv(k, v, std::span(k_src).first(n), std::span(v_src).first(n),
               std::span<const std::uint32_t>(ro), {}, pool);
    });
  };
  for (const auto& set : c.sets) {
    for (std::uint32_t done = 0; done < history;) {
      const std::uint32_t n = std::min(chunk, history - done);
      std::vector<std::uint32_t> each(batch, n);
      KVCacheBatch kb = c.manager->fetch(set, each);
      store(kb, n);
      c.manager->step(set, each);
      done += n;
    }
    std::vector<std::uint32_t> each(batch, new_tokens);
    c.batches.push_back(c.manager->fetch(set, each));
    store(c.batches.back(), new_tokens);
  }
}

}  // namespace kvcache::bench
