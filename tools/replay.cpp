// tools/replay.cpp — `kvcache replay`: replay a Mooncake-format JSONL trace
// against the paged manager's prefix cache and report hit rates. The trace
// and --capacity are read with every number checked
// (kvcache/engine/trace_file.h); the other flags are checked by replay_trace
// (kvcache/replay/trace_replay.h). Bad input: exit 2 with a message naming it.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "kvcache/engine/trace_file.h"
#include "kvcache/error.h"
#include "kvcache/replay/trace_replay.h"
#include "table.h"

namespace kvcache::tools {

namespace {

struct ReplayArgs {
  std::string trace;
  std::uint32_t page_size = 512;
  std::string capacity = "0";
  std::string policy = "lru";
  double small_fraction = 0.1;
  double ghost_factor = 16.0;
  bool sequential = false;
  double rate = 20.0;
  std::uint32_t max_batch = 1024;
  bool reuse_hints = false;
  std::uint32_t short_output = 32;
  bool json = false;
};

void print_progress(std::size_t done, std::size_t total) {
  if (done % 64 != 0 && done != total) return;
  const int width = 40;
  const int filled = static_cast<int>(width * done / std::max<std::size_t>(total, 1));
  std::fprintf(stderr, "\r  [%s%s] %zu/%zu", std::string(filled, '#').c_str(),
               std::string(width - filled, ' ').c_str(), done, total);
  if (done == total) std::fputc('\n', stderr);
}

nlohmann::json to_json(const ReplayArgs& a, const ReplayResult& r) {
  return {{"trace", a.trace},
          {"mode", a.sequential ? "sequential" : "timed"},
          {"policy", a.policy},
          {"reuse_hints", a.reuse_hints},
          {"short_output", a.short_output},
          {"page_size", a.page_size},
          {"capacity_pages", r.capacity_pages},
          {"requests", r.requests},
          {"rejected", r.rejected},
          {"block_hit_rate", r.block_hit_rate()},
          {"token_hit_rate", r.token_hit_rate()},
          {"blocks_total", r.blocks_total},
          {"blocks_hit", r.blocks_hit},
          {"evictions", r.evictions},
          {"peak_pages_used", r.peak_pages_used},
          {"manager_ns_per_request", r.ns_per_request()}};
}

void run_replay(const ReplayArgs& a) {
  ReplayOptions o;
  o.page_size = a.page_size;
  o.capacity_tokens = engine::parse_token_count(a.capacity);
  o.offline_belady = a.policy == "belady";
  if (!o.offline_belady) o.policy = parse_policy(a.policy);
  o.s3fifo_small_fraction = a.small_fraction;
  o.ghost_factor = a.ghost_factor;
  o.sequential = a.sequential;
  o.decode_tokens_per_s = a.rate;
  o.max_batch = a.max_batch;
  o.reuse_hints = a.reuse_hints;
  o.short_output = a.short_output;
  if (isatty(STDERR_FILENO)) o.progress = print_progress;
  const std::vector<TraceRequest> trace = engine::read_mooncake_trace(a.trace);
  const ReplayResult r = replay_trace(trace, o);
  if (a.json) {
    std::cout << to_json(a, r).dump(2) << '\n';
    return;
  }
  std::printf(
      "replay %s: %zu requests, %s mode, policy %s%s, page size %u, %s pages\n", a.trace.c_str(),
      trace.size(), a.sequential ? "sequential" : "timed", a.policy.c_str(),
      a.reuse_hints
          ? (" + reuse hints (output < " + std::to_string(a.short_output) + " tokens: likely)")
                .c_str()
          : "",
      a.page_size, with_commas(r.capacity_pages).c_str());
  Table t({"metric", "value"});
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", r.block_hit_rate());
  t.add_row({"block_hit_rate", buf});
  std::snprintf(buf, sizeof buf, "%.4f", r.token_hit_rate());
  t.add_row({"token_hit_rate", buf});
  t.add_row({"evictions", with_commas(r.evictions)});
  t.add_row({"peak pages in use", with_commas(r.peak_pages_used)});
  t.add_row({"rejected requests", with_commas(r.rejected)});
  std::snprintf(buf, sizeof buf, "%.0f", r.ns_per_request());
  t.add_row({"manager ns / request", buf});
  t.print(std::cout);
}

}  // namespace

void add_replay_command(CLI::App& app) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Replay a Mooncake JSONL trace against the prefix cache and report hit rates");
  cmd->add_option("--trace", args->trace,
                  "JSONL trace (timestamp, input_length, output_length, hash_ids)")
      ->required();
  cmd->add_option("--page-size", args->page_size, "Tokens per page")->capture_default_str();
  cmd->add_option("--capacity", args->capacity,
                  "Cache capacity in tokens (1M, 3000000, 1.5M, unlimited; at most 2^40)")
      ->capture_default_str();
  cmd->add_option("--policy", args->policy,
                  "Eviction policy: lru | s3fifo | tiered | interval | belady (offline optimum, "
                  "--sequential only)")
      ->capture_default_str();
  cmd->add_option("--small-fraction", args->small_fraction,
                  "s3fifo: share of the pool for the probation queue, in (0, 1)")
      ->capture_default_str();
  cmd->add_option("--ghost", args->ghost_factor,
                  "s3fifo/tiered/interval: ghost length (x pool size, 0..64)")
      ->capture_default_str();
  cmd->add_flag(
      "--sequential", args->sequential,
      "One request at a time (match, compute the rest, release) instead of timed arrivals");
  cmd->add_option("--rate", args->rate, "Timed mode: decode tokens per second per request")
      ->capture_default_str();
  cmd->add_option("--max-batch", args->max_batch, "Timed mode: concurrent requests")
      ->capture_default_str();
  cmd->add_flag(
      "--reuse-hints", args->reuse_hints,
      "Release each request with a reuse hint from its output length, as an engine "
      "could (likely if output_length < --short-output, else unlikely); tiered acts on it");
  cmd->add_option("--short-output", args->short_output,
                  "--reuse-hints: outputs shorter than this many tokens mean likely reuse")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print a JSON object");
  cmd->callback([args] { run_replay(*args); });
}

}  // namespace kvcache::tools
