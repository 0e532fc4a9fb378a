// tools/bench_store.cpp — `kvcache bench store`: store_kv (optionally with
// fused RoPE, its cos/sin computed per token or read from a RopeTable) timed
// against a copy moving the same number of bytes, in alternating rounds,
// after the fast store is checked bit for bit against store_kv_reference.
#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "bench.h"
#include "bench_harness.h"
#include "kvcache/kernels/bandwidth.h"
#include "kvcache/kernels/isa.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/kernels/rope.h"
#include "kvcache/kernels/rope_table.h"

namespace kvcache::tools {
namespace {

using bench::BenchCache;
using bench::median;
using bench::offsets;
using bench::random_floats;
using bench::time_calls;
using bench::with_layer;

// Fast vs reference store on a small cache of the same shape: entries of
// up to 37 new tokens (not a multiple of any page size) into fresh caches,
// RoPE applied on K by apply_rope_reference first where the run uses it.
// Returns how many elements differ (the fast store is bit-identical to the
// reference, so anything but 0 fails the check).
template <CacheElement T>
std::size_t check_store(const StoreArgs& a, const KVCacheParams& p, const StoreOptions& opt,
                        ThreadPool& pool, std::mt19937& rng) {
  StoreArgs small = a;
  small.batch = std::min<std::uint32_t>(a.batch, 3);
  const std::uint32_t tokens = std::min<std::uint32_t>(a.tokens, 37);
  const std::size_t row = std::size_t{a.kv_heads} * a.head_dim;
  const std::size_t n = std::size_t{small.batch} * tokens * row;
  const auto k = random_floats(n, rng);
  const auto v = random_floats(n, rng);
  const auto ro = offsets(small.batch, tokens);
  std::vector<float> k_ref = k;
  if (opt.rope_k.enabled) {
    for (std::size_t r = 0; r < std::size_t{small.batch} * tokens; ++r) {
      apply_rope_reference(std::span(k_ref).subspan(r * row, row), a.kv_heads, a.head_dim,
                           static_cast<std::uint32_t>(r % tokens), opt.rope_k);
    }
  }
  const bool shuffled = a.page_order == "shuffled";
  BenchCache fast = bench::make_cache(p, small.batch, shuffled, 1, tokens, rng);
  BenchCache ref = bench::make_cache(p, small.batch, shuffled, 1, tokens, rng);
  const std::vector<std::uint32_t> each(small.batch, tokens);
  const KVCacheBatch fb = fast.manager->fetch(fast.sets[0], each);
  const KVCacheBatch rb = ref.manager->fetch(ref.sets[0], each);
  with_layer<T>(fb, [&](const auto& kc, const auto& vc) {
    store_kv(kc, vc, std::span(k), std::span(v), std::span<const std::uint32_t>(ro), opt, &pool);
  });
  with_layer<T>(rb, [&](const auto& kc, const auto& vc) {
    store_kv_reference(kc, vc, std::span<const float>(k_ref), std::span(v),
                       std::span<const std::uint32_t>(ro));
  });
  std::size_t differ = 0;
  with_layer<T>(fb, [&](const auto& fk, const auto& fv) {
    with_layer<T>(rb, [&](const auto& rk, const auto& rv) {
      for (std::uint32_t b = 0; b < small.batch; ++b) {
        for (std::uint32_t h = 0; h < a.kv_heads; ++h) {
          for (std::uint32_t t = 0; t < tokens; ++t) {
            for (std::uint32_t d = 0; d < a.head_dim; ++d) {
              differ += std::memcmp(fk.ptr(b, h, t, d), rk.ptr(b, h, t, d), sizeof(T)) != 0;
              differ += std::memcmp(fv.ptr(b, h, t, d), rv.ptr(b, h, t, d), sizeof(T)) != 0;
            }
          }
        }
      }
    });
  });
  return differ;
}

}  // namespace

template <CacheElement T>
nlohmann::json bench_store(const StoreArgs& a) {
  const KVCacheParams p = bench_params(a);
  if (a.tokens == 0) throw InvalidArgument("--tokens must be at least 1");
  check_bench_tokens(a, p, "--tokens", a.tokens);
  const bool huge = huge_pages_on(a);
  ThreadPool pool(a.threads);
  std::mt19937 rng(7);
  BenchCache c = bench::make_cache(p, a.batch, a.page_order == "shuffled", 1, a.tokens, rng);
  std::vector<std::uint32_t> each(a.batch, a.tokens);
  c.batches.push_back(c.manager->fetch(c.sets[0], each));
  madvise(c.batches[0].blocks(0), c.bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  const std::size_t row = std::size_t{a.kv_heads} * a.head_dim;
  const std::size_t n = std::size_t{a.batch} * a.tokens * row;
  Buffer k_in(n * sizeof(float), huge), v_in(n * sizeof(float), huge);
  const auto ro = offsets(a.batch, a.tokens);
  StoreOptions opt;
  opt.rope_k.enabled = a.rope;
  // The new tokens sit at positions 0 .. tokens - 1 (the sequences are fresh);
  // the table is built before timing, as an engine builds it once per model.
  std::optional<RopeTable> table;
  if (a.rope_table) {
    table.emplace(opt.rope_k, a.head_dim, a.tokens);
    opt.rope_table = &*table;
  }
  opt.prefetch = parse_store_prefetch(a.prefetch);
  const bool row_l1 = resolve_store_prefetch(opt, p.dtype) == StorePrefetch::next_row_l1;
  auto call = [&](std::size_t) {
    with_layer<T>(c.batches[0], [&](const auto& k, const auto& v) {
      store_kv(k, v, std::span(static_cast<const float*>(k_in.p), n),
               std::span(static_cast<const float*>(v_in.p), n), std::span<const std::uint32_t>(ro),
               opt, &pool);
    });
  };
  // Read f32, write the cache (values, and int8's (token, head) scales).
  const double bytes = 2.0 * n * sizeof(float) +
                       double(a.batch) * a.tokens * (p.bytes_per_token_per_device() / p.num_layers);
  // The reference: a copy of bytes / 2 into another bytes / 2, so that it
  // moves as many bytes as the store. Store calls and copies alternate in
  // rounds and the fraction is the median of per-round ratios, as in bench
  // attention: the bandwidth this VM leaves us drifts by up to 2x within
  // seconds, so a copy timed after all the stores does not compare.
  const std::size_t copy_bytes = static_cast<std::size_t>(bytes / 2);
  Buffer copy_src(copy_bytes, huge), copy_dst(copy_bytes, huge);
  auto copy = [&](std::size_t) { kernels::stream_copy(copy_dst.p, copy_src.p, copy_bytes, &pool); };
  const std::size_t check_differ = check_store<T>(a, p, opt, pool, rng);
  call(0);  // warm-up: page faults, the pool's threads
  copy(0);
  const std::size_t repeats = a.repeats != 0 ? a.repeats : 21;
  const std::size_t rounds = std::min<std::size_t>(repeats, 7);
  const std::size_t per_round = (repeats + rounds - 1) / rounds;
  std::vector<double> times, copy_rates, fractions;
  for (std::size_t r = 0; r < rounds; ++r) {
    const auto t = time_calls(per_round, call);
    times.insert(times.end(), t.begin(), t.end());
    const auto c = time_calls(1, copy);
    copy_rates.push_back(bytes / c[0] / 1e9);  // read + write traffic
    fractions.push_back(bytes / median(t) / 1e9 / copy_rates.back());
  }
  const double med = median(times);
  return {{"bench", "store"},
          {"dtype", a.dtype},
          {"head_dim", a.head_dim},
          {"kv_heads", a.kv_heads},
          {"tokens", a.tokens},
          {"batch", a.batch},
          {"page_size", a.page_size},
          {"page_order", a.page_order},
          {"strategy", a.strategy},
          {"layout", a.layout},
          {"arrangement", a.arrangement},
          {"threads", a.threads},
          {"rope", a.rope},
          {"rope_table", a.rope_table},
          {"prefetch", row_l1 ? "row-l1" : "none"},
          {"huge_pages", a.huge_pages},
          {"isa", active_isa()},
          {"check_elements_differ", check_differ},
          {"check_ok", check_differ == 0},
          {"median_s", med},
          {"bytes_moved", bytes},
          {"gbps", bytes / med / 1e9},
          {"tokens_per_s", double(a.batch) * a.tokens / med},
          {"repeats", times.size()},
          {"rounds", rounds},
          {"memcpy_gbps", median(copy_rates)},
          {"fraction_of_memcpy", median(fractions)},
          {"fraction_of_memcpy_min", *std::min_element(fractions.begin(), fractions.end())},
          {"fraction_of_memcpy_max", *std::max_element(fractions.begin(), fractions.end())}};
}

template nlohmann::json bench_store<float>(const StoreArgs&);
template nlohmann::json bench_store<Half>(const StoreArgs&);
template nlohmann::json bench_store<BFloat16>(const StoreArgs&);
template nlohmann::json bench_store<Fp8E4M3>(const StoreArgs&);
template nlohmann::json bench_store<Fp8E5M2>(const StoreArgs&);
template nlohmann::json bench_store<Int8>(const StoreArgs&);

}  // namespace kvcache::tools
