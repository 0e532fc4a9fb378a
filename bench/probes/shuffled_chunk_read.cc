// Probe (not part of the CMake build; AVX-512 only): how fast can two cores
// read 32 KiB chunks (one K or V page of 16 tokens x 8 heads x 128 bf16) in
// shuffled order, with and without software prefetch, and with a fixed amount
// of arithmetic per 64-byte line (F FMAs after a bf16 even/odd split: F = 2 is
// about decode MHA's density, F = 8 about GQA 4's)? This is the ceiling a
// paged decode kernel could reach if memory and arithmetic overlapped
// perfectly (docs/PERFORMANCE.md, "Session 4").
//
//   g++ -O2 -march=native -std=c++20 bench/probes/shuffled_chunk_read.cc -o /tmp/chunk_probe -lpthread
//   /tmp/chunk_probe 2     # threads
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t kBytes = std::size_t{1} << 30;
constexpr std::size_t kChunk = 32 * 1024;
constexpr std::size_t kNoPrefetch = ~std::size_t{0};

// Reads chunks order[b, e) (F FMAs per line); prefetches (prefetcht1) the
// chunk `ahead` positions on, every `stride` bytes (64: every line, 128:
// every other line, leaving its neighbour to the hardware).
template <int F>
float read_chunks(const char* base, const std::vector<std::uint32_t>& order, std::size_t b,
                  std::size_t e, std::size_t ahead, std::size_t stride) {
  __m512 acc[8];  // independent FMA chains: latency 4 x 1 FMA per cycle needs >= 4
  for (__m512& x : acc) x = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (std::size_t u = b; u < e; ++u) {
    const char* p = base + std::size_t{order[u]} * kChunk;
    const char* q = ahead != kNoPrefetch && u + ahead < e
                        ? base + std::size_t{order[u + ahead]} * kChunk
                        : nullptr;
    for (std::size_t i = 0; i < kChunk; i += 256) {
      if (q != nullptr) {
        for (std::size_t o = 0; o < 256; o += stride) _mm_prefetch(q + i + o, _MM_HINT_T1);
      }
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) {
        const __m512i raw = _mm512_load_si512(p + i + 64 * l);
        const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
        const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(raw, mask));
        if constexpr (F == 0) {
          acc[2 * l] = _mm512_add_ps(acc[2 * l], lo);
          acc[2 * l + 1] = _mm512_add_ps(acc[2 * l + 1], hi);
        }
#pragma GCC unroll 8
        for (int f = 0; f < F; ++f) {
          __m512& a = acc[(l * F + f) % 8];
          a = _mm512_fmadd_ps(f % 2 ? lo : hi, f % 2 ? hi : lo, a);
        }
      }
    }
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 8; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}

struct Config {
  const char* name;
  bool shuffled;
  int flops;  // F
  std::size_t ahead;
  bool resident;  // the same 16 chunks over and over (L2)
  std::size_t stride = 64;
};

float run(const Config& c, const char* base, const std::vector<std::uint32_t>& seq,
          const std::vector<std::uint32_t>& shuf, std::size_t b, std::size_t e) {
  std::vector<std::uint32_t> local;
  const std::vector<std::uint32_t>* order = c.shuffled ? &shuf : &seq;
  if (c.resident) {
    local.resize(e - b);
    for (std::size_t k = 0; k < local.size(); ++k) local[k] = static_cast<std::uint32_t>(b + k % 16);
    order = &local;
    e -= b;
    b = 0;
  }
  switch (c.flops) {
    case 0: return read_chunks<0>(base, *order, b, e, c.ahead, c.stride);
    case 2: return read_chunks<2>(base, *order, b, e, c.ahead, c.stride);
    default: return read_chunks<8>(base, *order, b, e, c.ahead, c.stride);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  char* base = static_cast<char*>(std::aligned_alloc(2 << 20, kBytes));
  madvise(base, kBytes, MADV_HUGEPAGE);
  // bf16 values in [1, 2): no denormals or NaNs to slow the FMAs down.
  auto* halves = reinterpret_cast<std::uint16_t*>(base);
  for (std::size_t i = 0; i < kBytes / 2; ++i)
    halves[i] = static_cast<std::uint16_t>(0x3F80u | ((i * 131u) & 0x7Fu));
  const std::size_t n = kBytes / kChunk;
  std::vector<std::uint32_t> seq(n);
  std::iota(seq.begin(), seq.end(), 0u);
  std::vector<std::uint32_t> shuf = seq;
  std::shuffle(shuf.begin(), shuf.end(), std::mt19937(1));
  const Config configs[] = {
      {"sequential F0", false, 0, kNoPrefetch, false},
      {"shuffled F0", true, 0, kNoPrefetch, false},
      {"shuffled F0 prefetch 2 ahead", true, 0, 2, false},
      {"shuffled F2", true, 2, kNoPrefetch, false},
      {"shuffled F2 prefetch 2 ahead", true, 2, 2, false},
      {"shuffled F2 prefetch, every 2nd line", true, 2, 2, false, 128},
      {"shuffled F8", true, 8, kNoPrefetch, false},
      {"shuffled F8 prefetch 2 ahead", true, 8, 2, false},
      {"shuffled F8 prefetch, every 2nd line", true, 8, 2, false, 128},
      {"L2-resident F2", false, 2, kNoPrefetch, true},
      {"L2-resident F8", false, 8, kNoPrefetch, true},
  };
  float sink = 0;
  for (int round = 0; round < 3; ++round) {
    for (const Config& c : configs) {
      std::vector<double> times;
      for (int rep = 0; rep < 5; ++rep) {
        std::vector<float> sums(threads);
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            sums[t] = run(c, base, seq, shuf, n * t / threads, n * (t + 1) / threads);
          });
        }
        for (std::thread& th : pool) th.join();
        times.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        for (float s : sums) sink += s;
      }
      std::sort(times.begin(), times.end());
      std::printf("%-32s %6.1f GB/s\n", c.name, static_cast<double>(kBytes) / times[2] / 1e9);
    }
    std::printf("--\n");
  }
  std::free(base);
  return sink == 12345.0f ? 1 : 0;
}
