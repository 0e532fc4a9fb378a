// tools/bench.cpp — `kvcache bench attention|store`: the command (flags,
// then the benchmark, then a table or --json) and the helpers both
// benchmarks share (bench.h). The benchmarks: bench_attention.cpp,
// bench_store.cpp; their caches: bench_harness.h; the table: bench_report.cpp.
#include "bench.h"

#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "bench_harness.h"
#include "commands.h"
#include "kvcache/kernels/bandwidth.h"
#include "kvcache/kernels/isa.h"

namespace kvcache::tools {

KVCacheParams bench_params(const Common& a) {
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

bool huge_pages_on(const Common& a) {
  if (a.huge_pages != "on" && a.huge_pages != "off") {
    throw InvalidArgument("--huge-pages must be on or off, got '" + a.huge_pages + "'");
  }
  return a.huge_pages == "on";
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

Buffer::Buffer(std::size_t n, bool huge) : bytes(n) {
  p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw OutOfMemory("bench could not map " + std::to_string(n) + " bytes");
  madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  auto* f = static_cast<float*>(p);
  for (std::size_t i = 0; i < n / sizeof(float); ++i) f[i] = static_cast<float>(i & 1023) * 1e-3f;
}

Buffer::~Buffer() { munmap(p, bytes); }

double fma_peak_gflops(ThreadPool& pool) {
  float sink = 0.0f;
  kernels::fma_peak(1000000, &pool, &sink);
  std::uint64_t flops = 0;
  const auto t =
      bench::time_calls(5, [&](std::size_t) { flops = kernels::fma_peak(20000000, &pool, &sink); });
  return flops / bench::median(t) / 1e9;
}

namespace {

void print(const nlohmann::json& j, bool json) {
  if (json) {
    std::cout << j.dump() << '\n';
    return;
  }
  print_bench_table(j, std::cout);
}

std::string isa_choices() {
  std::string out;
  for (const std::string& name : available_isas()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

void add_common(CLI::App* cmd, Common& a) {
  cmd->add_option("--dtype", a.dtype, "Cache element type: " + std::string(kDTypeNames))
      ->capture_default_str();
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
  cmd->add_flag("--json", a.json, "Print one JSON object (every figure) instead of the table");
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
    attn->dtype = std::string(dtype_name(parse_dtype(attn->dtype)));  // "half" -> "f16"
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
    store->dtype = std::string(dtype_name(parse_dtype(store->dtype)));
    print(visit_dtype(parse_dtype(store->dtype),
                      [&](auto tag) { return bench_store<decltype(tag)>(*store); }),
          store->json);
  });

  add_bench_tiers_command(bench);
}

}  // namespace kvcache::tools
