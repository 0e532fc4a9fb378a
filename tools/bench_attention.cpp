// tools/bench_attention.cpp — `kvcache bench attention`, in three steps:
//
// setup: builds the cache through the public API (bench_harness.h: paged
// manager with a shuffled free list, or a continuous manager; --strategy both
// builds both, holding the same K/V values), fills it with random K/V via
// store_kv and checks the fast kernel against attention_reference on a small
// sample of the same shape. DRAM-resident runs rotate over enough sequence
// sets that the working set is >= 1 GiB.
// run: times attention (warm-up, then rounds) alternating with a streaming
// read of a buffer as large as the working set and (decode) a read of the
// same pages without arithmetic; ratios are medians of per-round ratios.
// --strategy both times the two caches in alternation
// (paged_over_continuous); --prefetch all times every AttentionPrefetch
// strategy on one cache, `auto` first, and names the fastest
// (prefetch_sweep, best_prefetch).
// report: the JSON object (GB/s of unique K+V bytes against the stream and
// the roofline; prefill GFLOP/s against the fp32 FMA peak).
#include <algorithm>
#include <array>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "bench.h"
#include "bench_harness.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/bandwidth.h"
#include "kvcache/kernels/isa.h"
#include "kvcache/kernels/reference.h"

namespace kvcache::tools {
namespace {

using bench::BenchCache;
using bench::median;
using bench::offsets;
using bench::random_floats;
using bench::time_calls;
using bench::with_layer;

constexpr std::size_t kGiB = std::size_t{1} << 30;
// Rounds of kernel / stream / paged-read measurements.
constexpr std::size_t kBenchRounds = 5;

// The strategies --prefetch all times, `automatic` first (the main figures).
constexpr std::array kSweptPrefetches{AttentionPrefetch::automatic, AttentionPrefetch::next_step_l1,
                                      AttentionPrefetch::next_tile_l1,
                                      AttentionPrefetch::next_tile_l2, AttentionPrefetch::none};

// A cache a run builds: the one of --strategy, or with --strategy both a
// paged cache and a continuous one holding the same K/V values.
struct CacheUnderTest {
  KVCacheParams p;
  BenchCache c;
};

// What a run times: one (cache, options) pair, or several timed in
// alternation: with --strategy both the two caches (the pairing the "paged
// within 5 % of continuous" goal needs on a machine whose bandwidth drifts
// within seconds), with --prefetch all every prefetch strategy on one cache.
struct Subject {
  std::string label;  // the strategy, or (--prefetch all) the prefetch's name
  std::size_t cache = 0;
  AttentionOptions options;
  double check_err = 0;
  std::vector<double> times;
};

// Everything setup builds and run times.
struct AttentionSetup {
  std::vector<std::string> strategies;
  bool paired = false, sweep = false, decode = true, huge = true;
  KVCacheParams p;  // of the first strategy (the main figures)
  AttentionOptions options;
  double check_bound = 0;
  std::size_t set_bytes = 0;
  std::uint32_t sets = 1;
  std::vector<CacheUnderTest> caches;
  std::vector<Subject> subjects;
};

// What run measured, per round.
struct AttentionMeasurements {
  std::size_t rounds = 0;
  std::vector<double> stream_rates, read_rates, stream_fractions, read_fractions;
  // [k]: subject k's rate over subject 0's, one per round (from round medians).
  std::vector<std::vector<double>> over_first;
};

// Fast vs reference attention on a small cache of the same shape.
template <CacheElement T>
double check_attention(const AttentionArgs& a, const KVCacheParams& p, bool decode,
                       const AttentionOptions& options, ThreadPool& pool, std::mt19937& rng) {
  const std::uint32_t ctx = std::min<std::uint32_t>(a.context, decode ? 3000 : 200);
  BenchCache c = bench::make_cache(p, 1, a.page_order == "shuffled", 1, ctx, rng);
  bench::fill<T>(c, p, decode ? ctx - 1 : 0, decode ? 1 : ctx, true, &pool, rng);
  const std::uint32_t rows = decode ? 1 : ctx;
  const auto q = random_floats(std::size_t{rows} * a.q_heads * a.head_dim, rng);
  std::vector<float> ref(q.size()), fast(q.size());
  const auto ro = offsets(1, rows);
  with_layer<T>(c.batches[0], [&](const auto& k, const auto& v) {
    attention_reference(k, v, std::span(q), a.q_heads, std::span<const std::uint32_t>(ro),
                        std::span(ref), options);
    attention(k, v, std::span(q), a.q_heads, std::span<const std::uint32_t>(ro), std::span(fast),
              options, &pool);
  });
  double err = 0;
  for (std::size_t i = 0; i < q.size(); ++i)
    err = std::max<double>(err, std::fabs(ref[i] - fast[i]));
  return err;
}

// The flags' checks that bench_params does not make; fills in what setup needs.
void check_attention_args(const AttentionArgs& a, AttentionSetup& s) {
  if (a.strategy != "paged" && a.strategy != "continuous" && a.strategy != "both") {
    throw InvalidArgument("--strategy must be paged, continuous or both, got '" + a.strategy + "'");
  }
  s.paired = a.strategy == "both";
  s.sweep = a.prefetch == "all";
  if (s.paired && s.sweep) {
    throw InvalidArgument(
        "--prefetch all times one cache: it needs --strategy paged or "
        "continuous, got both");
  }
  s.strategies =
      s.paired ? std::vector<std::string>{"paged", "continuous"} : std::vector{a.strategy};
  AttentionArgs first = a;
  first.strategy = s.strategies[0];
  s.p = bench_params(first);
  if (a.q_heads == 0 || a.q_heads % a.kv_heads != 0) {
    throw InvalidArgument("--q-heads " + std::to_string(a.q_heads) +
                          " must be a positive multiple of --kv-heads " +
                          std::to_string(a.kv_heads));
  }
  if (a.mode != "decode" && a.mode != "prefill") {
    throw InvalidArgument("--mode must be decode or prefill, got '" + a.mode + "'");
  }
  if (a.resident != "dram" && a.resident != "cache") {
    throw InvalidArgument("--resident must be dram or cache, got '" + a.resident + "'");
  }
  if (a.context < 2) throw InvalidArgument("--context must be at least 2");
  check_bench_tokens(a, s.p, "--context", a.context);
  s.decode = a.mode == "decode";
  s.huge = huge_pages_on(a);
}

template <CacheElement T>
AttentionSetup setup_attention(const AttentionArgs& a, ThreadPool& pool, std::mt19937& rng) {
  AttentionSetup s;
  check_attention_args(a, s);
  const AttentionPrefetch prefetch =
      s.sweep ? AttentionPrefetch::automatic : parse_attention_prefetch(a.prefetch);
  s.options = {.prefetch = prefetch, .precision = parse_attention_precision(a.precision)};
  // AttentionPrecision::bf16 on a bf16 cache: the kernel and the reference
  // round probabilities against different maxima (kernels/reference.h), up
  // to 2^-8 of the largest |V| element (1 here).
  const bool bf16_inputs =
      s.options.precision == AttentionPrecision::bf16 && std::is_same_v<T, BFloat16>;
  s.check_bound = 1e-4 + (bf16_inputs ? 1.0 / 256 : 0.0);
  s.set_bytes = std::size_t{a.batch} * a.context * s.p.bytes_per_token();
  s.sets =
      a.resident == "dram" ? static_cast<std::uint32_t>((kGiB + s.set_bytes - 1) / s.set_bytes) : 1;
  s.caches.reserve(s.strategies.size());
  for (const std::string& strategy : s.strategies) {
    AttentionArgs sa = a;
    sa.strategy = strategy;
    CacheUnderTest& cut = s.caches.emplace_back();
    cut.p = bench_params(sa);
    cut.c = bench::make_cache(cut.p, a.batch, a.page_order == "shuffled", s.sets, a.context, rng);
    std::mt19937 values(4049);  // the same K/V values in every cache
    bench::fill<T>(cut.c, cut.p, s.decode ? a.context - 1 : 0, s.decode ? 1 : a.context, s.huge,
                   &pool, values);
  }
  if (s.sweep) {  // every strategy on the one cache
    for (const AttentionPrefetch pf : kSweptPrefetches) {
      AttentionOptions o = s.options;
      o.prefetch = pf;
      s.subjects.push_back({std::string(prefetch_name(pf)), 0, o, 0, {}});
    }
  } else {  // one subject per cache
    for (std::size_t k = 0; k < s.caches.size(); ++k)
      s.subjects.push_back({s.strategies[k], k, s.options, 0, {}});
  }
  for (Subject& subject : s.subjects) {
    subject.check_err =
        check_attention<T>(a, s.caches[subject.cache].p, s.decode, subject.options, pool, rng);
  }
  return s;
}

// Kernel calls, a streaming read of a buffer as large as the working set
// and (decode) the paged read of the same pages alternate in rounds, and
// each ratio is the median of per-round ratios: on a shared machine the
// bandwidth left to us drifts by up to 2x within seconds, so figures
// measured minutes apart do not compare. Cache-resident runs give each of
// the three an untimed pass first in every round, so that each is timed on
// data the others have not just evicted (timed cold, a 16 MiB stream read
// ~65 GB/s on the Zen 5 VM against ~220 warm). Runs of several subjects
// time each in every round, in alternating order, with more, shorter rounds.
template <CacheElement T>
AttentionMeasurements run_attention(const AttentionArgs& a, AttentionSetup& s, ThreadPool& pool,
                                    std::mt19937& rng) {
  const std::uint32_t rows = s.decode ? a.batch : a.batch * a.context;
  const auto q = random_floats(std::size_t{rows} * a.q_heads * a.head_dim, rng);
  std::vector<float> out(q.size());
  const auto ro = offsets(a.batch, s.decode ? 1 : a.context);
  auto call_on = [&](Subject& subject, std::size_t i) {
    with_layer<T>(s.caches[subject.cache].c.batches[i % s.sets], [&](const auto& k, const auto& v) {
      attention(k, v, std::span(q), a.q_heads, std::span<const std::uint32_t>(ro), std::span(out),
                subject.options, &pool);
    });
  };
  const bool several = s.subjects.size() > 1;
  const std::size_t repeats =
      a.repeats != 0
          ? a.repeats
          : (s.decode ? std::max<std::size_t>(several ? 45 : 15, (several ? 6 : 3) * s.sets) : 3);
  const bool warm = a.resident == "cache";
  AttentionMeasurements m;
  m.rounds = std::min<std::size_t>(repeats, several ? 3 * kBenchRounds : kBenchRounds);
  const std::size_t per_round = (repeats + m.rounds - 1) / m.rounds;
  const std::size_t stream_bytes = s.set_bytes * s.sets;  // sets >= 1
  Buffer stream_buf(stream_bytes, s.huge);
  float sink = kernels::stream_read(stream_buf.p, stream_bytes, &pool);  // warm-up
  const std::vector<std::uint32_t> tokens(a.batch, a.context);
  const Subject& main = s.subjects[0];
  auto read_pages = [&](std::size_t i) {
    with_layer<T>(s.caches[main.cache].c.batches[i % s.sets], [&](const auto& k, const auto& v) {
      sink += kernels::paged_read(k.desc(), v.desc(), tokens, &pool);
    });
  };
  for (Subject& subject : s.subjects) {  // warm-up
    time_calls(std::min<std::size_t>(s.sets, 50), [&](std::size_t i) { call_on(subject, i); });
  }
  const double bytes = static_cast<double>(s.set_bytes);
  m.over_first.resize(s.subjects.size());
  for (std::size_t r = 0; r < m.rounds; ++r) {
    std::vector<double> round_median(s.subjects.size());
    for (std::size_t k = 0; k < s.subjects.size(); ++k) {
      const std::size_t which = r % 2 == 0 ? k : s.subjects.size() - 1 - k;
      Subject& subject = s.subjects[which];
      if (warm) call_on(subject, r * per_round);
      const auto t =
          time_calls(per_round, [&](std::size_t i) { call_on(subject, r * per_round + i); });
      subject.times.insert(subject.times.end(), t.begin(), t.end());
      round_median[which] = median(t);
    }
    for (std::size_t k = 1; k < s.subjects.size(); ++k)
      m.over_first[k].push_back(round_median[0] / round_median[k]);
    const double kernel_rate = bytes / round_median[0] / 1e9;
    if (warm) sink += kernels::stream_read(stream_buf.p, stream_bytes, &pool);
    const double t0 = bench::now_s();
    sink += kernels::stream_read(stream_buf.p, stream_bytes, &pool);
    m.stream_rates.push_back(static_cast<double>(stream_bytes) / (bench::now_s() - t0) / 1e9);
    m.stream_fractions.push_back(kernel_rate / m.stream_rates.back());
    if (s.decode) {
      if (warm) read_pages(0);
      const auto rt = time_calls(s.sets, read_pages);
      m.read_rates.push_back(bytes * static_cast<double>(s.sets) /
                             std::accumulate(rt.begin(), rt.end(), 0.0) / 1e9);
      m.read_fractions.push_back(kernel_rate / m.read_rates.back());
    }
  }
  if (sink == 12345.0f) std::cerr << "";  // keep the sums alive
  return m;
}

double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// --strategy both: the continuous cache's figures, timed in the same rounds.
// paged_over_continuous: the paged cache's rate over the continuous one's,
// the median of per-round ratios (>= 0.95 is the goal of being within 5 %).
void report_pair(const AttentionSetup& s, const AttentionMeasurements& m, double bytes,
                 nlohmann::json& j) {
  const Subject& cont = s.subjects[1];
  std::vector<double> pair_ratios;  // over_first[1] is continuous over paged
  for (double r : m.over_first[1]) pair_ratios.push_back(1.0 / r);
  j["continuous_check_max_abs_err"] = cont.check_err;
  j["continuous_check_ok"] = cont.check_err < s.check_bound;
  j["continuous_median_s"] = median(cont.times);
  j["continuous_gbps"] = bytes / median(cont.times) / 1e9;
  j["paged_over_continuous"] = median(pair_ratios);
  j["paged_over_continuous_min"] = min_of(pair_ratios);
  j["paged_over_continuous_max"] = max_of(pair_ratios);
}

// --prefetch all: every strategy on the same cache in the same rounds: its
// rate, and over_auto, the median of its per-round rate over `auto`'s (with
// the range). best_prefetch: the highest over_auto (`auto` itself counts 1)
// among the strategies `auto` does not resolve to (that one is `auto` timed
// twice, and differs from it only by noise).
void report_sweep(const AttentionSetup& s, const AttentionMeasurements& m, double bytes,
                  nlohmann::json& j) {
  nlohmann::json rows = nlohmann::json::array();
  std::string best = s.subjects[0].label;
  double best_ratio = 1.0;
  const AttentionPrefetch automatic =
      resolve_attention_prefetch(AttentionPrefetch::automatic, s.p.page_layout);
  for (std::size_t k = 0; k < s.subjects.size(); ++k) {
    const Subject& subject = s.subjects[k];
    const AttentionPrefetch resolved =
        resolve_attention_prefetch(subject.options.prefetch, s.p.page_layout);
    nlohmann::json row{{"prefetch", subject.label},
                       {"resolved", std::string(prefetch_name(resolved))},
                       {"gbps", bytes / median(subject.times) / 1e9},
                       {"check_ok", subject.check_err < s.check_bound}};
    if (k > 0) {
      const double r = median(m.over_first[k]);
      row["over_auto"] = r;
      row["over_auto_min"] = min_of(m.over_first[k]);
      row["over_auto_max"] = max_of(m.over_first[k]);
      if (resolved != automatic && r > best_ratio) {
        best_ratio = r;
        best = subject.label;
      }
    }
    rows.push_back(row);
  }
  j["prefetch_sweep"] = rows;
  j["best_prefetch"] = best;
  j["check_ok"] = std::all_of(s.subjects.begin(), s.subjects.end(),
                              [&](const Subject& x) { return x.check_err < s.check_bound; });
}

// The roofline (DESIGN.md §6): a call takes at least max(bytes / stream,
// flops / FMA peak). Each (query head, token) pair costs 2 * head_dim FMAs
// (q.k, then p * v), so GQA g does g times MHA's arithmetic on the same
// bytes; from the caches that, not the stream, can be the floor. Prefill:
// GFLOP/s against the FMA peak.
void report_compute(const AttentionArgs& a, const AttentionSetup& s, const AttentionMeasurements& m,
                    double bytes, double med, ThreadPool& pool, nlohmann::json& j) {
  const double peak = fma_peak_gflops(pool);
  if (s.decode) {
    // The same pages read without arithmetic, in page-table order: the
    // ceiling the page size and order leave (same sets rotated, same threads).
    j["paged_read_gbps"] = median(m.read_rates);
    j["fraction_of_paged_read"] = median(m.read_fractions);
    const double flops = 4.0 * a.head_dim * a.q_heads * double(a.context) * a.batch;
    const double compute_gbps = peak * 1e9 * bytes / flops / 1e9;
    const double stream = median(m.stream_rates);
    const double roof = std::min(stream, compute_gbps);
    j["gflops"] = flops / med / 1e9;
    j["peak_gflops"] = peak;
    j["roofline_gbps"] = roof;
    j["roofline_bound"] = compute_gbps < stream ? "compute" : "memory";
    j["fraction_of_roofline"] = bytes / med / 1e9 / roof;
    return;
  }
  const double pairs = double(a.context) * (a.context + 1) / 2.0 * a.batch;
  const double flops = 4.0 * a.head_dim * a.q_heads * pairs;
  j["flops"] = flops;
  j["gflops"] = flops / med / 1e9;
  j["peak_gflops"] = peak;
  j["fraction_of_peak"] = flops / med / 1e9 / peak;
}

nlohmann::json report_attention(const AttentionArgs& a, const AttentionSetup& s,
                                const AttentionMeasurements& m, ThreadPool& pool) {
  const Subject& main = s.subjects[0];
  const std::vector<double>& times = main.times;
  const double med = median(times);
  const double bytes = static_cast<double>(s.set_bytes);
  const AttentionPrefetch resolved =
      resolve_attention_prefetch(s.options.prefetch, s.p.page_layout);
  nlohmann::json j{
      {"bench", "attention"},
      {"dtype", a.dtype},
      {"head_dim", a.head_dim},
      {"kv_heads", a.kv_heads},
      {"q_heads", a.q_heads},
      {"context", a.context},
      {"batch", a.batch},
      {"page_size", s.p.cache_strategy == CacheStrategy::paged ? a.page_size : a.context},
      {"page_order", a.page_order},
      {"strategy", a.strategy},
      {"layout", a.layout},
      {"arrangement", a.arrangement},
      {"threads", a.threads},
      {"mode", a.mode},
      {"resident", a.resident},
      {"prefetch", std::string(prefetch_name(resolved))},
      {"prefetch_requested", a.prefetch},
      {"precision", a.precision},
      {"huge_pages", a.huge_pages},
      {"isa", active_isa()},
      {"anon_huge_kb", anon_huge_kb()},
      {"sets", s.sets},
      {"working_set_bytes", s.set_bytes * s.sets},
      {"repeats", times.size()},
      {"rounds", m.rounds},
      {"check_max_abs_err", main.check_err},
      {"check_ok", main.check_err < s.check_bound},
      {"median_s", med},
      {"min_s", min_of(times)},
      {"bytes_kv", bytes},
      {"gbps", bytes / med / 1e9},
      // Query tokens a second through one layer (decode: one per sequence).
      {"tokens_per_s", double(a.batch) * (a.mode == "decode" ? 1 : a.context) / med},
      {"stream_gbps", median(m.stream_rates)},
      {"fraction_of_stream", median(m.stream_fractions)},
      {"fraction_of_stream_min", min_of(m.stream_fractions)},
      {"fraction_of_stream_max", max_of(m.stream_fractions)}};
  if (s.paired) report_pair(s, m, bytes, j);
  if (s.sweep) report_sweep(s, m, bytes, j);
  report_compute(a, s, m, bytes, med, pool, j);
  return j;
}

}  // namespace

template <CacheElement T>
nlohmann::json bench_attention(const AttentionArgs& a) {
  ThreadPool pool(a.threads == 0 ? 1 : a.threads);  // 0 is refused by setup
  std::mt19937 rng(2024);
  AttentionSetup s = setup_attention<T>(a, pool, rng);
  const AttentionMeasurements m = run_attention<T>(a, s, pool, rng);
  return report_attention(a, s, m, pool);
}

template nlohmann::json bench_attention<float>(const AttentionArgs&);
template nlohmann::json bench_attention<Half>(const AttentionArgs&);
template nlohmann::json bench_attention<BFloat16>(const AttentionArgs&);
template nlohmann::json bench_attention<Fp8E4M3>(const AttentionArgs&);
template nlohmann::json bench_attention<Fp8E5M2>(const AttentionArgs&);
template nlohmann::json bench_attention<Int8>(const AttentionArgs&);

}  // namespace kvcache::tools
