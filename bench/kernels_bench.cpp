// Google Benchmark micro-benchmarks of the CPU kernels on small, cache-resident
// caches (a paged manager with a shuffled free list, built by the harness
// `kvcache bench` shares: tools/bench_harness.h). The DRAM-resident, roofline-checked
// figures come from `kvcache bench` (docs/PERFORMANCE.md, "Kernels").
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "bench_harness.h"
#include "kvcache/collection.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/rope_table.h"
#include "kvcache/thread_pool.h"

namespace kvcache {
namespace {

constexpr std::uint32_t kKv = 8, kDim = 128, kPage = 16;

// A paged cache of `batch` sequences (8 KV heads x 128, pages of 16, the
// free list shuffled), built and filled by the harness `kvcache bench` uses
// (tools/bench_harness.h): `history` tokens committed, `fresh` fetched and
// stored; col views the fetched batch, ro its row offsets.
template <CacheElement T>
struct Cache {
  bench::BenchCache c;
  PagedKVCacheCollection<T> col;
  std::vector<std::uint32_t> ro;
  Cache(std::uint32_t batch, std::uint32_t history, std::uint32_t fresh)
      : c(make(batch, history, fresh)),
        col(c.batches[0].paged<T>()),
        ro(bench::offsets(batch, fresh)) {}

  static bench::BenchCache make(std::uint32_t batch, std::uint32_t history, std::uint32_t fresh) {
    KVCacheParams p;
    p.dtype = dtype_of_v<T>;
    p.num_layers = 1;
    p.n_kv_heads = kKv;
    p.head_dim = kDim;
    p.cache_strategy = CacheStrategy::paged;
    p.page_size = kPage;
    std::mt19937 rng(1);
    bench::BenchCache c = bench::make_cache(p, batch, true, 1, history + fresh, rng);
    bench::fill<T>(c, p, history, fresh, true, nullptr, rng);
    return c;
  }
};

// One batch-1 decode call (8 KV heads, `q_heads` query heads, `context`
// tokens, one new) over a self-owned cache with a shuffled page table.
template <CacheElement T>
struct BatchOneDecode {
  Cache<T> c;
  std::vector<float> q, out;
  BatchOneDecode(std::uint32_t q_heads, std::uint32_t context)
      : c(1, context - 1, 1), q(q_heads * kDim, 0.3f), out(q.size()) {}
  void run(const AttentionOptions& options, ThreadPool& pool) {
    const auto q_heads = static_cast<std::uint32_t>(q.size() / kDim);
    attention(c.col.get_key_cache(0), c.col.get_value_cache(0), std::span<const float>(q), q_heads,
              std::span<const std::uint32_t>(c.ro), std::span(out), options, &pool);
    benchmark::DoNotOptimize(out.data());
  }
};

template <class T>
void DecodeAttention(benchmark::State& state, const AttentionOptions& options) {
  const auto context = static_cast<std::uint32_t>(state.range(1));
  BatchOneDecode<T> d(static_cast<std::uint32_t>(state.range(0)), context);
  ThreadPool pool(static_cast<std::size_t>(state.range(2)));
  for (auto _ : state) d.run(options, pool);
  state.SetBytesProcessed(state.iterations() * std::int64_t{context} * kKv * kDim * 2 *
                          std::int64_t(sizeof(T)));
}

template <class T>
void BM_DecodeAttention(benchmark::State& state) {
  DecodeAttention<T>(state, {});
}

// AttentionPrecision::bf16 (bf16 pair products where the processor has
// AVX512-BF16), against the BFloat16 rows of BM_DecodeAttention.
void BM_DecodeAttentionBf16Precision(benchmark::State& state) {
  DecodeAttention<BFloat16>(state, {.precision = AttentionPrecision::bf16});
}
BENCHMARK_TEMPLATE(BM_DecodeAttention, BFloat16)
    ->ArgsProduct({{8, 32}, {4096, 32768}, {1, 2}})
    ->UseRealTime();
BENCHMARK_TEMPLATE(BM_DecodeAttention, Half)->Args({32, 32768, 2})->UseRealTime();
// Batch 1 with a short context on 2 threads: split evenly over the threads
// (against the 1-thread rows below).
BENCHMARK_TEMPLATE(BM_DecodeAttention, BFloat16)
    ->ArgsProduct({{8, 32}, {256, 512}, {2}})
    ->UseRealTime();

// GQA 4 and 8 decode, one thread (CPU time = kernel time): context 4096 reads
// 16 MiB of bf16 K+V (beyond L2), context 512 reads 2 MiB (about L2-resident,
// closer to the compute cost).
BENCHMARK_TEMPLATE(BM_DecodeAttention, BFloat16)
    ->ArgsProduct({{64}, {4096}, {1}})
    ->ArgsProduct({{8, 32, 64}, {128, 512}, {1}})
    ->UseRealTime();
BENCHMARK_TEMPLATE(BM_DecodeAttention, Half)
    ->ArgsProduct({{32, 64}, {512, 4096}, {1}})
    ->UseRealTime();
BENCHMARK_TEMPLATE(BM_DecodeAttention, float)->ArgsProduct({{8, 32}, {512}, {1}})->UseRealTime();
BENCHMARK(BM_DecodeAttentionBf16Precision)
    ->ArgsProduct({{16, 32, 64}, {512, 4096}, {1}})
    ->UseRealTime();

void BM_PrefillAttention(benchmark::State& state) {
  const auto tokens = static_cast<std::uint32_t>(state.range(0));
  Cache<BFloat16> c(1, 0, tokens);
  std::vector<float> q(std::size_t{tokens} * 32 * kDim, 0.1f), out(q.size());
  ThreadPool pool(2);
  for (auto _ : state) {
    attention(c.col.get_key_cache(0), c.col.get_value_cache(0), std::span<const float>(q), 32,
              std::span<const std::uint32_t>(c.ro), std::span(out), {}, &pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOPs"] = benchmark::Counter(4.0 * kDim * 32 * tokens * (tokens + 1) / 2.0,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PrefillAttention)->Arg(512)->UseRealTime()->Unit(benchmark::kMillisecond);

template <class T>
void BM_StoreKv(benchmark::State& state) {
  const auto tokens = static_cast<std::uint32_t>(state.range(0));
  const bool rope = state.range(1) != 0;  // 2: with a RopeTable
  Cache<T> c(1, 0, tokens);
  std::vector<float> kv(std::size_t{tokens} * kKv * kDim, 0.5f);
  StoreOptions opt;
  opt.rope_k.enabled = rope;
  std::optional<RopeTable> table;
  if (state.range(1) == 2) {
    table.emplace(opt.rope_k, kDim, tokens);
    opt.rope_table = &*table;
  }
  for (auto _ : state) {
    store_kv(c.col.get_key_cache(0), c.col.get_value_cache(0), std::span<const float>(kv),
             std::span<const float>(kv), std::span<const std::uint32_t>(c.ro), opt);
  }
  state.SetBytesProcessed(state.iterations() * std::int64_t(kv.size()) * 2 *
                          std::int64_t(sizeof(float) + sizeof(T)));
}
BENCHMARK_TEMPLATE(BM_StoreKv, BFloat16)->ArgsProduct({{1024}, {0, 1, 2}});
BENCHMARK_TEMPLATE(BM_StoreKv, Half)->Args({1024, 0});

// Busy-waits `us` microseconds (the caller's other work between calls).
void busy_wait_us(std::int64_t us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

// A 2-thread parallel_for of two ~3 us indices after the caller was busy
// elsewhere for range(0) us: past ~100 us the worker sleeps, and the call
// costs what waking it costs the caller (timed: the call only).
void BM_ParallelForAfterIdle(benchmark::State& state) {
  ThreadPool pool(2);
  std::vector<double> sums(2);
  for (auto _ : state) {
    busy_wait_us(state.range(0));
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(2, [&](std::size_t i) {
      double x = 1.0;
      for (int k = 0; k < 2000; ++k) x = x * 1.0000001 + 1e-9;
      sums[i] += x;
    });
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  benchmark::DoNotOptimize(sums.data());
}
BENCHMARK(BM_ParallelForAfterIdle)->Arg(0)->Arg(200)->Arg(1000)->Arg(5000)->UseManualTime();

// Batch-1 decode (bf16, 8 KV heads, range(0) query heads, context range(1))
// on 2 threads after range(2) us of other work, as an engine calls attention
// once per layer (timed: the call only).
void BM_DecodeAttentionAfterIdle(benchmark::State& state) {
  BatchOneDecode<BFloat16> d(static_cast<std::uint32_t>(state.range(0)),
                             static_cast<std::uint32_t>(state.range(1)));
  ThreadPool pool(2);
  for (auto _ : state) {
    busy_wait_us(state.range(2));
    const auto t0 = std::chrono::steady_clock::now();
    d.run({}, pool);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}
BENCHMARK(BM_DecodeAttentionAfterIdle)->ArgsProduct({{32}, {512}, {0, 1000}})->UseManualTime();

}  // namespace
}  // namespace kvcache
