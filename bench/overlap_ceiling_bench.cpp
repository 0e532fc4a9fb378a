// How close to the streaming-read bandwidth can a kernel get that reads a
// paged cache (32 KiB pages in shuffled order, K and V side by side, as
// decode attention does) and does C fp32 FMAs per 128 bytes read (64 of K,
// 64 of V)? Decode attention on bf16 K/V does 4 FMAs per 128 bytes per query
// head of a KV head (K dot product + V accumulation): C = 4 for MHA, 16 for
// GQA 4, 32 for GQA 8. The FMAs are independent (8 accumulators), so this is
// the ceiling for an ideal kernel with that much arithmetic: on a machine
// whose cores need many misses in flight to reach stream bandwidth, the
// fraction falls as C grows even while the arithmetic alone would run far
// faster than memory (see docs/PERFORMANCE.md, "Decode: the ceiling").
//
//   build/bin/kvcache_bench --benchmark_filter=BM_PagedReadWithFma
//
// S > 1 interleaves S far-apart page streams line by line (more independent
// misses in flight per core). P > 0 (with S = 1) prefetches the K and V
// pages P positions ahead, one line per line read, spread over the page as
// the attention kernel's prefetch stream does: with prefetcht1, or with H = 0
// prefetcht0 (AttentionPrefetch::next_tile_l2 against next_tile_l1; on the
// a Zen 4 VM, 2 threads, prefetcht0 read 0.69x of prefetcht1
// with MHA's arithmetic, 0.94x with GQA 4's, which bounds that loop). AVX-512 only; skipped
// elsewhere. BM_PagedReadWithFmaAvx2<C, D> is the same ceiling for AVX2
// processors (each 16-lane FMA counted as two 8-lane ones; D = prefetcht0
// distance in lines).
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvcache {
namespace {

constexpr std::size_t kPageBytes = 32768;
constexpr std::size_t kBytes = std::size_t{512} << 20;  // per K and per V

struct Pages {
  char* k = nullptr;
  char* v = nullptr;
  std::vector<std::uint32_t> order;
  Pages() {
    k = static_cast<char*>(
        mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    v = static_cast<char*>(
        mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    madvise(k, kBytes, MADV_HUGEPAGE);
    madvise(v, kBytes, MADV_HUGEPAGE);
    for (std::size_t i = 0; i < kBytes / sizeof(float); ++i) {
      reinterpret_cast<float*>(k)[i] = 1e-3f;
      reinterpret_cast<float*>(v)[i] = 2e-3f;
    }
    order.resize(kBytes / kPageBytes);
    std::iota(order.begin(), order.end(), 0u);
    std::shuffle(order.begin(), order.end(), std::mt19937(1));
  }
  ~Pages() {
    munmap(k, kBytes);
    munmap(v, kBytes);
  }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
};

#if defined(__x86_64__)
// Sum of every lane of the 8 accumulators (keeps the reads from being optimised away).
__attribute__((target("avx512f"))) float sum_lanes(const __m512* a) {
  __m512 s = a[0];
  for (int i = 1; i < 8; ++i) s = _mm512_add_ps(s, a[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  return std::accumulate(lanes, lanes + 16, 0.0f);
}

// kSequential: the pages in address order instead of the shuffled one.
template <int C, int S, int P, int H = 1, bool kSequential = false>
__attribute__((target("avx512f,fma"))) float read_pages(const Pages& p, std::size_t first,
                                                        std::size_t count) {
  static_assert(P == 0 || S == 1, "prefetching is modelled for one stream");
  const auto page_at = [&](std::size_t i) { return kSequential ? i : std::size_t{p.order[i]}; };
  __m512 a[8];
  for (auto& x : a) x = _mm512_setzero_ps();
  const __m512 m = _mm512_set1_ps(0.999f);
  const std::size_t per = count / S;
  for (std::size_t i = 0; i < per; ++i) {
    const char* k[S];
    const char* v[S];
    for (int s = 0; s < S; ++s) {
      const std::size_t page = page_at(first + i + s * per);
      k[s] = p.k + page * kPageBytes;
      v[s] = p.v + page * kPageBytes;
    }
    const char* k_ahead = nullptr;
    const char* v_ahead = nullptr;
    if (P > 0 && i + P < per) {
      const std::size_t page = page_at(first + i + P);
      k_ahead = p.k + page * kPageBytes;
      v_ahead = p.v + page * kPageBytes;
    }
    for (std::size_t o = 0; o < kPageBytes; o += 64) {
      if (P > 0 && k_ahead != nullptr) {
        if constexpr (H == 0) {
          _mm_prefetch(k_ahead + o, _MM_HINT_T0);
          _mm_prefetch(v_ahead + o, _MM_HINT_T0);
        } else {
          _mm_prefetch(k_ahead + o, _MM_HINT_T1);
          _mm_prefetch(v_ahead + o, _MM_HINT_T1);
        }
      }
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) {
        const __m512 x = _mm512_loadu_ps(k[s] + o);
        const __m512 y = _mm512_loadu_ps(v[s] + o);
        a[0] = _mm512_add_ps(a[0], _mm512_add_ps(x, y));
#pragma GCC unroll 32
        for (int c = 0; c < C; ++c) a[c % 8] = _mm512_fmadd_ps(c & 1 ? x : y, m, a[c % 8]);
      }
    }
  }
  return sum_lanes(a);
}
#endif

#if defined(__x86_64__)
// AVX2 form of read_pages for processors without AVX-512 (Zen 3):
// C counts 16-lane FMAs per 128 bytes as above (each is two 8-lane FMAs
// here), 12 FMA accumulators (four FMAs of latency 4 issue two a cycle, so 8 are
// the least that keeps both units busy), and with D > 0 a prefetcht0 D lines
// ahead in the page order, one per line read, as the kernel's AVX2 decode
// loops prefetch into L1.
__attribute__((target("avx2,fma"))) float sum_lanes_avx2(const __m256* a, int n) {
  __m256 s = a[0];
  for (int i = 1; i < n; ++i) s = _mm256_add_ps(s, a[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  return std::accumulate(lanes, lanes + 8, 0.0f);
}

template <int C, int D, bool kBf16 = false>
__attribute__((target("avx2,fma"))) float read_pages_avx2(const Pages& p, std::size_t first,
                                                          std::size_t count) {
  constexpr int kAcc = 12;
  __m256 a[kAcc + 1];
  for (auto& x : a) x = _mm256_setzero_ps();
  const __m256 m = _mm256_set1_ps(0.999f);
  const __m256 hi_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
  constexpr std::size_t kLine = 64;
  static_assert(D * kLine < kPageBytes, "prefetch at most one page ahead");
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t page = p.order[first + i];
    const char* k = p.k + page * kPageBytes;
    const char* v = p.v + page * kPageBytes;
    const std::size_t ahead = i + 1 < count ? p.order[first + i + 1] : page;
    const char* k_next = p.k + ahead * kPageBytes;
    const char* v_next = p.v + ahead * kPageBytes;
    for (std::size_t o = 0; o < kPageBytes; o += kLine) {
      if constexpr (D > 0) {
        const std::size_t f = o + D * kLine;
        _mm_prefetch((f < kPageBytes ? k + f : k_next + (f - kPageBytes)), _MM_HINT_T0);
        _mm_prefetch((f < kPageBytes ? v + f : v_next + (f - kPageBytes)), _MM_HINT_T0);
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m256 x = _mm256_loadu_ps(reinterpret_cast<const float*>(k + o + 32 * h));
        __m256 y = _mm256_loadu_ps(reinterpret_cast<const float*>(v + o + 32 * h));
        if constexpr (kBf16) {  // K even elements, V odd ones: one conversion each
          x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(x), 16));
          y = _mm256_and_ps(y, hi_mask);
        }
        a[kAcc] = _mm256_add_ps(a[kAcc], _mm256_add_ps(x, y));
#pragma GCC unroll 32
        for (int c = 0; c < C; ++c) a[c % kAcc] = _mm256_fmadd_ps(c & 1 ? x : y, m, a[c % kAcc]);
      }
    }
  }
  return sum_lanes_avx2(a, kAcc + 1);
}
#endif

#if defined(__x86_64__)
// The decode kernel's access order, modelled: tiles of 32 tokens
// (two 32 KiB pages of 16 tokens x 8 heads x 256 bytes, K and V), 2 FMAs per
// 64-byte line, the rows of the tile two ahead prefetched (prefetcht1) as
// fast as the current tile's lines are read. kTokenMajor = false: head by
// head, K rows in blocks of 16 tokens read column-wise (line l of every row,
// then l + 1), then that head's V rows (the kernel's former order);
// true: K in blocks of 2 tokens x 8 heads read column-wise, V rows 4 tokens
// at a time across the heads (the kernel since).
template <bool kTokenMajor>
__attribute__((target("avx512f,fma"))) float read_tiles(const Pages& p, std::size_t first,
                                                        std::size_t count) {
  constexpr std::size_t kRow = 256, kTokenBytes = 8 * kRow, kAhead = 2;
  __m512 a[8];
  for (auto& x : a) x = _mm512_setzero_ps();
  const __m512 m = _mm512_set1_ps(0.999f);
  const std::size_t tiles = count / 2;
  for (std::size_t t = 0; t < tiles; ++t) {
    const char* k[2];
    const char* v[2];
    const char* kf[2] = {nullptr, nullptr};
    const char* vf[2] = {nullptr, nullptr};
    for (int j = 0; j < 2; ++j) {
      k[j] = p.k + p.order[first + 2 * t + j] * kPageBytes;
      v[j] = p.v + p.order[first + 2 * t + j] * kPageBytes;
      if (t + kAhead < tiles) {
        kf[j] = p.k + p.order[first + 2 * (t + kAhead) + j] * kPageBytes;
        vf[j] = p.v + p.order[first + 2 * (t + kAhead) + j] * kPageBytes;
      }
    }
    std::size_t next = 0;  // line pairs (K, V) of the tile ahead issued
    const auto stream = [&](std::size_t lines) {
      for (std::size_t i = 0; i < lines / 2 && kf[0] != nullptr && next < 1024; ++i, ++next) {
        const std::size_t j = next / 512, o = next % 512 * 64;
        _mm_prefetch(kf[j] + o, _MM_HINT_T1);
        _mm_prefetch(vf[j] + o, _MM_HINT_T1);
      }
    };
    const auto row = [&](const char* const* page, int tok, int h) {
      return page[tok / 16] + (tok % 16) * kTokenBytes + h * kRow;
    };
    const auto block = [&](const char* const* r)
        __attribute__((target("avx512f,fma"))) {  // 16 rows, column-wise
      for (int l = 0; l < 4; ++l) {
#pragma GCC unroll 16
        for (int u = 0; u < 16; ++u) {
          const __m512 x = _mm512_loadu_ps(r[u] + 64 * l);
          a[u % 8] = _mm512_fmadd_ps(x, m, a[u % 8]);
          a[(u + 1) % 8] = _mm512_fmadd_ps(x, m, a[(u + 1) % 8]);
        }
        stream(16);
      }
    };
    const auto whole_row = [&](const char* r) __attribute__((target("avx512f,fma"))) {
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) {
        const __m512 x = _mm512_loadu_ps(r + 64 * l);
        a[l] = _mm512_fmadd_ps(x, m, a[l]);
        a[l + 4] = _mm512_fmadd_ps(x, m, a[l + 4]);
      }
      stream(4);
    };
    const char* r[16];
    if constexpr (kTokenMajor) {
      for (int tok = 0; tok < 32; tok += 2) {
        for (int u = 0; u < 16; ++u) r[u] = row(k, tok + u / 8, u % 8);
        block(r);
      }
      for (int tg = 0; tg < 32; tg += 4)
        for (int h = 0; h < 8; ++h)
          for (int tok = tg; tok < tg + 4; ++tok) whole_row(row(v, tok, h));
    } else {
      for (int h = 0; h < 8; ++h) {
        for (int b = 0; b < 32; b += 16) {
          for (int u = 0; u < 16; ++u) r[u] = row(k, b + u, h);
          block(r);
        }
        for (int tok = 0; tok < 32; ++tok) whole_row(row(v, tok, h));
      }
    }
    stream(2048);
  }
  return sum_lanes(a);
}
#endif

// One read(pages, first, count) per thread, each over its share of the
// pages (sink[t]: thread t's sum).
template <class Read>
void ReadPagesOnce(const Pages& pages, const Read& read, std::vector<float>& sink) {
  const std::size_t threads = sink.size();
  const std::size_t share = pages.order.size() / threads;
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t)
    pool.emplace_back([&, t] { sink[t] = read(pages, t * share, share); });
  sink[0] = read(pages, 0, share);
  for (auto& th : pool) th.join();
  benchmark::DoNotOptimize(sink.data());
}

#if defined(__x86_64__)
// Whether the processor runs the AVX-512 loops (avx2: the AVX2 + FMA ones);
// if not, skips the benchmark with the reason.
bool HasIsaOrSkip(benchmark::State& state, bool avx2) {
  if (avx2 ? __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
           : __builtin_cpu_supports("avx512f")) {
    return true;
  }
  state.SkipWithError(avx2 ? "needs AVX2 and FMA" : "needs AVX-512");
  return false;
}
#endif

// Runs read(pages, first, count) on state.range(0) threads, each over its
// share of the shuffled page order; bytes = the whole K and V buffers.
template <class Read>
void ReadOnThreads(benchmark::State& state, const Read& read, bool avx2 = false) {
#if defined(__x86_64__)
  if (!HasIsaOrSkip(state, avx2)) return;
  static const Pages pages;
  std::vector<float> sink(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) ReadPagesOnce(pages, read, sink);
  state.SetBytesProcessed(state.iterations() * std::int64_t(2 * kBytes));
#else
  (void)read;
  state.SkipWithError("x86-64 only");
#endif
}

template <bool kTokenMajor>
void BM_TileReadOrder(benchmark::State& state) {
#if defined(__x86_64__)
  ReadOnThreads(state, read_tiles<kTokenMajor>);
#else
  state.SkipWithError("x86-64 only");
#endif
}

// The same pages read in shuffled and in address order in every iteration
// (C FMAs per 128 bytes, prefetcht1 of every line P pages ahead), on
// state.range(0) threads: `shuffled_over_sequential` is the mean of the
// per-iteration ratios, so both orders meet the same memory state. On the
// Zen 4 VM the memory bandwidth left to the VM came and went
// in windows of seconds (a stream of ~34 or of ~56 GB/s); shuffled 32 KiB
// pages read at ~0.9 of address order in the first and ~0.72 in the
// second, with or without arithmetic.
// Timed: the shuffled read.
template <int C, int P>
void BM_ShuffledOverSequential(benchmark::State& state) {
#if defined(__x86_64__)
  if (!HasIsaOrSkip(state, /*avx2=*/false)) return;
  static const Pages pages;
  std::vector<float> sink(static_cast<std::size_t>(state.range(0)));
  const auto timed = [&](auto read) {
    const auto t0 = std::chrono::steady_clock::now();
    ReadPagesOnce(pages, read, sink);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double ratios = 0.0, shuffled_s = 0.0, sequential_s = 0.0;
  for (auto _ : state) {
    const double sequential = timed(read_pages<C, 1, P, 1, true>);
    const double shuffled = timed(read_pages<C, 1, P, 1, false>);
    ratios += sequential / shuffled;
    shuffled_s += shuffled;
    sequential_s += sequential;
    state.SetIterationTime(shuffled);
  }
  const double n = static_cast<double>(state.iterations());
  const double gb = 2.0 * static_cast<double>(kBytes) / 1e9;
  state.counters["shuffled_over_sequential"] = ratios / n;
  state.counters["shuffled_gbps"] = gb * n / shuffled_s;
  state.counters["sequential_gbps"] = gb * n / sequential_s;
  state.SetBytesProcessed(state.iterations() * std::int64_t(2 * kBytes));
#else
  state.SkipWithError("x86-64 only");
#endif
}
BENCHMARK_TEMPLATE(BM_ShuffledOverSequential, 0, 0)
    ->Arg(2)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_ShuffledOverSequential, 4, 2)
    ->Arg(2)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_ShuffledOverSequential, 16, 2)
    ->Arg(2)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

template <int C, int S, int P = 0, int H = 1>
void BM_PagedReadWithFma(benchmark::State& state) {
#if defined(__x86_64__)
  ReadOnThreads(state, read_pages<C, S, P, H>);
#else
  state.SkipWithError("x86-64 only");
#endif
}

BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 0, 1)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 4, 1)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 4, 4)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 16, 1)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 16, 4)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 32, 1)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 32, 4)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
// AVX2: no arithmetic, MHA's (4), GQA 4's (16); each without a
// software prefetch and with one 32 lines ahead.
template <int C, int D, bool kBf16 = false>
void BM_PagedReadWithFmaAvx2(benchmark::State& state) {
#if defined(__x86_64__)
  ReadOnThreads(state, read_pages_avx2<C, D, kBf16>, /*avx2=*/true);
#else
  state.SkipWithError("x86-64 only");
#endif
}
BENCHMARK_TEMPLATE(BM_PagedReadWithFmaAvx2, 0, 0)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFmaAvx2, 4, 0)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFmaAvx2, 4, 32)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFmaAvx2, 16, 0)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFmaAvx2, 16, 32)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
// The same with a bf16 widening (shift or mask) of each vector loaded.
BENCHMARK_TEMPLATE(BM_PagedReadWithFmaAvx2, 16, 32, true)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Prefetching two pages ahead (what the kernel's prefetch stream models).
BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 0, 1, 2)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 4, 1, 2)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 16, 1, 2)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
// The same with prefetcht0.
BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 4, 1, 2, 0)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_PagedReadWithFma, 16, 1, 2, 0)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Head-major vs token-major tile reads.
BENCHMARK_TEMPLATE(BM_TileReadOrder, false)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_TileReadOrder, true)
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvcache
