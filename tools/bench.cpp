// tools/bench.cpp — `kvcache bench attention|store`: the fast kernels timed
// against the machine's own limits, measured in the same run with the same
// threads (DESIGN.md §6).
//
// attention: builds the cache through the public API (paged manager with a
// shuffled free list: one-page sequences released in random order before the
// benchmark's sequences claim their pages; or a continuous manager), fills it
// with random K/V via store_kv, checks the fast kernel against
// attention_reference on a small sample of the same shape, then times
// attention (warm-up, median of repeats). DRAM-resident runs rotate over
// enough sequence sets that the working set is >= 1 GiB. Reports GB/s of
// unique K+V bytes against streaming read bandwidth over a buffer as large as
// the working set, measured in rounds alternating with the kernel calls
// (ratios are medians of per-round ratios); prefill also reports GFLOP/s
// against fp32 FMA peak. --strategy both builds a paged and a continuous
// cache holding the same K/V values and times them in alternation
// (paged_over_continuous). --prefetch all times every AttentionPrefetch
// strategy on the same cache in alternation, `auto` first, and names the
// fastest (prefetch_sweep, best_prefetch): the measurement that picks what
// `automatic` should resolve to on a processor nobody has measured yet.
// store: times store_kv (optionally with fused RoPE, its cos/sin computed per
// token or read from a RopeTable) against memcpy moving
// the same number of bytes.
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "commands.h"
#include "kvcache/kernels/attention.h"
#include "kvcache/kernels/bandwidth.h"
#include "kvcache/kernels/isa.h"
#include "kvcache/kernels/reference.h"
#include "kvcache/kernels/rope.h"
#include "kvcache/kernels/rope_table.h"
#include "kvcache/kvcache.h"

