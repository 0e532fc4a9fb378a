// tools/plan.cpp — `kvcache plan`: slots, pages and concurrency for a budget.

#include "plan.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>

#include "commands.h"
#include "kvcache/continuous_manager.h"
#include "kvcache/engine/units.h"
#include "kvcache/error.h"
#include "kvcache/paged_manager.h"
#include "table.h"

namespace kvcache::tools {

namespace {

constexpr std::uint64_t kU32Max = std::numeric_limits<std::uint32_t>::max();

StrategyPlan plan_continuous(const KVCacheParams& base, const PlanInput& in, std::uint64_t total) {
  KVCacheParams p = base;
  p.cache_strategy = CacheStrategy::continuous;
  p.page_size = 0;
  p.validate();
  StrategyPlan s;
  s.strategy = "continuous";
  s.page_size = in.max_seq_len;
  s.block_bytes = ContinuousBatchingKVCacheManager::estimated_memory_size(p, 1, in.max_seq_len);
  s.blocks = std::min(total / s.block_bytes, kU32Max);
  s.tokens = s.blocks * s.page_size;
  if (s.blocks > 0) {
    s.used_bytes = ContinuousBatchingKVCacheManager::estimated_memory_size(
        p, static_cast<std::uint32_t>(s.blocks), in.max_seq_len);
  }
  return s;
}

StrategyPlan plan_paged(const KVCacheParams& base, const PlanInput& in, std::uint64_t total) {
  KVCacheParams p = base;
  p.cache_strategy = CacheStrategy::paged;
  p.page_size = in.page_size;
  p.validate();
  StrategyPlan s;
  s.strategy = "paged";
  s.page_size = in.page_size;
  s.block_bytes = PagedKVCacheManager::estimated_memory_size(p, 1);
  s.blocks = PagedKVCacheManager::pages_for_memory(p, total);
  s.tokens = s.blocks * s.page_size;
  if (s.blocks > 0) {
    s.used_bytes =
        PagedKVCacheManager::estimated_memory_size(p, static_cast<std::uint32_t>(s.blocks));
  }
  return s;
}

std::vector<std::uint32_t> typical_lengths(std::uint32_t max_seq_len) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t len : {512u, 2048u, max_seq_len})
    if (len <= max_seq_len && std::find(out.begin(), out.end(), len) == out.end())
      out.push_back(len);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Plan compute_plan(const PlanInput& in) {
  if (in.max_seq_len == 0) throw InvalidArgument("max_seq_len 0 must be at least 1");
  if (in.memory_per_device == 0) throw InvalidArgument("memory budget 0 must be at least 1 byte");
  in.params.validate();
  Plan plan;
  plan.input = in;
  plan.bytes_per_token = in.params.bytes_per_token();
  const std::uint64_t devices = in.params.n_devices;
  if (in.memory_per_device > std::numeric_limits<std::uint64_t>::max() / devices)
    throw InvalidArgument("memory budget times " + std::to_string(devices) + " devices overflows");
  plan.memory_total = in.memory_per_device * devices;
  plan.continuous = plan_continuous(in.params, in, plan.memory_total);
  plan.paged = plan_paged(in.params, in, plan.memory_total);
  for (std::uint32_t len : typical_lengths(in.max_seq_len)) {
    const std::uint64_t pages_each = (len + std::uint64_t{in.page_size} - 1) / in.page_size;
    plan.concurrency.push_back({len, plan.continuous.blocks, plan.paged.blocks / pages_each});
  }
  return plan;
}

void print_plan(const Plan& plan, std::ostream& os) {
  const PlanInput& in = plan.input;
  os << "kvcache plan: " << in.model << "  (" << dtype_name(in.params.dtype) << ", "
     << in.params.num_layers << " layers, " << in.params.n_kv_heads << " KV heads, head dim "
     << in.params.head_dim << ", " << in.params.n_devices << " device"
     << (in.params.n_devices == 1 ? "" : "s") << ")\n";
  os << "  bytes per token   " << with_commas(plan.bytes_per_token) << " B ("
     << format_bytes(plan.bytes_per_token) << ", K and V, all layers)\n";
  os << "  memory budget     " << format_bytes(in.memory_per_device) << " per device, "
     << format_bytes(plan.memory_total) << " total\n";
  os << "  max_seq_len " << in.max_seq_len << ", page_size " << in.page_size << "\n\n";
  Table blocks({"strategy", "blocks that fit", "block size", "tokens that fit", "memory used"});
  for (const StrategyPlan* s : {&plan.continuous, &plan.paged}) {
    const char* unit = s == &plan.continuous ? " slots" : " pages";
    blocks.add_row({s->strategy, with_commas(s->blocks) + unit, format_bytes(s->block_bytes),
                    with_commas(s->tokens), format_bytes(s->used_bytes)});
  }
  blocks.print(os);
  os << "\n  concurrent sequences (continuous reserves max_seq_len each; paged admits by length)\n";
  Table conc({"tokens/seq", "continuous", "paged", "paged gain"});
  for (const ConcurrencyRow& r : plan.concurrency) {
    char gain[32] = "-";
    if (r.continuous != 0)
      std::snprintf(gain, sizeof(gain), "%.1fx", double(r.paged) / double(r.continuous));
    conc.add_row({with_commas(r.length), with_commas(r.continuous), with_commas(r.paged), gain});
  }
  conc.print(os);
  if (plan.continuous.blocks == 0)
    os << "\n  note: one max_seq_len slot (" << format_bytes(plan.continuous.block_bytes)
       << ") does not fit in the budget\n";
}

nlohmann::json plan_to_json(const Plan& plan) {
  const PlanInput& in = plan.input;
  auto strategy = [](const StrategyPlan& s) {
    return nlohmann::json{{"blocks", s.blocks},
                          {"block_bytes", s.block_bytes},
                          {"page_size", s.page_size},
                          {"tokens", s.tokens},
                          {"memory_used_bytes", s.used_bytes}};
  };
  nlohmann::json conc = nlohmann::json::array();
  for (const ConcurrencyRow& r : plan.concurrency)
    conc.push_back({{"length", r.length}, {"continuous", r.continuous}, {"paged", r.paged}});
  return {{"model", in.model},
          {"dtype", std::string(dtype_name(in.params.dtype))},
          {"num_layers", in.params.num_layers},
          {"n_kv_heads", in.params.n_kv_heads},
          {"head_dim", in.params.head_dim},
          {"n_devices", in.params.n_devices},
          {"page_size", in.page_size},
          {"max_seq_len", in.max_seq_len},
          {"bytes_per_token", plan.bytes_per_token},
          {"memory_per_device_bytes", in.memory_per_device},
          {"memory_total_bytes", plan.memory_total},
          {"continuous", strategy(plan.continuous)},
          {"paged", strategy(plan.paged)},
          {"concurrency", conc}};
}

namespace {

// Raw command-line values; resolved into a PlanInput by `resolve`.
struct PlanArgs {
  std::string preset;
  std::uint32_t layers = 0, kv_heads = 0, head_dim = 0;
  CLI::Option* layers_opt = nullptr;  // to tell "not given" from an explicit value
  CLI::Option* kv_heads_opt = nullptr;
  CLI::Option* head_dim_opt = nullptr;
  std::string dtype = "bf16";
  std::string memory = "16GiB";
  std::uint32_t page_size = 16;
  std::uint32_t max_seq_len = 8192;
  std::uint32_t devices = 1;
  bool json = false;
};

std::uint32_t shape_field(std::uint32_t value, const CLI::Option* opt, const ModelPreset* preset,
                          std::uint32_t ModelPreset::*field, const char* name) {
  if (opt != nullptr && opt->count() > 0) return value;
  if (preset) return preset->*field;
  throw InvalidArgument(std::string("--") + name + " is required without --preset");
}

PlanInput resolve(const PlanArgs& a) {
  const ModelPreset* preset = a.preset.empty() ? nullptr : &find_preset(a.preset);
  PlanInput in;
  in.model = preset ? std::string(preset->name) : "custom";
  in.params.dtype = parse_dtype(a.dtype);
  in.params.num_layers =
      shape_field(a.layers, a.layers_opt, preset, &ModelPreset::num_layers, "layers");
  in.params.n_kv_heads =
      shape_field(a.kv_heads, a.kv_heads_opt, preset, &ModelPreset::n_kv_heads, "kv-heads");
  in.params.head_dim =
      shape_field(a.head_dim, a.head_dim_opt, preset, &ModelPreset::head_dim, "head-dim");
  in.params.n_devices = a.devices;
  in.memory_per_device = engine::parse_byte_size(a.memory);
  in.page_size = a.page_size;
  in.max_seq_len = a.max_seq_len;
  if (in.page_size == 0) throw InvalidArgument("page-size 0 must be at least 1");
  return in;
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "How many sequences and tokens fit in a memory budget, per cache strategy");
  cmd->add_option("--preset", args->preset, "Model preset: " + preset_names());
  args->layers_opt =
      cmd->add_option("--layers", args->layers, "Transformer layers (overrides the preset)");
  args->kv_heads_opt =
      cmd->add_option("--kv-heads", args->kv_heads, "KV heads, all devices (overrides the preset)");
  args->head_dim_opt =
      cmd->add_option("--head-dim", args->head_dim, "Head dimension (overrides the preset)");
  cmd->add_option("--dtype", args->dtype, "Cache element type: " + std::string(kDTypeNames))
      ->capture_default_str();
  cmd->add_option("--memory", args->memory,
                  "KV budget per device in bytes: 16GiB, 512MiB, 24GB (" +
                      std::string(engine::kSizeSuffixHelp) + ")")
      ->capture_default_str();
  cmd->add_option("--page-size", args->page_size, "Tokens per page (paged)")->capture_default_str();
  cmd->add_option("--max-seq-len", args->max_seq_len, "Longest sequence")->capture_default_str();
  cmd->add_option("--devices", args->devices, "Devices the KV heads are split across")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print a JSON object instead of tables");
  cmd->callback([args] {
    const Plan plan = compute_plan(resolve(*args));
    if (args->json) {
      std::cout << plan_to_json(plan).dump(2) << '\n';
    } else {
      print_plan(plan, std::cout);
    }
  });
}

}  // namespace kvcache::tools
