// tools/demo.cpp — `kvcache demo`: the engine under three cache configurations.
//
// Runs one workload (default: 64 chat requests sharing a 512-token system
// prompt, long-tailed prompt/output lengths, Poisson arrivals; or a Mooncake
// trace) through the small Llama-style engine with continuous-batching
// slots, a paged cache, and a paged cache with prefix caching — all under the
// SAME KV memory budget — and prints one comparison table (or JSON).
// With --host-capacity and/or --disk-dir a fourth configuration adds storage
// tiers below the same device pool (paged + prefix + tiers), with per-tier
// hits, pages loaded and the time spent waiting on loads.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "kvcache/engine/model.h"
#include "kvcache/engine/serve.h"
#include "kvcache/engine/units.h"
#include "kvcache/engine/workload.h"
#include "kvcache/error.h"
#include "kvcache/manager.h"
#include "presets.h"
#include "progress.h"
#include "table.h"

namespace kvcache::tools {
namespace {

using engine::ServeMode;
using engine::ServeReport;

// Tokens the default KV budget holds (32 MiB of the small model's f32 KV).
constexpr std::uint64_t kDefaultBudgetTokens = 8192;

struct DemoOptions {
  std::string preset = "small";
  std::string memory;  // empty: room for kDefaultBudgetTokens tokens
  std::uint32_t page_size = 16;
  std::uint32_t requests = 64;
  std::uint32_t system_prompt = 512;
  double rate = 32.0;
  std::uint32_t max_seq_len = 2048;
  std::uint32_t token_budget = 256;
  std::uint64_t seed = 1;
  std::uint32_t samples = 1;
  std::string trace;
  double trace_scale = 1.0 / 16;
  bool json = false;
  std::string host_capacity;  // tiers: host tier bytes (empty: none)
  std::string disk_dir;       // tiers: disk tier directory (empty: none)
  std::string disk_capacity = "unlimited";
  std::vector<std::string> configs;  // empty: every configuration
};

// --configs names -> modes; empty: the three, and tiers when a tier is set.
std::vector<ServeMode> demo_modes(const DemoOptions& o, bool tiers) {
  std::vector<ServeMode> modes;
  for (const std::string& c : o.configs) {
    if (c == "continuous")
      modes.push_back(ServeMode::continuous);
    else if (c == "paged")
      modes.push_back(ServeMode::paged);
    else if (c == "prefix")
      modes.push_back(ServeMode::paged_prefix);
    else if (c == "tiers")
      modes.push_back(ServeMode::paged_tiers);
    else
      throw InvalidArgument("--configs: '" + c + "' is not continuous, paged, prefix or tiers");
  }
  if (!tiers && std::find(modes.begin(), modes.end(), ServeMode::paged_tiers) != modes.end()) {
    throw InvalidArgument("--configs tiers needs --host-capacity or --disk-dir");
  }
  if (!o.configs.empty()) return modes;
  modes = {ServeMode::continuous, ServeMode::paged, ServeMode::paged_prefix};
  if (tiers) modes.push_back(ServeMode::paged_tiers);
  return modes;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string ms(double seconds) { return fixed(seconds * 1000.0, 1) + " ms"; }

double mean_load_ms(const TierFigures& t) {
  return t.pages_loaded ? double(t.load_nanoseconds) / double(t.pages_loaded) / 1e6 : 0.0;
}

nlohmann::json tiers_json(const ServeReport& r) {
  nlohmann::json tiers = nlohmann::json::array();
  for (const TierFigures& t : r.tiers) {
    tiers.push_back({{"name", t.name},
                     {"enabled", t.enabled},
                     {"lookups", t.lookups},
                     {"hits", t.hits},
                     {"pages_loaded", t.pages_loaded},
                     {"pages_onboarded", t.pages_onboarded},
                     {"bytes_loaded", t.bytes_loaded},
                     {"mean_load_ms", mean_load_ms(t)},
                     {"pages_offloaded", t.pages_offloaded},
                     {"offload_dropped", t.offload_dropped},
                     {"load_failures", t.load_failures},
                     {"pages_held", t.pages_held},
                     {"evictions", t.evictions}});
  }
  return {{"tiers", tiers},
          {"tier_matches", r.tier_matches},
          {"load_failed_tokens", r.load_failed_tokens},
          {"load_waits", r.load_waits},
          {"load_wait_s", r.load_wait_s},
          {"load_mean_s", r.load_mean_s}};
}

nlohmann::json to_json(const ServeReport& r) {
  nlohmann::json j;
  j["config"] = r.config;
  j["pending"] = r.pending;
  if (!r.note.empty()) j["note"] = r.note;
  j["requests"] = r.requests;
  j["samples"] = r.samples;
  j["prefill_tokens"] = r.prefill_tokens;
  j["prompt_tokens"] = r.prompt_tokens;
  j["requested_output_tokens"] = r.requested_output_tokens;
  j["blocks"] = r.blocks;
  j["page_size"] = r.page_size;
  j["kv_memory_bytes"] = r.memory_bytes;
  if (r.pending) return j;
  j["generated_tokens"] = r.generated_tokens;
  j["elapsed_s"] = r.elapsed_s;
  j["requests_per_s"] = r.requests_per_s;
  j["output_tokens_per_s"] = r.output_tokens_per_s;
  j["ttft_mean_s"] = r.ttft_mean_s;
  j["ttft_p50_s"] = r.ttft_p50_s;
  j["ttft_p99_s"] = r.ttft_p99_s;
  j["tpot_mean_s"] = r.tpot_mean_s;
  j["peak_concurrent_sequences"] = r.peak_running;
  j["kv_utilisation"] = r.kv_utilisation;
  j["prefix_hit_rate"] = r.prefix_hit_rate;
  j["preemptions"] = r.preemptions;
  j["steps"] = r.steps;
  j["model_s"] = r.model_s;
  j["sampling_s"] = r.sampling_s;
  j["scheduler_manager_overhead_s"] = r.overhead_s;
  j["active_sequences_left"] = r.active_sequences_left;
  j["blocks_not_free"] = r.blocks_not_free;
  if (!r.tiers.empty()) j.update(tiers_json(r));
  return j;
}

// Rows of the tiers' figures ("-" for a configuration without tiers).
template <typename Row>
void add_tier_rows(const std::vector<ServeReport>& reports, Row& row) {
  const ServeReport* tiered = nullptr;
  for (const auto& r : reports) {
    if (!r.tiers.empty()) tiered = &r;
  }
  if (tiered == nullptr) return;
  for (std::size_t i = 0; i < tiered->tiers.size(); ++i) {
    const std::string name = tiered->tiers[i].name;
    auto tier_cell = [i](const ServeReport& r, auto&& cell) -> std::string {
      return i < r.tiers.size() ? cell(r.tiers[i]) : "-";
    };
    row(name + " tier lookup hits / pages loaded", [&](const ServeReport& r) {
      return tier_cell(r, [](const TierFigures& t) {
        return with_commas(t.hits) + " / " + with_commas(t.pages_onboarded);
      });
    });
    row(name + " tier pages stored", [&](const ServeReport& r) {
      return tier_cell(r, [](const TierFigures& t) { return with_commas(t.pages_offloaded); });
    });
    row(name + " tier mean page load latency", [&](const ServeReport& r) {
      return tier_cell(r, [](const TierFigures& t) { return fixed(mean_load_ms(t), 3) + " ms"; });
    });
  }
  auto tiered_cell = [](const ServeReport& r, std::string cell) {
    return r.tiers.empty() ? std::string("-") : cell;
  };
  row("prefix matches that loaded",
      [&](const ServeReport& r) { return tiered_cell(r, std::to_string(r.tier_matches)); });
  row("mean load time (in TTFT)",
      [&](const ServeReport& r) { return tiered_cell(r, ms(r.load_mean_s)); });
  row("engine idle on loads", [&](const ServeReport& r) {
    return tiered_cell(r, ms(r.load_wait_s) + " (" + std::to_string(r.load_waits) + " waits)");
  });
}

void print_table(const std::vector<ServeReport>& reports, std::ostream& os) {
  std::vector<std::string> header = {"metric"};
  for (const auto& r : reports) header.push_back(r.config);
  Table t(header);
  auto row = [&](const std::string& name, auto&& cell) {
    std::vector<std::string> cells = {name};
    for (const auto& r : reports) cells.push_back(r.pending ? "pending" : cell(r));
    t.add_row(std::move(cells));
  };
  row("KV blocks", [](const ServeReport& r) {
    return std::to_string(r.blocks) + " x " + std::to_string(r.page_size) + " tok";
  });
  row("requests/s", [](const ServeReport& r) { return fixed(r.requests_per_s, 2); });
  row("output tokens/s", [](const ServeReport& r) { return fixed(r.output_tokens_per_s, 1); });
  row("TTFT p50", [](const ServeReport& r) { return ms(r.ttft_p50_s); });
  row("TTFT p99", [](const ServeReport& r) { return ms(r.ttft_p99_s); });
  row("TTFT mean", [](const ServeReport& r) { return ms(r.ttft_mean_s); });
  row("time per output token", [](const ServeReport& r) { return ms(r.tpot_mean_s); });
  row("peak concurrent seqs", [](const ServeReport& r) { return std::to_string(r.peak_running); });
  row("KV memory utilisation",
      [](const ServeReport& r) { return fixed(100.0 * r.kv_utilisation, 1) + " %"; });
  row("prefix hit rate",
      [](const ServeReport& r) { return fixed(100.0 * r.prefix_hit_rate, 1) + " %"; });
  row("prompt tokens computed", [](const ServeReport& r) { return with_commas(r.prefill_tokens); });
  row("preemptions", [](const ServeReport& r) { return std::to_string(r.preemptions); });
  add_tier_rows(reports, row);
  row("wall time", [](const ServeReport& r) { return fixed(r.elapsed_s, 1) + " s"; });
  t.print(os);
  for (const auto& r : reports) {
    if (!r.note.empty()) os << "  note: " << r.note << '\n';
  }
  os << "  KV memory utilisation = tokens stored / tokens the claimed slots or pages can hold\n"
        "  (mean over steps). Time per output token = mean over requests of decode time / "
        "(outputs - 1).\n";
}

std::vector<engine::WorkloadRequest> make_workload(const DemoOptions& o,
                                                   const engine::ModelConfig& model,
                                                   std::ostream* narrate) {
  if (!o.trace.empty()) {
    engine::TraceOptions t;
    t.scale = o.trace_scale;
    t.max_requests = o.requests;
    t.max_total_tokens = o.max_seq_len;
    t.vocab_size = model.vocab_size;
    auto w = engine::load_mooncake_trace(o.trace, t);
    if (narrate)
      *narrate << "Workload: " << w.size() << " requests from " << o.trace << " (lengths x "
               << o.trace_scale << ")\n";
    return w;
  }
  engine::ChatWorkloadOptions c;
  c.requests = o.requests;
  c.system_prompt_tokens = o.system_prompt;
  c.rate = o.rate;
  c.vocab_size = model.vocab_size;
  c.seed = o.seed;
  c.user_max = std::min<std::uint32_t>(512, o.max_seq_len / 4);
  c.output_max = std::min<std::uint32_t>(256, o.max_seq_len / 4);
  auto w = engine::chat_workload(c);
  if (narrate) {
    *narrate << "Workload: " << w.size() << " chat requests sharing a " << o.system_prompt
             << "-token system prompt, log-normal user/output lengths, Poisson arrivals at "
             << o.rate << "/s\n";
  }
  return w;
}

// --host-capacity, --disk-dir, --disk-capacity; the model id ties a disk
// directory's pages to these weights (preset and seed).
engine::ServeTiers demo_tiers(const DemoOptions& o, const engine::ModelConfig& config) {
  engine::ServeTiers t;
  if (!o.host_capacity.empty()) {
    t.host_bytes = engine::parse_byte_size(o.host_capacity);
    if (t.host_bytes == 0) throw InvalidArgument("--host-capacity 0 holds no page");
  }
  t.disk_dir = o.disk_dir;
  if (o.disk_capacity != "unlimited") t.disk_bytes = engine::parse_byte_size(o.disk_capacity);
  t.model_id = config.name + "@seed" + std::to_string(o.seed);
  return t;
}

// --memory, or room for kDefaultBudgetTokens tokens of this model's KV.
std::uint64_t memory_budget(const DemoOptions& o, const engine::ModelConfig& config) {
  if (!o.memory.empty()) return engine::parse_byte_size(o.memory);
  return kDefaultBudgetTokens *
         config.cache_params(CacheStrategy::paged, o.page_size).bytes_per_token();
}

void run_demo(const DemoOptions& o) {
  const ModelPreset& preset = find_preset(o.preset);
  const engine::ModelConfig config = engine_model_config(preset);
  const engine::Model model = engine::Model::from_seed(config, o.seed);
  const engine::ServeTiers tiers = demo_tiers(o, config);
  const std::vector<ServeMode> modes = demo_modes(o, tiers.any());
  std::ostream* narrate = o.json ? nullptr : &std::cout;
  const auto workload = make_workload(o, config, narrate);
  engine::ServeOptions so;
  so.memory_bytes = memory_budget(o, config);
  so.page_size = o.page_size;
  so.max_seq_len = o.max_seq_len;
  so.max_num_tokens = o.token_budget;
  so.samples = o.samples;
  so.tiers = tiers;
  if (narrate) {
    *narrate << "Model: '" << config.name << "' Llama-style, " << config.num_layers
             << " layers, hidden " << config.hidden_size << ", " << config.n_q_heads << "/"
             << config.n_kv_heads << " q/kv heads, head dim " << config.head_dim << ", "
             << with_commas(config.num_parameters()) << " parameters (seeded weights)\n";
    if (!preset.engine_model) *narrate << "  (" << stand_in_note(preset) << ")\n";
    *narrate << "KV budget: " << format_bytes(so.memory_bytes) << " for every configuration; "
             << "max_seq_len " << o.max_seq_len << ", page size " << o.page_size
             << ", step token budget " << o.token_budget;
    if (o.samples > 1) {
      *narrate << ", " << o.samples
               << " samples per request (paged: the prompt forked; slots: computed per sample)";
    }
    *narrate << "\n";
    if (so.tiers.any()) {
      *narrate << "Tiers below the same device pool:";
      if (so.tiers.host_bytes) *narrate << " host " << format_bytes(so.tiers.host_bytes);
      if (!so.tiers.disk_dir.empty()) {
        *narrate << " disk " << so.tiers.disk_dir << " ("
                 << (o.disk_capacity == "unlimited" ? std::string("unlimited")
                                                    : format_bytes(so.tiers.disk_bytes))
                 << ")";
      }
      *narrate << '\n';
    }
    *narrate << '\n';
  }
  std::vector<ServeReport> reports;
  for (ServeMode mode : modes) {
    Progress progress{std::string(engine::serve_mode_name(mode)), Progress::terminal()};
    so.mode = mode;
    so.progress = [&](std::size_t d, std::size_t t) { progress(d, t); };
    reports.push_back(engine::serve(model, workload, so));
  }
  if (o.json) {
    nlohmann::json j;
    j["model"] = {{"preset", config.name},
                  {"layers", config.num_layers},
                  {"hidden", config.hidden_size},
                  {"q_heads", config.n_q_heads},
                  {"kv_heads", config.n_kv_heads},
                  {"head_dim", config.head_dim},
                  {"stand_in", !preset.engine_model},
                  {"parameters", config.num_parameters()}};
    j["memory_budget_bytes"] = so.memory_bytes;
    j["page_size"] = o.page_size;
    j["max_seq_len"] = o.max_seq_len;
    j["configurations"] = nlohmann::json::array();
    for (const auto& r : reports) j["configurations"].push_back(to_json(r));
    std::cout << j.dump(2) << '\n';
    return;
  }
  print_table(reports, std::cout);
}

}  // namespace

void add_demo_command(CLI::App& app) {
  static DemoOptions o;
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "Serve a workload with the built-in engine: continuous slots vs paged vs paged + prefix "
      "caching under one KV memory budget");
  cmd->add_option("--preset", o.preset,
                  "model preset: " + preset_names() +
                      " (a published model runs as a stand-in: its attention geometry in " +
                      std::to_string(kStandInLayers) + " layers, see README)")
      ->capture_default_str();
  cmd->add_option("--memory", o.memory,
                  "KV memory budget in bytes, e.g. 32MiB, 64MB (" +
                      std::string(engine::kSizeSuffixHelp) + "); default: room for " +
                      std::to_string(kDefaultBudgetTokens) + " tokens of the model's KV");
  cmd->add_option("--page-size", o.page_size, "tokens per page")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--requests", o.requests, "number of requests")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--system-prompt", o.system_prompt, "shared system prompt tokens")
      ->capture_default_str();
  cmd->add_option("--rate", o.rate, "Poisson arrival rate, requests/s")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-seq-len", o.max_seq_len, "longest sequence (continuous slot size)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--token-budget", o.token_budget, "tokens per engine step (chunked prefill)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o.seed, "seed of weights and workload")->capture_default_str();
  cmd->add_option("--samples", o.samples,
                  "independent samples per request (parallel sampling; paged configurations "
                  "fork the prompt)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  cmd->add_option("--trace", o.trace, "Mooncake-format JSONL trace instead of the chat workload");
  cmd->add_option("--trace-scale", o.trace_scale, "multiply trace lengths by this")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--host-capacity", o.host_capacity,
                  "add a configuration with tiers: a host-memory tier of this many bytes below "
                  "the same device pool, e.g. 1GiB");
  cmd->add_option("--disk-dir", o.disk_dir,
                  "add a configuration with tiers: a disk tier in this directory (behind the "
                  "host tier when both are given; it keeps its pages across runs)");
  cmd->add_option("--disk-capacity", o.disk_capacity, "disk tier bytes, e.g. 4GiB, or unlimited")
      ->capture_default_str();
  cmd->add_option("--configs", o.configs,
                  "configurations to run, comma-separated: continuous, paged, prefix, tiers "
                  "(default: the first three, and tiers when a tier is given)")
      ->delimiter(',');
  cmd->add_flag("--json", o.json, "print JSON instead of the table");
  cmd->callback([] { run_demo(o); });
}

}  // namespace kvcache::tools