namespace kvcache::tools {
namespace {

constexpr std::size_t kGiB = std::size_t{1} << 30;

struct Common {
  std::string dtype = "bf16";
  std::uint32_t head_dim = 128;
  std::uint32_t kv_heads = 8;
  std::uint32_t batch = 1;
  std::uint32_t page_size = 16;
  std::string page_order = "shuffled";
  std::size_t threads = 2;
  std::string strategy = "paged";
  std::string layout = "nhd";
  std::string arrangement = "interleaved";
  std::string huge_pages = "on";
  std::string isa = "auto";   // instruction set of the fast kernels (select_isa)
  std::uint32_t repeats = 0;  // 0: automatic
  bool json = false;
};

struct AttentionArgs : Common {
  std::uint32_t q_heads = 32;
  std::uint32_t context = 4096;
  std::string mode = "decode";
  std::string resident = "dram";
  std::string prefetch = "auto";
  std::string precision = "fp32";
};

struct StoreArgs : Common {
  std::string prefetch = "auto";
  std::uint32_t tokens = 4096;
  bool rope = false;
  bool rope_table = false;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

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

std::size_t anon_huge_kb() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string key;
  std::size_t value = 0;
  while (in >> key) {
    if (key == "AnonHugePages:") {
      in >> value;
      return value;
    }
  }
  return 0;
}

bool huge_on(const Common& a) {
  if (a.huge_pages != "on" && a.huge_pages != "off") {
    throw InvalidArgument("--huge-pages must be on or off, got '" + a.huge_pages + "'");
  }
  return a.huge_pages == "on";
}

// An mmap'ed buffer with the same huge-page advice as the cache.
struct Buffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  Buffer(std::size_t n, bool huge) : bytes(n) {
    p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw OutOfMemory("bench could not map " + std::to_string(n) + " bytes");
    madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    auto* f = static_cast<float*>(p);
    for (std::size_t i = 0; i < n / sizeof(float); ++i) f[i] = static_cast<float>(i & 1023) * 1e-3f;
  }
  ~Buffer() { munmap(p, bytes); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// Rounds of kernel / stream / paged-read measurements in bench attention.
constexpr std::size_t kBenchRounds = 5;
// Limits of the bench's sizes (each a cache the bench allocates and fills).
constexpr std::uint32_t kMaxBenchBatch = 65536;
constexpr std::uint32_t kMaxBenchTokens = 1u << 24;
constexpr std::uint64_t kMaxBenchSetBytes = std::uint64_t{1} << 38;  // 256 GiB

double fma_peak_gflops(ThreadPool& pool) {
  float sink = 0.0f;
  kernels::fma_peak(1000000, &pool, &sink);
  std::uint64_t flops = 0;
  const auto t =
      time_calls(5, [&](std::size_t) { flops = kernels::fma_peak(20000000, &pool, &sink); });
  return flops / median(t) / 1e9;
}

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

KVCacheParams make_params(const Common& a) {
  KVCacheParams p;
  p.dtype = parse_dtype(a.dtype);
  p.num_layers = 1;
  p.n_kv_heads = a.kv_heads;
  p.head_dim = a.head_dim;
  p.cache_strategy = parse_strategy(a.strategy);
  p.page_layout = parse_layout(a.layout);
  p.pool_arrangement = parse_arrangement(a.arrangement);
  p.page_size = p.cache_strategy == CacheStrategy::paged ? a.page_size : 0;
  p.validate();
  if (a.page_order != "shuffled" && a.page_order != "sequential") {
    throw InvalidArgument("--page-order must be shuffled or sequential, got '" + a.page_order +
                          "'");
  }
  if (a.threads == 0) throw InvalidArgument("--threads must be at least 1");
  if (a.batch == 0) throw InvalidArgument("--batch must be at least 1");
  if (a.batch > kMaxBenchBatch) {
    throw InvalidArgument("--batch " + std::to_string(a.batch) + " is past the limit of " +
                          std::to_string(kMaxBenchBatch));
  }
  return p;
}

// Tokens per sequence (`what`: --context or --tokens) within kMaxBenchTokens,
// and one set of the batch's caches within kMaxBenchSetBytes.
void check_bench_tokens(const Common& a, const KVCacheParams& p, const char* what,
                        std::uint32_t tokens) {
  if (tokens > kMaxBenchTokens) {
    throw InvalidArgument(std::string(what) + " " + std::to_string(tokens) +
                          " is past the limit of " + std::to_string(kMaxBenchTokens));
  }
  const unsigned __int128 bytes =
      static_cast<unsigned __int128>(a.batch) * tokens * p.bytes_per_token();
  if (bytes > kMaxBenchSetBytes) {
    throw InvalidArgument("--batch " + std::to_string(a.batch) + " x " + what + " " +
                          std::to_string(tokens) + " x " + std::to_string(p.bytes_per_token()) +
                          " bytes a token is past the limit of " +
                          std::to_string(kMaxBenchSetBytes) + " bytes");
  }
}

// `sets` sequence sets of `batch` sequences, each with `tokens` tokens of room,
// in a manager built through the public API.
struct BenchCache {
  std::unique_ptr<KVCacheManager> manager;
  std::vector<std::vector<SeqId>> sets;
  std::vector<KVCacheBatch> batches;  // the fetched step of each set
  std::size_t bytes = 0;              // the manager's cache memory
};

BenchCache make_cache(const Common& a, const KVCacheParams& p, std::uint32_t sets,
                      std::uint32_t tokens, std::mt19937& rng) {
  BenchCache c;
  const std::uint32_t seqs = sets * a.batch;
  if (p.cache_strategy == CacheStrategy::paged) {
    const std::uint32_t per_seq = (tokens + a.page_size - 1) / a.page_size;
    const std::uint32_t pages = per_seq * seqs + 1;
    const bool shuffled = a.page_order == "shuffled";
    c.manager = std::make_unique<PagedKVCacheManager>(
        p, pages, shuffled ? std::max(pages, seqs) : seqs, per_seq * a.page_size);
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
  for (std::uint32_t s = 0; s < sets; ++s) c.sets.push_back(c.manager->claim(a.batch));
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

std::vector<std::uint32_t> offsets(std::uint32_t batch, std::uint32_t each) {
  std::vector<std::uint32_t> o(batch + 1);
  for (std::uint32_t b = 0; b <= batch; ++b) o[b] = b * each;
  return o;
}

// Fills history (committed with step) then fetches `new_tokens` per sequence
// and stores them; keeps that batch for the timed kernel.
template <CacheElement T>
void fill(BenchCache& c, const KVCacheParams& p, std::uint32_t history, std::uint32_t new_tokens,
          bool huge, ThreadPool& pool, std::mt19937& rng) {
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
               std::span<const std::uint32_t>(ro), {}, &pool);
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

// Fast vs reference attention on a small cache of the same shape.
template <CacheElement T>
double check_attention(const AttentionArgs& a, const KVCacheParams& p, bool decode,
                       const AttentionOptions& options, ThreadPool& pool, std::mt19937& rng) {
  AttentionArgs small = a;
  small.batch = 1;
  const std::uint32_t ctx = std::min<std::uint32_t>(a.context, decode ? 3000 : 200);
  BenchCache c = make_cache(small, p, 1, ctx, rng);
  fill<T>(c, p, decode ? ctx - 1 : 0, decode ? 1 : ctx, true, pool, rng);
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

// A cache a bench attention run builds: the one of --strategy, or with
// --strategy both a paged cache and a continuous one holding the same K/V
// values.
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

// The strategies --prefetch all times, `automatic` first (the main figures).
constexpr std::array kSweptPrefetches{AttentionPrefetch::automatic, AttentionPrefetch::next_step_l1,
                                      AttentionPrefetch::next_tile_l1,
                                      AttentionPrefetch::next_tile_l2, AttentionPrefetch::none};

template <CacheElement T>
nlohmann::json bench_attention(const AttentionArgs& a) {
  if (a.strategy != "paged" && a.strategy != "continuous" && a.strategy != "both") {
    throw InvalidArgument("--strategy must be paged, continuous or both, got '" + a.strategy + "'");
  }
  const bool paired = a.strategy == "both";
  const bool sweep = a.prefetch == "all";
  if (paired && sweep) {
    throw InvalidArgument(
        "--prefetch all times one cache: it needs --strategy paged or "
        "continuous, got both");
  }
  std::vector<std::string> strategies =
      paired ? std::vector<std::string>{"paged", "continuous"} : std::vector{a.strategy};
  AttentionArgs first = a;
  first.strategy = strategies[0];
  const KVCacheParams p = make_params(first);
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
  check_bench_tokens(a, p, "--context", a.context);
  const bool decode = a.mode == "decode";
  const bool huge = huge_on(a);
  const AttentionPrefetch prefetch =
      sweep ? AttentionPrefetch::automatic : parse_attention_prefetch(a.prefetch);
  const AttentionOptions options{.prefetch = prefetch,
                                 .precision = parse_attention_precision(a.precision)};
  ThreadPool pool(a.threads);
  std::mt19937 rng(2024);

  // AttentionPrecision::bf16 on a bf16 cache: the kernel and the reference
  // round probabilities against different maxima (kernels/reference.h), up
  // to 2^-8 of the largest |V| element (1 here).
  const bool bf16_inputs =
      options.precision == AttentionPrecision::bf16 && std::is_same_v<T, BFloat16>;
  const double check_bound = 1e-4 + (bf16_inputs ? 1.0 / 256 : 0.0);

  const std::size_t set_bytes = std::size_t{a.batch} * a.context * p.bytes_per_token();
  const std::uint32_t sets =
      a.resident == "dram" ? static_cast<std::uint32_t>((kGiB + set_bytes - 1) / set_bytes) : 1;
  std::vector<CacheUnderTest> caches;
  std::vector<Subject> subjects;
  caches.reserve(strategies.size());
  for (const std::string& strategy : strategies) {
    AttentionArgs sa = a;
    sa.strategy = strategy;
    CacheUnderTest& cut = caches.emplace_back();
    cut.p = make_params(sa);
    cut.c = make_cache(sa, cut.p, sets, a.context, rng);
    std::mt19937 values(4049);  // the same K/V values in every cache
    fill<T>(cut.c, cut.p, decode ? a.context - 1 : 0, decode ? 1 : a.context, huge, pool, values);
  }
  if (sweep) {  // every strategy on the one cache
    for (const AttentionPrefetch pf : kSweptPrefetches) {
      AttentionOptions o = options;
      o.prefetch = pf;
      subjects.push_back({std::string(prefetch_name(pf)), 0, o, 0, {}});
    }
  } else {  // one subject per cache
    for (std::size_t k = 0; k < caches.size(); ++k)
      subjects.push_back({strategies[k], k, options, 0, {}});
  }
  for (Subject& s : subjects) {
    AttentionArgs sa = a;
    sa.strategy = strategies[s.cache];
    s.check_err = check_attention<T>(sa, caches[s.cache].p, decode, s.options, pool, rng);
  }
  const std::uint32_t rows = decode ? a.batch : a.batch * a.context;
  const auto q = random_floats(std::size_t{rows} * a.q_heads * a.head_dim, rng);
  std::vector<float> out(q.size());
  const auto ro = offsets(a.batch, decode ? 1 : a.context);
  auto call_on = [&](Subject& s, std::size_t i) {
    with_layer<T>(caches[s.cache].c.batches[i % sets], [&](const auto& k, const auto& v) {
      attention(k, v, std::span(q), a.q_heads, std::span<const std::uint32_t>(ro), std::span(out),
                s.options, &pool);
    });
  };
  const bool several = subjects.size() > 1;
  const std::size_t repeats =
      a.repeats != 0
          ? a.repeats
          : (decode ? std::max<std::size_t>(several ? 45 : 15, (several ? 6 : 3) * sets) : 3);
  // Kernel calls, a streaming read of a buffer as large as the working set
  // and (decode) the paged read of the same pages alternate in rounds, and
  // each ratio is the median of per-round ratios: on a shared machine the
  // bandwidth left to us drifts by up to 2x within seconds, so figures
  // measured minutes apart do not compare. Cache-resident runs give each of
  // the three an untimed pass first in every round, so that each is timed on
  // data the others have not just evicted (timed cold, a 16 MiB stream read
  // ~65 GB/s on the Zen 5 VM against ~220 warm). Runs of several subjects
  // time each in every round, in alternating order, with more, shorter rounds.
  const bool warm = a.resident == "cache";
  const std::size_t rounds =
      std::min<std::size_t>(repeats, several ? 3 * kBenchRounds : kBenchRounds);
  const std::size_t per_round = (repeats + rounds - 1) / rounds;
  const std::size_t stream_bytes = set_bytes * sets;  // sets >= 1
  Buffer stream_buf(stream_bytes, huge);
  float sink = kernels::stream_read(stream_buf.p, stream_bytes, &pool);  // warm-up
  const std::vector<std::uint32_t> tokens(a.batch, a.context);
  Subject& main = subjects[0];
  auto read_pages = [&](std::size_t i) {
    with_layer<T>(caches[main.cache].c.batches[i % sets], [&](const auto& k, const auto& v) {
      sink += kernels::paged_read(k.desc(), v.desc(), tokens, &pool);
    });
  };
  for (Subject& s : subjects) {  // warm-up
    time_calls(std::min<std::size_t>(sets, 50), [&](std::size_t i) { call_on(s, i); });
  }
  const double bytes = static_cast<double>(set_bytes);
  std::vector<double> stream_rates, read_rates, stream_fractions, read_fractions;
  // [k]: subject k's rate over subject 0's, one per round (from round medians).
  std::vector<std::vector<double>> over_first(subjects.size());
  for (std::size_t r = 0; r < rounds; ++r) {
    std::vector<double> round_median(subjects.size());
    for (std::size_t k = 0; k < subjects.size(); ++k) {
      const std::size_t which = r % 2 == 0 ? k : subjects.size() - 1 - k;
      Subject& s = subjects[which];
      if (warm) call_on(s, r * per_round);
      const auto t = time_calls(per_round, [&](std::size_t i) { call_on(s, r * per_round + i); });
      s.times.insert(s.times.end(), t.begin(), t.end());
      round_median[which] = median(t);
    }
    for (std::size_t k = 1; k < subjects.size(); ++k)
      over_first[k].push_back(round_median[0] / round_median[k]);
    const double kernel_rate = bytes / round_median[0] / 1e9;
    if (warm) sink += kernels::stream_read(stream_buf.p, stream_bytes, &pool);
    const double t0 = now_s();
    sink += kernels::stream_read(stream_buf.p, stream_bytes, &pool);
    stream_rates.push_back(static_cast<double>(stream_bytes) / (now_s() - t0) / 1e9);
    stream_fractions.push_back(kernel_rate / stream_rates.back());
    if (decode) {
      if (warm) read_pages(0);
      const auto rt = time_calls(sets, read_pages);
      read_rates.push_back(bytes * static_cast<double>(sets) /
                           std::accumulate(rt.begin(), rt.end(), 0.0) / 1e9);
      read_fractions.push_back(kernel_rate / read_rates.back());
    }
  }
  if (sink == 12345.0f) std::cerr << "";  // keep the sums alive
  const std::vector<double>& times = main.times;
  const double med = median(times);
  nlohmann::json j{
      {"bench", "attention"},
      {"dtype", a.dtype},
      {"head_dim", a.head_dim},
      {"kv_heads", a.kv_heads},
      {"q_heads", a.q_heads},
      {"context", a.context},
      {"batch", a.batch},
      {"page_size", p.cache_strategy == CacheStrategy::paged ? a.page_size : a.context},
      {"page_order", a.page_order},
      {"strategy", a.strategy},
      {"layout", a.layout},
      {"arrangement", a.arrangement},
      {"threads", a.threads},
      {"mode", a.mode},
      {"resident", a.resident},
      {"prefetch", std::string(prefetch_name(resolve_attention_prefetch(prefetch, p.page_layout)))},
      {"prefetch_requested", a.prefetch},
      {"precision", a.precision},
      {"huge_pages", a.huge_pages},
      {"isa", active_isa()},
      {"anon_huge_kb", anon_huge_kb()},
      {"sets", sets},
      {"working_set_bytes", set_bytes * sets},
      {"repeats", times.size()},
      {"rounds", rounds},
      {"check_max_abs_err", main.check_err},
      {"check_ok", main.check_err < check_bound},
      {"median_s", med},
      {"min_s", *std::min_element(times.begin(), times.end())},
      {"bytes_kv", bytes},
      {"gbps", bytes / med / 1e9},
      {"stream_gbps", median(stream_rates)},
      {"fraction_of_stream", median(stream_fractions)},
      {"fraction_of_stream_min",
       *std::min_element(stream_fractions.begin(), stream_fractions.end())},
      {"fraction_of_stream_max",
       *std::max_element(stream_fractions.begin(), stream_fractions.end())}};
  if (paired) {
    // The main figures above are the paged cache's; these are the continuous
    // cache's, timed in the same rounds. paged_over_continuous: the paged
    // cache's rate over the continuous one's, the median of per-round ratios
    // (>= 0.95 is the goal of being within 5 %).
    const Subject& cont = subjects[1];
    std::vector<double> pair_ratios;  // over_first[1] is continuous over paged
    for (double r : over_first[1]) pair_ratios.push_back(1.0 / r);
    j["continuous_check_max_abs_err"] = cont.check_err;
    j["continuous_check_ok"] = cont.check_err < check_bound;
    j["continuous_median_s"] = median(cont.times);
    j["continuous_gbps"] = bytes / median(cont.times) / 1e9;
    j["paged_over_continuous"] = median(pair_ratios);
    j["paged_over_continuous_min"] = *std::min_element(pair_ratios.begin(), pair_ratios.end());
    j["paged_over_continuous_max"] = *std::max_element(pair_ratios.begin(), pair_ratios.end());
  }
  if (sweep) {
    // Every strategy on the same cache in the same rounds: its rate, and
    // over_auto, the median of its per-round rate over `auto`'s (with the
    // range). best_prefetch: the highest over_auto (`auto` itself counts 1)
    // among the strategies `auto` does not resolve to (that one is `auto`
    // timed twice, and differs from it only by noise).
    nlohmann::json rows = nlohmann::json::array();
    std::string best = subjects[0].label;
    double best_ratio = 1.0;
    const AttentionPrefetch automatic =
        resolve_attention_prefetch(AttentionPrefetch::automatic, p.page_layout);
    for (std::size_t k = 0; k < subjects.size(); ++k) {
      const Subject& s = subjects[k];
      const AttentionPrefetch resolved =
          resolve_attention_prefetch(s.options.prefetch, p.page_layout);
      nlohmann::json row{{"prefetch", s.label},
                         {"resolved", std::string(prefetch_name(resolved))},
                         {"gbps", bytes / median(s.times) / 1e9},
                         {"check_ok", s.check_err < check_bound}};
      if (k > 0) {
        const double r = median(over_first[k]);
        row["over_auto"] = r;
        row["over_auto_min"] = *std::min_element(over_first[k].begin(), over_first[k].end());
        row["over_auto_max"] = *std::max_element(over_first[k].begin(), over_first[k].end());
        if (resolved != automatic && r > best_ratio) {
          best_ratio = r;
          best = s.label;
        }
      }
      rows.push_back(row);
    }
    j["prefetch_sweep"] = rows;
    j["best_prefetch"] = best;
    j["check_ok"] = std::all_of(subjects.begin(), subjects.end(),
                                [&](const Subject& s) { return s.check_err < check_bound; });
  }
  if (decode) {
    // The same pages read without arithmetic, in page-table order: the
    // ceiling the page size and order leave (same sets rotated, same threads).
    j["paged_read_gbps"] = median(read_rates);
    j["fraction_of_paged_read"] = median(read_fractions);
    // The roofline (DESIGN.md §6): a call takes at least max(bytes / stream,
    // flops / FMA peak). Each (query head, token) pair costs 2 * head_dim
    // FMAs (q.k, then p * v), so GQA g does g times MHA's arithmetic on the
    // same bytes; from the caches that, not the stream, can be the floor.
    const double flops = 4.0 * a.head_dim * a.q_heads * double(a.context) * a.batch;
    const double peak = fma_peak_gflops(pool);
    const double compute_gbps = peak * 1e9 * bytes / flops / 1e9;
    const double stream = median(stream_rates);
    const double roof = std::min(stream, compute_gbps);
    j["gflops"] = flops / med / 1e9;
    j["peak_gflops"] = peak;
    j["roofline_gbps"] = roof;
    j["roofline_bound"] = compute_gbps < stream ? "compute" : "memory";
    j["fraction_of_roofline"] = bytes / med / 1e9 / roof;
  }
  if (!decode) {
    const double pairs = double(a.context) * (a.context + 1) / 2.0 * a.batch;
    const double flops = 4.0 * a.head_dim * a.q_heads * pairs;
    const double peak = fma_peak_gflops(pool);
    j["flops"] = flops;
    j["gflops"] = flops / med / 1e9;
    j["peak_gflops"] = peak;
    j["fraction_of_peak"] = flops / med / 1e9 / peak;
  }
  return j;
}

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
  BenchCache fast = make_cache(small, p, 1, tokens, rng);
  BenchCache ref = make_cache(small, p, 1, tokens, rng);
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

template <CacheElement T>
nlohmann::json bench_store(const StoreArgs& a) {
  const KVCacheParams p = make_params(a);
  if (a.tokens == 0) throw InvalidArgument("--tokens must be at least 1");
  check_bench_tokens(a, p, "--tokens", a.tokens);
  const bool huge = huge_on(a);
  ThreadPool pool(a.threads);
  std::mt19937 rng(7);
  BenchCache c = make_cache(a, p, 1, a.tokens, rng);
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
  const double bytes = 2.0 * n * (sizeof(float) + dtype_size(p.dtype));  // read f32 + write cache
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
          {"repeats", times.size()},
          {"rounds", rounds},
          {"memcpy_gbps", median(copy_rates)},
          {"fraction_of_memcpy", median(fractions)},
          {"fraction_of_memcpy_min", *std::min_element(fractions.begin(), fractions.end())},
          {"fraction_of_memcpy_max", *std::max_element(fractions.begin(), fractions.end())}};
}

void print(const nlohmann::json& j, bool json) {
  if (json) {
    std::cout << j.dump() << '\n';
    return;
  }
  for (const auto& [key, value] : j.items()) std::cout << key << ": " << value << '\n';
}

std::string isa_choices() {
  std::string out;
  for (const std::string& name : available_isas()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

void add_common(CLI::App* cmd, Common& a) {
  cmd->add_option("--dtype", a.dtype, "Cache element type: f32, f16, bf16")->capture_default_str();
  cmd->add_option("--head-dim", a.head_dim, "Head dimension")->capture_default_str();
  cmd->add_option("--kv-heads", a.kv_heads, "KV heads")->capture_default_str();
  cmd->add_option("--batch", a.batch, "Sequences per call")->capture_default_str();
  cmd->add_option("--page-size", a.page_size, "Tokens per page (paged)")->capture_default_str();
  cmd->add_option("--page-order", a.page_order, "shuffled | sequential")->capture_default_str();
  cmd->add_option("--threads", a.threads, "Threads (pool size, caller included)")
      ->capture_default_str();
  cmd->add_option("--strategy", a.strategy,
                  "paged | continuous (bench attention also: both, the two timed in alternation)")
      ->capture_default_str();
  cmd->add_option("--layout", a.layout, "Page layout: nhd | hnd (PageLayout)")
      ->capture_default_str();
  cmd->add_option("--arrangement", a.arrangement,
                  "Pool arrangement: interleaved | per_layer (PoolArrangement)")
      ->capture_default_str();
  cmd->add_option("--huge-pages", a.huge_pages,
                  "on | off: madvise 2 MiB pages for cache and buffers")
      ->capture_default_str();
  cmd->add_option("--isa", a.isa,
                  "Instruction set of the fast kernels: auto, or one of " + isa_choices())
      ->capture_default_str();
  cmd->add_option("--repeats", a.repeats, "Timed calls (0: automatic)")->capture_default_str();
  cmd->add_flag("--json", a.json, "Print one JSON object");
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Time the CPU kernels against memory bandwidth");
  bench->require_subcommand(1);

  auto attn = std::make_shared<AttentionArgs>();
  CLI::App* a =
      bench->add_subcommand("attention", "Decode / prefill attention vs stream bandwidth");
  add_common(a, *attn);
  a->add_option("--q-heads", attn->q_heads, "Query heads")->capture_default_str();
  a->add_option("--context", attn->context, "Tokens per sequence (history + new)")
      ->capture_default_str();
  a->add_option("--mode", attn->mode, "decode | prefill")->capture_default_str();
  a->add_option("--resident", attn->resident, "dram (>= 1 GiB rotated) | cache")
      ->capture_default_str();
  a->add_option("--prefetch", attn->prefetch,
                "Decode prefetch: auto | step-l1 | tile-l1 | tile-l2 | none (AttentionPrefetch), "
                "or all: each timed in alternation on one cache, the fastest named")
      ->capture_default_str();
  a->add_option("--precision", attn->precision,
                "What q and the probabilities meet K/V as: fp32 | bf16 (AttentionPrecision; "
                "bf16 applies to bf16 caches)")
      ->capture_default_str();
  a->callback([attn] {
    select_isa(attn->isa);
    print(visit_dtype(parse_dtype(attn->dtype),
                      [&](auto tag) { return bench_attention<decltype(tag)>(*attn); }),
          attn->json);
  });

  auto store = std::make_shared<StoreArgs>();
  store->batch = 16;
  CLI::App* s = bench->add_subcommand("store", "store_kv vs memcpy bandwidth");
  add_common(s, *store);
  s->add_option("--tokens", store->tokens, "New tokens per sequence")->capture_default_str();
  CLI::Option* rope = s->add_flag("--rope", store->rope, "Fused RoPE on K");
  s->add_flag("--rope-table", store->rope_table,
              "With --rope: read cos/sin from a RopeTable built before timing")
      ->needs(rope);
  s->add_option("--prefetch", store->prefetch,
                "Input prefetch: auto | row-l1 | none (StorePrefetch)")
      ->capture_default_str();
  s->callback([store] {
    select_isa(store->isa);
    print(visit_dtype(parse_dtype(store->dtype),
                      [&](auto tag) { return bench_store<decltype(tag)>(*store); }),
          store->json);
  });
}

}  // namespace kvcache::tools
