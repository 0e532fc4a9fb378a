// tools/bench_manager.cpp — `kvcache bench-manager`: bookkeeping cost of the
// paged manager. Reports ns per decoding sequence per step of fetch + step at
// batch 1..1024 (with and without prefix caching, which adds token ids and
// page hashing), and ns per request of claim + match_prefix + release.
// Tiny model shape: only bookkeeping is timed, no K/V is written. With
// --tiers LIST it runs the tier comparison of tools/bench_manager.h instead
// (--requests in [1, 10^6], --repeats in [1, 1000]).
// Flags are range-checked (exit 2 naming the value and the limit): --page-size
// and --steps in [1, 2^20], --prompt in [0, 2^20] (CLI11), and the pool of the
// largest batch, 1024 sequences of prompt + steps + 1 tokens rounded up to
// whole pages, at most kMaxBenchPoolTokens tokens (check_pool), so every
// length and page count below fits 32 bits and the run fits in memory.

#include "bench_manager.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "commands.h"
#include "kvcache/error.h"
#include "kvcache/paged_manager.h"
#include "table.h"

namespace kvcache::tools {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kMaxBenchTokens = 1u << 20;      // --page-size, --steps, --prompt
constexpr std::uint32_t kMaxBatch = 1024;                // the largest batch timed
constexpr std::uint64_t kMaxBenchPoolTokens = 1u << 26;  // 512 MiB of f32 K/V, 256 MiB of ids

struct BenchArgs {
  std::uint32_t page_size = 16;
  std::uint32_t steps = 256;
  std::uint32_t prompt = 512;
  bool json = false;
  // --tiers: the tier comparison instead of the tables.
  std::vector<std::string> tiers;
  std::uint32_t requests = 200;
  std::uint32_t repeats = 7;
  std::string disk_dir;
  std::string admission = "every_page";
  std::uint32_t batch = 1;
};

KVCacheParams bench_params(std::uint32_t page_size, bool caching) {
  return KVCacheParams{.dtype = DType::f32,
                       .num_layers = 1,
                       .n_kv_heads = 1,
                       .head_dim = 1,
                       .cache_strategy = CacheStrategy::paged,
                       .page_size = page_size,
                       .enable_prefix_caching = caching};
}

// ns per sequence per decode step (fetch one token + step) at this batch.
double decode_cost(const BenchArgs& a, std::uint32_t batch, bool caching) {
  const std::uint32_t len = a.prompt + a.steps + 1;
  const std::uint32_t pages = batch * ((len + a.page_size - 1) / a.page_size) + 1;
  PagedKVCacheManager m(bench_params(a.page_size, caching), pages, batch, len);
  const std::vector<SeqId> seqs = m.claim(batch);
  std::vector<std::uint32_t> prompt(batch, a.prompt), ones(batch, 1);
  std::vector<std::uint32_t> prompt_tokens(std::size_t{batch} * a.prompt);
  std::iota(prompt_tokens.begin(), prompt_tokens.end(), 1u);
  KVCacheBatch out;
  m.fetch_into(out, seqs, prompt);
  m.step(seqs, prompt, prompt_tokens);
  std::vector<std::uint32_t> tokens(batch, 7);
  const auto t0 = Clock::now();
  for (std::uint32_t s = 0; s < a.steps; ++s) {
    m.fetch_into(out, seqs, ones);
    if (caching) {
      tokens[0] = s;  // distinct content per step
      m.step(seqs, ones, tokens);
    } else {
      m.step(seqs, ones);
    }
  }
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  return ns / (double(a.steps) * batch);
}

// ns per request of claim + match_prefix (prompt fully cached) + release.
double match_cost(const BenchArgs& a, std::uint32_t prompt_len) {
  const std::uint32_t pages = (prompt_len + a.page_size - 1) / a.page_size + 4;
  PagedKVCacheManager m(bench_params(a.page_size, true), pages, 4, prompt_len + 1);
  std::vector<std::uint32_t> prompt(prompt_len);
  std::iota(prompt.begin(), prompt.end(), 3u);
  const SeqId s = m.claim(1)[0];
  m.fetch(std::span(&s, 1), std::span(&prompt_len, 1));
  m.step(std::span(&s, 1), std::span(&prompt_len, 1), prompt);
  m.release(s);
  const int reps = 2000;
  const auto t0 = Clock::now();
  for (int r = 0; r < reps; ++r) {
    const SeqId q = m.claim(1)[0];
    m.match_prefix(q, prompt);
    m.release(q);
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / reps;
}

// Refuses flags whose largest pool (kMaxBatch sequences) would exceed
// kMaxBenchPoolTokens, naming the flags and the limit.
void check_pool(const BenchArgs& a) {
  const std::uint64_t len = std::uint64_t{a.prompt} + a.steps + 1;
  const std::uint64_t pages = (len + a.page_size - 1) / a.page_size;
  const std::uint64_t tokens = kMaxBatch * pages * a.page_size;
  if (tokens > kMaxBenchPoolTokens) {
    throw InvalidArgument(
        "--prompt " + std::to_string(a.prompt) + " + --steps " + std::to_string(a.steps) +
        " at --page-size " + std::to_string(a.page_size) + " needs a pool of " +
        std::to_string(tokens) + " tokens for " + std::to_string(kMaxBatch) +
        " sequences, more than the limit of " + std::to_string(kMaxBenchPoolTokens));
  }
}

void run_tiers(const BenchArgs& a) {
  ManagerTierBenchArgs t;
  t.page_size = a.page_size;
  t.prompt = a.prompt;
  t.steps = a.steps;
  t.requests = a.requests;
  t.repeats = a.repeats;
  t.configs = a.tiers;
  t.disk_dir = a.disk_dir;
  t.admit_reused = a.admission == "reused";
  t.batch = a.batch;
  t.json = a.json;
  run_manager_tier_bench(t);
}

void run_bench(const BenchArgs& a) {
  check_pool(a);
  if (!a.tiers.empty()) return run_tiers(a);
  nlohmann::json j;
  Table t({"batch", "ns/seq/step", "ns/seq/step (prefix caching)"});
  char b1[32], b2[32];
  for (std::uint32_t batch : {1u, 4u, 16u, 64u, 256u, kMaxBatch}) {
    const double plain = decode_cost(a, batch, false), cached = decode_cost(a, batch, true);
    std::snprintf(b1, sizeof b1, "%.1f", plain);
    std::snprintf(b2, sizeof b2, "%.1f", cached);
    t.add_row({std::to_string(batch), b1, b2});
    j["decode"].push_back(
        {{"batch", batch}, {"ns_per_seq_step", plain}, {"ns_per_seq_step_prefix_caching", cached}});
  }
  Table t2({"prompt tokens", "ns/request (claim+match_prefix+release)"});
  for (std::uint32_t len : {512u, 4096u, 32768u}) {
    const double ns = match_cost(a, len);
    std::snprintf(b1, sizeof b1, "%.0f", ns);
    t2.add_row({std::to_string(len), b1});
    j["match"].push_back({{"prompt_tokens", len}, {"ns_per_request", ns}});
  }
  if (a.json) {
    std::cout << j.dump(2) << '\n';
    return;
  }
  std::printf("paged manager bookkeeping, page size %u, %u decode steps after a %u-token prompt\n",
              a.page_size, a.steps, a.prompt);
  t.print(std::cout);
  std::printf("\n");
  t2.print(std::cout);
}

}  // namespace

void add_bench_manager_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench-manager",
      "Time the paged manager's bookkeeping (fetch + step, match_prefix + release)");
  cmd->add_option("--page-size", args->page_size, "Tokens per page")
      ->capture_default_str()
      ->check(CLI::Range(1u, kMaxBenchTokens));
  cmd->add_option("--steps", args->steps,
                  "Decode steps timed per batch size (with --tiers: per request)")
      ->capture_default_str()
      ->check(CLI::Range(1u, kMaxBenchTokens));
  cmd->add_option("--prompt", args->prompt, "Prompt tokens before decoding")
      ->capture_default_str()
      ->check(CLI::Range(0u, kMaxBenchTokens));
  cmd->add_flag("--json", args->json, "Print a JSON object");
  cmd->add_option("--tiers", args->tiers,
                  "Instead of the tables: cost per request with tiers holding nothing asked "
                  "for, configurations none, null (a tier holding nothing, finishing stores at "
                  "once), host, host+disk (comma-separated, one run)")
      ->delimiter(',')
      ->check(CLI::IsMember({"none", "null", "host", "host+disk"}));
  cmd->add_option("--requests", args->requests, "With --tiers: requests timed per round")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000000u));
  cmd->add_option("--repeats", args->repeats, "With --tiers: rounds, configurations interleaved")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u));
  cmd->add_option("--admission", args->admission,
                  "With --tiers: which evicted pages are written back (reused: none here)")
      ->capture_default_str()
      ->check(CLI::IsMember({"every_page", "reused"}));
  cmd->add_option("--batch", args->batch, "With --tiers: requests served together")
      ->capture_default_str()
      ->check(CLI::Range(1u, kMaxBatch));
  cmd->add_option("--disk-dir", args->disk_dir,
                  "With --tiers host+disk: the disk tier's directory (default: a temporary one)");
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace kvcache::tools
